"""A norm's batch statistics in one pass over its input, not three.

Training-mode BatchNorm (statistics of the batch), InstanceNorm, GroupNorm and LayerNorm
come from the importer as the two-pass variance, in f64: ``X = extf(x)``, ``S = sum(X)``,
``M = S / N``, ``V = sum((X - M)^2)``, and beside those the f32 ``sum(x)`` whose mean the
normalization subtracts. Those are three reductions over the same input, each a pass over
memory, the second only after the first has finished (it needs ``M``). Algebra removes
that dependence: for any per-group value ``K``,

    sum((X - M)^2) = T2 - 2 (M - K) T1 + N (M - K)^2,
    with T1 = sum(X - K) and T2 = sum((X - K)^2),

so :func:`one_pass_statistics` replaces the three reductions by one multi-output
reduction computing ``T1``, ``T2`` and the sums ``S`` (of ``X``) and of ``x`` together
(the generic schedule vectorizes it like a single reduction), and ``V`` from per-group
values (no pass: a group's values are a few numbers). Where ``M`` is ``S / N`` (the
importer's mean), ``M - K = T1 / N`` and ``V = T2 - T1^2 / N``: the shift is then read
by the one reduction only, where its input is read anyway.

Why the shift ``K``: with ``K = 0`` this is the textbook ``E[X^2] - E[X]^2``, which cancels
catastrophically when a group's mean is large against its spread (relative error of the
order ``eps * N * M^2 / var``). ``K`` is each group's first element (the input at index 0
of every reduced dim), so ``M - K`` is of the order of the spread and the f64 accumulators
keep what the two-pass form keeps. Where an f64 sum is computed, the f32 sums of ``x`` are
that sum rounded once (the same values, at least as accurate as f32 additions, one
accumulator fewer); with more groups than elements per group (GroupNorm of a few values
each: the groups are a stream themselves) they stay accumulators of the one reduction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stagegraph.mlir.bindings import arith, dialect, ir
from stagegraph.mlir.build import generic
from stagegraph.mlir.constants import is_zero_constant
from stagegraph.mlir.walk import DefUse, children, top_level_ops
from stagegraph.stages.analysis.ops import declared_iterator_types
from stagegraph.stages.x86.generic.linalg_parts import input_count, result_owner
from stagegraph.stages.x86.generic.prepare import erase_unused_tensor_ops


@dataclass
class _Statistics:
    """One norm's reductions: ``variance`` (``sum((X - M)^2)``, reading ``square`` of
    ``deviation``), ``mean`` (``M``), ``source`` (``x``; ``X = extf(x)`` when ``widened``),
    and the sums of the same groups to compute alongside: ``wide_sums`` of ``X``,
    ``narrow_sums`` of ``x`` (when widened); ``mean_is_average``: ``M`` is a wide sum
    divided by the group's element count."""

    variance: Any
    square: Any
    deviation: Any
    mean: Any
    source: Any
    widened: bool
    mean_is_average: bool = False
    wide_sums: list[Any] = field(default_factory=list)
    narrow_sums: list[Any] = field(default_factory=list)


def one_pass_statistics(module: Any) -> int:
    """Compute every norm's sum and sum of squared deviations of ``module`` (on tensors) in
    one reduction with the other sums of its input over the same groups (see the module
    doc); returns how many norms were rewritten."""
    rewritten = 0
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func" or not fn.regions[0].blocks:
            continue
        while (found := _find(fn)) is not None:
            _rewrite(found)
            erase_unused_tensor_ops(fn)
            rewritten += 1
    return rewritten


def _find(fn: Any) -> _Statistics | None:
    uses = DefUse(fn)
    for op in top_level_ops(fn):
        if (found := _match(op, uses)) is not None:
            return found
    return None


def _maps(op: Any) -> list[Any]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def _all_parallel(op: Any) -> bool:
    return "reduction" not in declared_iterator_types(op)


def _body(op: Any) -> list[Any]:
    """The body ops of a linalg op, yield excluded."""
    return children(op)[:-1]


def _arguments(op: Any) -> list[Any]:
    return list(op.regions[0].blocks[0].arguments)


def _yields(op: Any, value: Any) -> bool:
    return list(children(op)[-1].operands) == [value]


