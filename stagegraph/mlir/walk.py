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
    return children(fn)


def children(root: Any) -> list[Any]:
    """The ops directly in ``root``'s regions (not nested deeper), in order.

    A walk hands out plain ``ir.Operation`` objects, where iterating a block builds each op's
    Python class and so imports its dialect's module (for ``linalg``, over a tenth of a
    second of OpDSL definitions): analysing a payload should not pay for that."""
    from stagegraph.mlir.bindings import ir

    top = getattr(root, "operation", root)
    found: list[Any] = []

    def visit(op: Any) -> Any:
        if op == top:
            return ir.WalkResult.ADVANCE
        found.append(op)
        return ir.WalkResult.SKIP

    top.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


class DefUse:
    """Which op defines each value and which ops use it, inside ``root``, from one walk.

    ``value.owner`` and ``use.owner`` build the op's Python class, which imports its
    dialect's module (``linalg``'s costs over a tenth of a second); a walk hands out plain
    ``ir.Operation`` objects, so an analysis that asks these questions here pays nothing of
    the kind. Values outside ``root`` (its arguments, say) have no owner here."""

    def __init__(self, root: Any) -> None:
        from stagegraph.mlir.bindings import ir

        self._owner: dict[Any, Any] = {}
        self._users: dict[Any, list[Any]] = {}
        top = getattr(root, "operation", root)

        def visit(op: Any) -> Any:
            for result in op.results:
                self._owner[result] = op
            for operand in op.operands:
                self._users.setdefault(operand, []).append(op)
            return ir.WalkResult.ADVANCE

        top.walk(visit, ir.WalkOrder.PRE_ORDER)

    def owner(self, value: Any) -> Any | None:
        """The op in ``root`` that defines ``value``, else ``None``."""
        return self._owner.get(value)

    def users(self, value: Any) -> list[Any]:
        """The ops in ``root`` that read ``value`` (once per operand), in walk order."""
        return self._users.get(value, [])


class LiveDefUse:
    """:class:`DefUse`'s two questions answered from the IR's own use lists, at the time
    they are asked.

    For a rewrite that changes the IR between questions: a :class:`DefUse` is a snapshot,
    and rebuilding one after every change walks the whole function each time (an unrolled
    recurrent payload of 20 000 ops, rewritten at each of its 400 matmuls, spent a minute
    in such walks). Asking the use lists costs each owner's dialect module import once."""

    def owner(self, value: Any) -> Any | None:
        """The op that defines ``value``, else ``None`` (a block argument)."""
        from stagegraph.mlir.bindings import ir

        if isinstance(value, ir.BlockArgument):
            return None
        return value.owner.operation

    def users(self, value: Any) -> list[Any]:
        """The ops that read ``value`` (once per operand)."""
        return [use.owner.operation for use in value.uses]


def defining_op(value: Any) -> Any:
    """The op that defines ``value``: its owner, or the op owning its block (a block
    argument's region op)."""
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if isinstance(owner, ir.Block):
        owner = owner.owner
    return owner.operation


def nested_in(op: Any, group: set[Any]) -> bool:
    """Whether ``op`` is one of ``group`` or nested (at any depth) in one of them."""
    while op is not None:
        if op in group:
            return True
        parent = op.parent
        op = parent.operation if parent is not None else None
    return False
