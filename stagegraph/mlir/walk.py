"""Walking IR: the one helper every pass-like rewrite and analysis uses to find ops.

Collecting first and rewriting afterwards is the safe order: an op erased or replaced while
the walk is under way invalidates the walk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Match = str | Iterable[str] | Callable[[Any], bool] | None


def _predicate(match: Match) -> Callable[[Any], bool]:
    if match is None:
        return lambda _op: True
    if isinstance(match, str):
        return lambda op: op.name == match
    if callable(match):
        return match
    names = frozenset(match)
    return lambda op: op.name in names


def collect(root: Any, match: Match = None) -> list[Any]:
    """The ops nested in ``root`` (a module, an ``ir.Module`` or an op; the root itself
    excluded) that ``match`` accepts: an op name, a set of names or a predicate, in
    pre-order (program order)."""
    from stagegraph.mlir.bindings import ir

    accept = _predicate(match)
    top = getattr(root, "operation", root)
    found: list[Any] = []

    def visit(op: Any) -> Any:
        if op is not top and op != top and accept(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    top.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def contains(root: Any, match: Match) -> bool:
    """Whether any op nested in ``root`` is accepted by ``match`` (stops at the first)."""
    from stagegraph.mlir.bindings import ir

    accept = _predicate(match)
    top = getattr(root, "operation", root)
    found = False

    def visit(op: Any) -> Any:
        nonlocal found
        if op != top and accept(op):
            found = True
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    top.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def strip_attributes(root: Any, *names: str) -> int:
    """Remove the discardable attributes ``names`` from every op nested in ``root`` (the
    labels a schedule put on payload ops to address them); returns how many were removed."""
    removed = 0
    for op in collect(root, lambda op: any(name in op.attributes for name in names)):
        for name in names:
            if name in op.attributes:
                del op.attributes[name]
                removed += 1
    return removed


def top_level_ops(fn: Any) -> list[Any]:
    """The ops directly in a function's body (its entry block), in order: what a payload
    rewrite that works op by op, not nested, visits."""
    return [op.operation for op in fn.regions[0].blocks[0].operations]