def _binary(op: Any, name: str) -> tuple[Any, Any] | None:
    """The operands of ``op``'s body when it is one ``name`` op yielded, else None."""
    body = _body(op)
    if len(body) != 1 or body[0].name != name or not _yields(op, body[0].results[0]):
        return None
    return body[0].operands[0], body[0].operands[1]


def _zero_init(value: Any, uses: DefUse) -> bool:
    """Whether ``value`` is a ``linalg.fill`` of constant 0 (a sum's starting value)."""
    owner = uses.owner(value)
    if owner is None or owner.name != "linalg.fill" or len(owner.operands) != 2:
        return False
    scalar = uses.owner(owner.operands[0])
    return scalar is not None and is_zero_constant(scalar)


def _is_sum(op: Any, uses: DefUse) -> bool:
    """A ``linalg.generic`` adding its one input, read through the identity map, into a
    zero-filled init over reduction loops, each parallel loop a dim of its output."""
    if op.name != "linalg.generic" or len(op.results) != 1 or input_count(op) != 1:
        return False
    if _all_parallel(op) or not _zero_init(op.operands[1], uses):
        return False
    maps = _maps(op)
    if not _identity(maps[0]) or not _projection(maps[1]):
        return False
    operands = _binary(op, "arith.addf")
    if operands is None or set(operands) != set(_arguments(op)):
        return False
    kinds = declared_iterator_types(op)
    parallel = {d for d, kind in enumerate(kinds) if kind == "parallel"}
    return parallel == _output_dims(maps[1])


def _identity(amap: Any) -> bool:
    return amap == ir.AffineMap.get_identity(amap.n_dims)


def _projection(amap: Any) -> bool:
    """Each result a distinct loop dim or the constant 0 (a kept unit dim)."""
    dims = []
    for expr in amap.results:
        if isinstance(expr, ir.AffineDimExpr):
            dims.append(ir.AffineDimExpr(expr).position)
        elif not (
            isinstance(expr, ir.AffineConstantExpr) and ir.AffineConstantExpr(expr).value == 0
        ):
            return False
    return len(dims) == len(set(dims))


def _output_dims(amap: Any) -> set[int]:
    return {ir.AffineDimExpr(e).position for e in amap.results if isinstance(e, ir.AffineDimExpr)}


def _elementwise(op: Any, inputs: int) -> bool:
    return (
        op is not None and op.name == "linalg.generic" and len(op.results) == 1
        and input_count(op) == inputs and _all_parallel(op)
    )  # fmt: skip


def _match(variance: Any, uses: DefUse) -> _Statistics | None:
    """``variance`` as ``sum((X - M)^2)`` (see the module doc), with the sums beside it."""
    if not _is_sum(variance, uses):
        return None
    square = uses.owner(variance.operands[0])
    if not _elementwise(square, 2) or len(uses.users(square.results[0])) != 1:
        return None
    operands = _binary(square, "arith.mulf")
    arguments = _arguments(square)[:2]
    if operands is None or not set(operands) <= set(arguments):
        return None
    if square.operands[0] != square.operands[1]:
        return None  # both factors read the deviation
    if not all(_identity(m) for m in _maps(square)):
        return None
    deviation = uses.owner(square.operands[0])
    if not _elementwise(deviation, 2) or len(uses.users(deviation.results[0])) != 2:
        return None
    maps, group_map = _maps(deviation), _maps(variance)[1]
    if _binary(deviation, "arith.subf") != tuple(_arguments(deviation)[:2]):
        return None
    if not (_identity(maps[0]) and _identity(maps[2]) and maps[1] == group_map):
        return None
    wide, mean = deviation.operands[0], deviation.operands[1]
    if mean.type != variance.results[0].type or not _static(wide) or not _static(mean):
        return None
    source, widened = _narrowed(wide, uses), True
    if source is None:
        source, widened = wide, False
    found = _Statistics(variance, square, deviation, mean, source, widened)
    found.wide_sums = _sums_beside(wide, variance, uses)
    found.mean_is_average = _is_average(mean, found.wide_sums, uses)
    if widened:
        found.narrow_sums = _sums_beside(source, variance, uses)
    return found


