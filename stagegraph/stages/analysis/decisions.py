"""Decisions that rewrites before the analysis stamped on ops, as facts for cost models.

A rewrite that chooses between ways to run an op (``x86.normalize``'s direct or GEMM
convolution) records its choice on the op it leaves as a dictionary attribute named
``stagegraph.<something>`` holding a ``key`` (the choice's name) and string or integer
fields. The analysis passes them on unread: a params model that makes the choice tunable
(its default, the rewrite's own decision) finds them here by attribute name, and the
generic layers stay ignorant of which target stamped what.
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.ports import Facts

#: Prefix of the attributes read as decisions.
DECISION_PREFIX = "stagegraph."


class Decision(Facts):
    """One stamped decision: the attribute's name, its ``key`` and its other fields."""

    attribute: str
    key: str
    fields: dict[str, str | int]


def stamped_decisions(fn: Any) -> tuple[Decision, ...]:
    """The decisions stamped on ops anywhere in ``fn`` (nested loops too), in walk order."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    found = []
    for op in collect(fn):
        for name in list(op.attributes):
            attr = op.attributes[name]
            if not name.startswith(DECISION_PREFIX) or not isinstance(attr, ir.DictAttr):
                continue
            entries: dict[str, str | int] = {}
            for i in range(len(attr)):
                entry = attr[i]
                if isinstance(entry.attr, ir.StringAttr):
                    entries[entry.name] = ir.StringAttr(entry.attr).value
                elif isinstance(entry.attr, ir.IntegerAttr):
                    entries[entry.name] = ir.IntegerAttr(entry.attr).value
            key = entries.pop("key", None)
            if isinstance(key, str):
                found.append(Decision(attribute=name, key=key, fields=entries))
    return tuple(found)
