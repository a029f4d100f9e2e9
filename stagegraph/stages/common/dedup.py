"""Schedule and compile each distinct group of ops once, however often it repeats.

An unrolled recurrent network repeats the same few layers (a matmul with its fill and
epilogue, the same elementwise gates) hundreds of times. Scheduling every copy and handing
every copy to LLVM makes compile time proportional to the op count with a large constant.
Here the groups a schedule would handle together are found by use-def structure
(:func:`groups`), each moved into a scratch function (:func:`stagegraph.stages.common.scope.
outline`) and keyed by its structure (:func:`structure_key`: op names, operand wiring, types
and attributes, compared as ``ir.Type``/``ir.Attribute`` objects, never as printed text).
Groups whose key occurs more than once become one private ``func.func`` per key and a
``func.call`` at every site (:func:`outline_repeated`); groups that occur once are put back
as they were, so a model without repetition compiles exactly as before.

Large constants (weights) are passed as arguments rather than cloned in, or every time step
of a layer with its own weights would get its own function; scalars, splats, empties and
fills are cloned in (a schedule rewrites them with their users).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stagegraph.mlir.bindings import func, ir
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.common.scope import CLONABLE, Outlined, outline

#: Marks the shared functions (kept through the lowering to ``llvm.func``).
OUTLINED_ATTR = "stagegraph.outlined"

#: Discardable attributes with this prefix are stagegraph's labels, not part of an op.
LABEL_PREFIX = "stagegraph."


def clone_into_group(op: Any) -> bool:
    """Whether an op read by a group is cloned into its function rather than passed in:
    empties, fills and constants that are scalars or splats (never a dense weight)."""
    if op.name not in CLONABLE:
        return False
    if op.name != "arith.constant":
        return True
    value = op.attributes["value"]
    if not isinstance(op.results[0].type, ir.ShapedType):
        return True
    return isinstance(value, ir.DenseElementsAttr) and ir.DenseElementsAttr(value).is_splat


def groups(fn: Any, seed: Callable[[Any], bool], heavy: Callable[[Any], bool]) -> list[list[Any]]:
    """The ops of ``fn``'s body a schedule transforms together, each group in program order.

    Every op ``seed`` accepts starts a group; an op whose only use is by another seed op
    joins that op's group (a producer fused into its consumer's tiles, an epilogue fused
    into a matmul's), unless both groups already hold a ``heavy`` op (a matmul feeding the
    next layer's matmul stays apart: a whole network would otherwise become one group).
    """
    ops = [op for op in top_level_ops(fn) if seed(op)]
    position = {op: i for i, op in enumerate(ops)}
    parent = list(range(len(ops)))
    has_heavy = [heavy(op) for op in ops]

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, op in enumerate(ops):
        uses = [use for result in op.results for use in result.uses]
        if len(uses) != 1:
            continue
        j = position.get(uses[0].owner.operation)
        if j is None:
            continue
        a, b = find(i), find(j)
        if a == b or (has_heavy[a] and has_heavy[b]):
            continue
        parent[a] = b
        has_heavy[b] = has_heavy[a] or has_heavy[b]
    found: dict[int, list[Any]] = {}
    for i, op in enumerate(ops):
        found.setdefault(find(i), []).append(op)
    return list(found.values())


def significant_attributes(op: Any, skip: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """``op``'s attributes as (name, ``ir.Attribute``) pairs, stagegraph's labels and the
    names in ``skip`` left out: what two ops must share to compute the same thing."""
    named = (op.attributes[i] for i in range(len(op.attributes)))
    return tuple(
        (a.name, a.attr)
        for a in named
        if not a.name.startswith(LABEL_PREFIX) and a.name not in skip
    )


def structure_key(fn: Any) -> tuple[Any, ...]:
    """What makes two functions compute the same thing: their type and, per nested op in
    walk order, its name, attributes (stagegraph's labels aside), result types, region
    shapes and which earlier value (argument, op result, block argument) each operand is."""
    numbers: dict[Any, int] = {}
    entries: list[Any] = [fn.attributes["function_type"]]

    def number(value: Any) -> None:
        numbers[value] = len(numbers)

    for arg in fn.regions[0].blocks[0].arguments:
        number(arg)
    top = fn

    def visit(op: Any) -> Any:
        if op == top:
            return ir.WalkResult.ADVANCE
        regions = []
        for region in op.regions:
            blocks = []
            for block in region.blocks:
                blocks.append(tuple(arg.type for arg in block.arguments))
                for arg in block.arguments:
                    number(arg)
            regions.append(tuple(blocks))
        operands = tuple(numbers.get(value, -1) for value in op.operands)
        entries.append(
            (
                op.name,
                operands,
                tuple(result.type for result in op.results),
                significant_attributes(op),
                tuple(regions),
            )
        )
        for result in op.results:
            number(result)
        return ir.WalkResult.ADVANCE

    fn.walk(visit, ir.WalkOrder.PRE_ORDER)
    return tuple(entries)


@dataclass
class Distinct:
    """One function standing for every group with its key: scheduled once, then installed
    in the payload module as a private function that every site calls."""

    symbol: str
    scope: Outlined  # the first site's scratch module and function
    sites: int = 0
    declaration: Any = None  # the private declaration in the payload meanwhile


@dataclass
class Deduplicated:
    """What :func:`outline_repeated` did to a payload."""

    distinct: list[Distinct] = field(default_factory=list)
    put_back: int = 0  # groups outlined, found unique and put back (fills, empties cloned)

    @property
    def calls(self) -> int:
        return sum(d.sites for d in self.distinct)


def _unique_symbol(module: Any, base: str, taken: set[str]) -> str:
    if not taken:
        for op in module.body.operations:
            if "sym_name" in op.operation.attributes:
                taken.add(ir.StringAttr(op.operation.attributes["sym_name"]).value)
    k = len(taken)
    while f"{base}{k}" in taken:
        k += 1
    taken.add(f"{base}{k}")
    return f"{base}{k}"


def call_instead(scope: Outlined, symbol: str) -> None:
    """Replace the outlined ops' placeholders by one call of ``symbol`` on the arguments."""
    anchor = scope.placeholders[0]
    types = [p.results[0].type for p in scope.placeholders]
    with anchor.location, ir.InsertionPoint(anchor):
        call = func.CallOp(types, ir.FlatSymbolRefAttr.get(symbol), list(scope.arguments))
    for placeholder, result in zip(scope.placeholders, call.results, strict=True):
        placeholder.results[0].replace_all_uses_with(result)
        placeholder.erase()


def outline_repeated(
    module: Any,
    fn: Any,
    found: Sequence[Sequence[Any]],
    extra_key: Callable[[Sequence[Any]], Hashable] = lambda _ops: None,
    min_sites: int = 2,
) -> Deduplicated:
    """Replace every group of ``found`` (groups of ops of ``fn``'s body) whose structure
    occurs at least ``min_sites`` times by a call of one function per structure.

    ``extra_key`` adds what else must be equal for two groups to share a function (the
    params a cost model chose for their ops). The shared functions stay in scratch modules
    (``Distinct.scope``) for the caller to schedule one by one; the payload holds a private
    declaration for each meanwhile, so it verifies. :func:`install` moves them in.
    """
    outlined: list[tuple[Hashable, Outlined]] = []
    found = _by_last_op(fn, found)
    extras = [extra_key(ops) for ops in found]  # before any op moves
    # A necessary condition for equal keys, read in place: a group no other group matches
    # on it is never moved (a payload without repetition is left exactly as it was).
    coarse = [
        (extra, tuple((op.name, tuple(r.type for r in op.results)) for op in ops))
        for ops, extra in zip(found, extras, strict=True)
    ]
    seen: dict[Hashable, int] = {}
    for c in coarse:
        seen[c] = seen.get(c, 0) + 1
    passed_in: set[Any] = set()  # values outlined groups read as arguments
    for ops, extra, c in zip(found, extras, coarse, strict=True):
        if seen[c] < min_sites or _read_before_last(ops, passed_in):
            continue
        scope = outline(ops, clone_into_group)
        if scope is not None:
            passed_in.update(scope.arguments)
            outlined.append(((structure_key(scope.function), extra), scope))
    counts: dict[Hashable, int] = {}
    for key, _ in outlined:
        counts[key] = counts.get(key, 0) + 1
    result = Deduplicated()
    by_key: dict[Hashable, Distinct] = {}
    taken: set[str] = set()
    base = ir.StringAttr(fn.attributes["sym_name"]).value + "_group"
    # Last group first: a group's arguments may be an earlier group's placeholders, which
    # stay valid until that earlier group is put back or called.
    for key, scope in reversed(outlined):
        if counts[key] < min_sites:
            scope.inline()
            result.put_back += 1
            continue
        distinct = by_key.get(key)
        if distinct is None:
            symbol = _unique_symbol(module, base, taken)
            scope.function.attributes["sym_name"] = ir.StringAttr.get(symbol)
            distinct = by_key[key] = Distinct(symbol, scope)
            result.distinct.append(distinct)
            with fn.location, ir.InsertionPoint(module.body):
                declaration = func.FuncOp(symbol, scope.function.type, visibility="private")
            distinct.declaration = declaration.operation
        distinct.sites += 1
        call_instead(scope, distinct.symbol)
    return result


def _by_last_op(fn: Any, found: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
    """``found`` ordered by where each group's last op is. Outlined in that order, a group's
    outside readers (all after its last op) are still in the function when it moves, so
    each gets a placeholder; in the order of first ops, a reader outlined earlier would
    have taken the value itself as an argument, and its call would then read a value
    moved into another module."""
    position = {op: i for i, op in enumerate(top_level_ops(fn))}
    return sorted(found, key=lambda ops: position.get(ops[-1].operation, -1))


def _read_before_last(ops: Sequence[Any], passed_in: set[Any]) -> bool:
    """Whether a group outlined earlier reads a result of ``ops`` (as an argument): with
    groups outlined by last op, that reader lies before this group's last op (the groups
    interleave), so this group must stay where it is, where the reader's call finds it."""
    return any(result in passed_in for op in ops for result in op.results)


def install(module: Any, deduplicated: Deduplicated) -> None:
    """Move each shared function from its scratch module into ``module`` (private), in
    place of its declaration."""
    for distinct in deduplicated.distinct:
        function = distinct.scope.function.operation
        function.attributes["sym_visibility"] = ir.StringAttr.get("private")
        function.attributes[OUTLINED_ATTR] = ir.UnitAttr.get()
        _strided_arguments(function)
        function.detach_from_parent()
        ir.InsertionPoint(distinct.declaration).insert(function)
        distinct.declaration.erase()
        distinct.declaration = None


def _strided_arguments(function: Any) -> None:
    """Let each tensor argument bufferize to any row-major strided view (dynamic offset and
    outer strides, unit inner stride): a call site then passes its slice as it is, where an
    identity layout would allocate and copy every sliced argument at every call (thousands
    of copy loops in an unrolled network's entry)."""
    attrs = []
    for arg in function.regions[0].blocks[0].arguments:
        entry = {}
        if isinstance(arg.type, ir.RankedTensorType) and ir.RankedTensorType(arg.type).rank:
            rank = ir.RankedTensorType(arg.type).rank
            dims = [ir.AffineDimExpr.get(i) for i in range(rank)]
            syms = [ir.AffineSymbolExpr.get(i) for i in range(rank)]
            expr = syms[0] + dims[-1]
            for i in range(rank - 1):
                expr = expr + dims[i] * syms[i + 1]
            layout = ir.AffineMap.get(rank, rank, [expr])
            entry["bufferization.buffer_layout"] = ir.AffineMapAttr.get(layout)
        attrs.append(ir.DictAttr.get(entry))
    function.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def forbid_inlining(module: Any) -> int:
    """Mark every shared function of an LLVM-dialect ``module`` ``no_inline``; returns how
    many. LLVM would otherwise inline a small function back into each of its hundreds of
    call sites, and compile the unrolled network again at full size."""
    marked = 0
    for op in children(module.operation):  # iterating the body would import the llvm module
        if op.name == "llvm.func" and OUTLINED_ATTR in op.attributes:
            op.attributes["no_inline"] = ir.UnitAttr.get(module.context)
            del op.attributes[OUTLINED_ATTR]
            marked += 1
    return marked