def _is_average(mean: Any, sums: list[Any], uses: DefUse) -> bool:
    """Whether ``mean`` is one of ``sums`` divided by the number of elements it adds."""
    owner = uses.owner(mean)
    if not _elementwise(owner, 1) or uses.owner(owner.operands[0]) not in sums:
        return False
    operands = _binary(owner, "arith.divf")
    if operands is None or operands[0] != _arguments(owner)[0]:
        return False
    divisor = uses.owner(operands[1])
    if divisor is None or divisor.name != "arith.constant":
        return False
    total = ir.RankedTensorType(owner.operands[0].type)
    source = ir.RankedTensorType(uses.owner(owner.operands[0]).operands[0].type)
    count = math.prod(source.shape) // max(1, math.prod(total.shape))
    value = divisor.attributes["value"]
    return isinstance(value, ir.FloatAttr) and ir.FloatAttr(value).value == count


def _static(value: Any) -> bool:
    return ir.RankedTensorType(value.type).has_static_shape


def _narrowed(wide: Any, uses: DefUse) -> Any | None:
    """``x`` when ``wide`` is ``extf(x)`` (an elementwise generic of identity maps)."""
    owner = uses.owner(wide)
    if not _elementwise(owner, 1) or not all(_identity(m) for m in _maps(owner)):
        return None
    body = _body(owner)
    if len(body) != 1 or body[0].name != "arith.extf" or not _yields(owner, body[0].results[0]):
        return None
    return owner.operands[0] if body[0].operands[0] == _arguments(owner)[0] else None


_RESHAPES = frozenset({"tensor.expand_shape", "tensor.collapse_shape"})


def _same_views(value: Any, uses: DefUse) -> list[Any]:
    """``value`` and the identical reshapes of the tensor it reshapes (the importer
    reshapes a GroupNorm's input once per reader)."""
    owner = uses.owner(value)
    if owner is None or owner.name not in _RESHAPES:
        return [value]
    found = [value]
    for other in uses.users(owner.operands[0]):
        if other == owner or other.name != owner.name or other.parent != owner.parent:
            continue
        same = other.results[0].type == value.type and all(
            name in other.attributes and other.attributes[name] == owner.attributes[name]
            for name in owner.attributes
        )
        if same and list(other.operands) == list(owner.operands):
            found.append(other.results[0])
    return found


def _sums_beside(value: Any, variance: Any, uses: DefUse) -> list[Any]:
    """The sums of ``value`` (or an identical reshape) over the groups ``variance``
    reduces over, in its block."""
    keys = ("indexing_maps", "iterator_types")
    found = []
    readers = [user for view in _same_views(value, uses) for user in uses.users(view)]
    for user in readers:
        if user in found or user.parent != variance.parent or not _is_sum(user, uses):
            continue
        if all(user.attributes[k] == variance.attributes[k] for k in keys):
            found.append(user)
    return found


