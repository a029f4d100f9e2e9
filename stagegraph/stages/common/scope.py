"""Transform a few ops of a large function at a cost proportional to those ops.

Several upstream transform ops cost time proportional to the whole payload on every call:
``transform.structured.fuse_into_containing_op`` builds a remark that prints the producer,
which numbers every value of the payload module; ``transform.apply_patterns`` on a function
walks all of it. A schedule that makes such calls per matmul of a model with hundreds of
matmuls (an unrolled recurrent network) is then quadratic in the model's size.

:func:`outline` moves a group of ops (say a matmul, its fill and its elementwise epilogue)
into a function of a scratch module, so that a schedule applied there sees only them;
:meth:`Outlined.inline` moves the result back where the ops were. Values the ops read from
outside become arguments of the scratch function, except ops that are free to recompute and
that a schedule may want to rewrite along with them (``tensor.empty``, constants, fills):
those are cloned in (the duplicates are merged again by CSE afterwards). Results used
outside are returned; until :meth:`Outlined.inline`, their outside users read a
placeholder (an operand-less ``builtin.unrealized_conversion_cast``), so no use crosses
modules while the schedule runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.bindings import func, ir
from stagegraph.mlir.walk import defining_op, nested_in

# Ops without side effects that are cheap to recompute: cloned into the scratch function
# (with their operands, recursively) rather than passed in.
CLONABLE = frozenset({"tensor.empty", "arith.constant", "linalg.fill"})


def _nested(op: Any) -> list[Any]:
    found: list[Any] = []

    def visit(inner: Any) -> Any:
        found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


@dataclass
class Outlined:
    """Ops moved into ``module`` (a scratch module holding one function) by :func:`outline`."""

    module: Any
    function: Any
    arguments: list[Any]  # the outside value each function argument stands for
    placeholders: list[Any]  # one per returned value, where the outside users read it

    def inline(self) -> None:
        """Move the function's ops back before the placeholders and rewire the uses."""
        block = self.function.regions[0].blocks[0]
        for arg, value in zip(block.arguments, self.arguments, strict=True):
            arg.replace_all_uses_with(value)
        ops = [op.operation for op in block.operations]
        ret, body = ops[-1], ops[:-1]
        anchor = self.placeholders[0]
        for op in body:
            op.move_before(anchor)
        for placeholder, value in zip(self.placeholders, ret.operands, strict=True):
            placeholder.results[0].replace_all_uses_with(value)
            placeholder.erase()
        ret.erase()


def clonable_op(op: Any) -> bool:
    """The default of :func:`outline`'s ``clonable``: an op named in :data:`CLONABLE`."""
    return op.name in CLONABLE


def outline(ops: Sequence[Any], clonable: Callable[[Any], bool] = clonable_op) -> Outlined | None:
    """Move ``ops`` (in program order, all in one block) into a scratch module's function.

    Values read from outside that ``clonable`` accepts the defining op of are cloned in
    (with their operands, recursively); the others become arguments.

    Returns None, changing nothing, when the group cannot be moved out and back intact:
    ops in different blocks, or a result used outside the group before its last op (the
    results come back at the last op's position).
    """
    ops = [op.operation for op in ops]
    if not ops:
        return None
    block = ops[0].block
    if any(op.block != block for op in ops):
        return None
    group = set(ops)
    last = ops[-1]
    escaping = _escaping(ops, group, block, last)
    if not escaping:
        return None  # nothing to put the ops back in front of (and nothing reads them)
    # Operands read from outside the group, by every op nested in it.
    reads: list[tuple[Any, int, Any]] = []
    for op in ops:
        for inner in _nested(op):
            for k, value in enumerate(inner.operands):
                if not nested_in(defining_op(value), group):
                    reads.append((inner, k, value))
    with last.context, last.location:
        placeholders = _placeholders(last, escaping)
        module = ir.Module.create()
        arguments, cloned = _scratch_inputs([value for _, _, value in reads], clonable)
        function, entry, mapping = _scratch_function(module, arguments, cloned, escaping)
        for inner, k, value in reads:
            inner.operands[k] = mapping[value]
        for op in ops:
            op.detach_from_parent()
            ir.InsertionPoint(entry).insert(op)
        with ir.InsertionPoint(entry):
            func.ReturnOp([result for result, _ in escaping])
    return Outlined(module, function, arguments, placeholders)


def _escaping(
    ops: list[Any], group: set[Any], block: Any, last: Any
) -> list[tuple[Any, list[tuple[Any, int]]]] | None:
    """The results read outside the group, each with its outside uses (user, operand
    number); None when one is read before the group's last op."""
    escaping: list[tuple[Any, list[tuple[Any, int]]]] = []
    for op in ops:
        for result in op.results:
            outside = [
                (use.owner.operation, use.operand_number)
                for use in result.uses
                if not nested_in(use.owner.operation, group)
            ]
            if not outside:
                continue
            for user, _ in outside:
                top = user
                while top is not None and top.block != block:
                    top = top.parent.operation if top.parent is not None else None
                if top is None or top.is_before_in_block(last):
                    return None
            escaping.append((result, outside))
    return escaping


def _placeholders(last: Any, escaping: list[tuple[Any, list[tuple[Any, int]]]]) -> list[Any]:
    """One operand-less cast per escaping result, before ``last``, its outside users
    rewired to read it while the ops are away."""
    placeholders = []
    with ir.InsertionPoint(last):
        for result, _ in escaping:
            placeholders.append(
                ir.Operation.create(
                    "builtin.unrealized_conversion_cast", results=[result.type], operands=[]
                )
            )
    for (_, outside), placeholder in zip(escaping, placeholders, strict=True):
        for user, number in outside:
            user.operands[number] = placeholder.results[0]
    return placeholders


def _scratch_inputs(
    values: list[Any], clonable: Callable[[Any], bool]
) -> tuple[list[Any], list[Any]]:
    """The outside values that become the scratch function's arguments, and the outside
    ops cloned into it instead (operands first)."""
    arguments: list[Any] = []
    cloned: list[Any] = []
    seen: set[Any] = set()

    def plan(value: Any) -> None:
        if value in seen:
            return
        owner = value.owner
        if not isinstance(owner, ir.Block) and clonable(owner.operation):
            for operand in owner.operation.operands:
                plan(operand)
            seen.add(value)
            if owner.operation not in cloned:
                cloned.append(owner.operation)
        else:
            seen.add(value)
            arguments.append(value)

    for value in values:
        plan(value)
    return arguments, cloned


def _scratch_function(
    module: Any,
    arguments: list[Any],
    cloned: list[Any],
    escaping: list[tuple[Any, list[tuple[Any, int]]]],
) -> tuple[Any, Any, dict[Any, Any]]:
    """The scratch function in ``module`` (arguments in, escaping results out) with the
    clonable ops cloned into its entry block; returns it, the block and the mapping of
    outside values to their values inside."""
    types = [value.type for value in arguments]
    results = [result.type for result, _ in escaping]
    with ir.InsertionPoint(module.body):
        function = func.FuncOp("scope", (types, results))
    entry = function.add_entry_block()
    mapping: dict[Any, Any] = {}
    for value, arg in zip(arguments, entry.arguments, strict=True):
        mapping[value] = arg
    with ir.InsertionPoint(entry):
        for original in cloned:
            copy = original.clone()
            for k, operand in enumerate(original.operands):
                copy.operands[k] = mapping[operand]
            for old, new in zip(original.results, copy.results, strict=True):
                mapping[old] = new
    return function, entry, mapping