def _rewrite(found: _Statistics) -> None:
    """One reduction for all of ``found``'s sums, then ``S`` and ``V`` from its results."""
    variance = found.variance
    group_type = ir.RankedTensorType(variance.results[0].type)
    shape = ir.RankedTensorType(found.source.type).shape
    reduced = [d for d in range(len(shape)) if d not in _output_dims(_maps(variance)[1])]
    count = math.prod(shape[d] for d in reduced)
    block_ops = top_level_ops(variance.parent)
    sums = [*found.wide_sums, *found.narrow_sums]
    first = min([variance, *sums], key=block_ops.index)
    # The f32 sums of x are the f64 sums of the same values, rounded once (at least as
    # accurate as f32 additions, one accumulator fewer), where there is an f64 sum and
    # rounding, an op over the groups, costs next to nothing (fewer groups than elements
    # in each: not a GroupNorm of a few values per group, whose groups are a stream).
    few_groups = math.prod(group_type.shape) <= count
    rounded = found.narrow_sums if found.wide_sums and few_groups else []
    accumulated = [total for total in sums if total not in rounded]
    with ir.InsertionPoint(first), variance.location:
        merged, shift, group_shift = _merged_reduction(found, accumulated, reduced)
        moments = merged.results[0], merged.results[1]
        for total, result in zip(accumulated, list(merged.results)[2:], strict=True):
            total.results[0].replace_all_uses_with(result)
        for total in rounded:
            narrow = ir.RankedTensorType(total.results[0].type)
            identity = ir.AffineMap.get_identity(narrow.rank)
            empty = dialect("tensor").EmptyOp(list(narrow.shape), narrow.element_type).result
            rounding = generic(
                [merged.results[2]], [empty], [identity, identity], ["parallel"] * narrow.rank,
                lambda wide, _out, element=narrow.element_type: arith.truncf(element, wide),
            )  # fmt: skip
            total.results[0].replace_all_uses_with(rounding)
    with ir.InsertionPoint(variance), variance.location:
        if found.mean_is_average:  # M - K = T1 / N: sum((X - M)^2) = T2 - T1^2 / N

            def deviations(t1: Any, t2: Any, _out: Any) -> Any:
                return arith.subf(t2, arith.divf(arith.mulf(t1, t1), _constant(t1, count)))

            rebuilt = _per_group(list(moments), [], group_type, deviations)
        else:

            def deviations(t1: Any, t2: Any, mean: Any, k: Any, _out: Any) -> Any:
                offset = arith.subf(mean, _widen(k, found))  # M - K
                cross = arith.mulf(offset, t1)
                spread = _times(arith.mulf(offset, offset), count)
                return arith.addf(arith.subf(t2, arith.addf(cross, cross)), spread)

            inputs = [*moments, found.mean, shift]
            rebuilt = _per_group(inputs, [group_shift], group_type, deviations)
    variance.results[0].replace_all_uses_with(rebuilt)
    for dead in (variance, found.square, found.deviation, *sums):
        dead.erase()


def _merged_reduction(found: _Statistics, sums: list[Any], reduced: list[int]) -> Any:
    """The one reduction (``T1``, ``T2``, then ``sums``' results), the shift it reads (the
    input at index 0 of the ``reduced`` dims) and the map the per-group ops read the shift
    through; built at the insertion point."""
    source, variance = found.source, found.variance
    source_type = ir.RankedTensorType(source.type)
    rank = source_type.rank
    group_map = _maps(variance)[1]
    group_type = ir.RankedTensorType(variance.results[0].type)
    sizes = [1 if d in reduced else n for d, n in enumerate(source_type.shape)]
    shift = first_elements(source, sizes)
    group_shift = _shift_on_groups(group_map, reduced, rank)
    shift_map = ir.AffineMap.get(rank, 0, [
        ir.AffineConstantExpr.get(0) if d in reduced else ir.AffineDimExpr.get(d)
        for d in range(rank)
    ])  # fmt: skip
    # Fresh inits: the sums' own may be defined after the insertion point.
    inits = [_zeros(group_type), _zeros(group_type)]
    inits += [_zeros(ir.RankedTensorType(s.results[0].type)) for s in sums]
    maps = [ir.AffineMap.get_identity(rank), shift_map, *[group_map] * len(inits)]
    body = _moment_body(found.widened, len(found.wide_sums))
    kinds = list(declared_iterator_types(variance))
    return generic([source, shift], inits, maps, kinds, body), shift, group_shift


def first_elements(value: Any, sizes: list[int]) -> Any:
    """The leading ``sizes`` block of tensor ``value`` (offsets 0), built at the insertion
    point. Where ``value`` comes from elementwise generics, they are recomputed on the
    blocks of their inputs: slicing their result instead would make the schedule compute
    all of it into a buffer (a pass over memory) where it would otherwise only compute it
    inside its readers' tiles."""
    owner = result_owner(value)
    if owner is not None and _sliceable(owner):
        maps = _maps(owner)
        inputs = []
        for operand, amap in zip(list(owner.operands)[: input_count(owner)], maps, strict=False):
            inner = [sizes[ir.AffineDimExpr(e).position] if isinstance(e, ir.AffineDimExpr)
                     else 1 for e in amap.results]  # fmt: skip
            inputs.append(first_elements(operand, inner))
        element = ir.RankedTensorType(value.type).element_type
        empty = dialect("tensor").EmptyOp(sizes, element).result
        block = owner.clone()  # its body, moved into the op on the blocks
        sliced = ir.Operation.create(
            "linalg.generic",
            results=[empty.type],
            operands=[*inputs, empty],
            attributes={name: owner.attributes[name] for name in owner.attributes},
            regions=1,
        )
        block.regions[0].blocks[0].append_to(sliced.regions[0])
        block.erase()
        return sliced.results[0]
    source_type = ir.RankedTensorType(value.type)
    rank = source_type.rank
    return dialect("tensor").ExtractSliceOp(
        ir.RankedTensorType.get(sizes, source_type.element_type), value, [], [], [],
        [0] * rank, sizes, [1] * rank,
    ).result  # fmt: skip


def _sliceable(op: Any) -> bool:
    """An elementwise generic computing each element from the same elements (or
    broadcast ones) of its inputs, so that its leading block needs only theirs."""
    if op.name != "linalg.generic" or not _elementwise(op, input_count(op)):
        return False
    if not _identity(_maps(op)[-1]):
        return False
    if any(inner.name == "linalg.index" for inner in _body(op)):
        return False
    if list(_arguments(op)[input_count(op)].uses):
        return False  # reads its init
    return all(_projection(m) for m in _maps(op)[:-1]) and all(
        isinstance(v.type, ir.RankedTensorType) for v in op.operands
    )


def _zeros(tensor_type: Any) -> Any:
    """A fresh zero-filled tensor of ``tensor_type`` (a sum's init)."""
    from stagegraph.mlir.build import named_structured_op

    element = tensor_type.element_type
    empty = dialect("tensor").EmptyOp(list(tensor_type.shape), element).result
    zero = arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
    return named_structured_op("linalg.fill", [zero], [empty])


def _moment_body(widened: bool, wide_sums: int) -> Any:
    """The merged reduction's body: ``T1 += X - K``, ``T2 += (X - K)^2``, then the sums
    (of ``X`` first, then of ``x``)."""

    def body(x: Any, k: Any, t1: Any, t2: Any, *sums: Any) -> list[Any]:
        value, shift = x, k
        if widened:
            value, shift = arith.extf(t1.type, x), arith.extf(t1.type, k)
        centred = arith.subf(value, shift)
        yielded = [arith.addf(centred, t1), arith.addf(arith.mulf(centred, centred), t2)]
        for j, total in enumerate(sums):
            yielded.append(arith.addf(value if j < wide_sums else x, total))
        return yielded

    return body


def _shift_on_groups(group_map: Any, reduced: list[int], rank: int) -> Any:
    """The map from a group's index (the dims of ``group_map``'s results) to the shift
    tensor (the input's shape with the reduced dims 1)."""
    position = {
        ir.AffineDimExpr(e).position: j
        for j, e in enumerate(group_map.results)
        if isinstance(e, ir.AffineDimExpr)
    }
    groups = len(group_map.results)
    return ir.AffineMap.get(groups, 0, [
        ir.AffineConstantExpr.get(0) if d in reduced else ir.AffineDimExpr.get(position[d])
        for d in range(rank)
    ])  # fmt: skip


def _per_group(inputs: list[Any], tail_maps: list[Any], group_type: Any, body: Any) -> Any:
    """An elementwise generic over the groups: ``inputs`` are group-shaped but for the
    last ``len(tail_maps)`` (the shift), read through those maps."""
    groups = group_type.rank
    identity = ir.AffineMap.get_identity(groups)
    empty = dialect("tensor").EmptyOp(list(group_type.shape), group_type.element_type).result
    maps = [*[identity] * (len(inputs) - len(tail_maps)), *tail_maps, identity]
    return generic(inputs, [empty], maps, ["parallel"] * groups, body)


def _widen(value: Any, found: _Statistics) -> Any:
    """A scalar of the input's type in the accumulators' (f64 when the norm widened)."""
    if not found.widened:
        return value
    wide = ir.RankedTensorType(found.variance.results[0].type).element_type
    return arith.extf(wide, value)


def _constant(like: Any, value: float) -> Any:
    return arith.ConstantOp(like.type, ir.FloatAttr.get(like.type, float(value))).result


def _times(value: Any, count: int) -> Any:
    return arith.mulf(value, _constant(value, count))
