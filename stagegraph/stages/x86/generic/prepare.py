"""IR rewrites (through the bindings) that make more of a payload vectorizable by the
generic schedule; run by ``generic.schedule.apply_generic_schedule`` before labelling.

* :func:`drop_dead_results`: a ``linalg.generic`` result nobody uses is removed with the body
  ops that only compute it (e.g. the argmax a max reduction computes next to the max, whose
  ``linalg.index`` keeps the op from vectorizing as a reduction), and so is the fill of its
  init (:func:`erase_unused_tensor_ops`).
* :func:`unit_transposes_to_reshapes`: a ``linalg.transpose`` that only moves unit dims is a
  reshape (the element order does not change): collapse + expand, no copy.
* :func:`widen_bool_tensors`: ``i1`` tensors passed between linalg ops become ``i8`` tensors
  (vector<Nxi1> is bit-packed in LLVM memory while memref ``i1`` elements are bytes, so ops
  on ``i1`` tensors cannot be vectorized); the bodies convert at their boundary and bitwise
  combiners (``andi``/``ori``/``xori``) work on the ``i8`` values directly (they stay 0/1).
* :func:`squares_to_multiplies`: ``math.powf(x, 2.0)`` (PyTorch's ``x ** 2``) becomes
  ``x * x``, exactly the correctly rounded square; as a vector op it would otherwise call
  a vector ``pow`` from libmvec, an order of magnitude slower.
* :func:`conv3d_to_conv2d_loops`: a 3-D convolution becomes loops over output depth and
  filter depth around a 2-D convolution of depth slices, which the schedule tiles,
  decomposes to 1-D and vectorizes (MLIR has no such decomposition for 3-D convolutions).
* :func:`grouped_conv_to_group_loops`: a grouped 2-D convolution becomes a loop over the
  groups around a plain 2-D convolution.
* :func:`depthwise_to_channels_last`: an NCHW depthwise convolution becomes transposes
  around the NHWC one, which decomposes to 1-D and vectorizes along the channels.
* :func:`conv_to_channels_last`: likewise an NCHW (NCDHW) convolution whose output channels
  fill whole vectors (``GenericParams.conv_channels_last``): its NCW tiles gather and
  scatter their channel vectors element by element.
* :func:`~stagegraph.stages.x86.generic.layout_sinking.sink_channels_last_transposes`:
  the transposes back to NCHW after those convolutions move past the ops between two
  convolutions (elementwise, norms, pools, padding) until they cancel the next one's.
* :func:`~stagegraph.stages.x86.generic.transpose_readers.merge_transposes_into_readers`:
  a transpose read by several generics (a norm's statistics and normalization after a
  channels-last convolution) and leading slices is read through by all of them.
* :func:`~stagegraph.stages.x86.generic.elementwise_fusion.duplicate_cheap_producers` and
  :func:`~stagegraph.stages.x86.generic.elementwise_fusion.fuse_elementwise_chains`: elementwise
  chains become single generics (:mod:`.elementwise_fusion`).

Ops are found by walking the entry function; matmul-like ops are never changed.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import arith, dialect, ir, linalg_ops
from stagegraph.mlir.build import non_unit_groups, reassociation_attr
from stagegraph.mlir.walk import top_level_ops
from stagegraph.stages.x86.conv.depthwise import grouped_to_width_kernels
from stagegraph.stages.x86.conv.rewrites import (
    conv3d_to_conv2d_loops,
    conv_to_channels_last,
    depthwise_to_channels_last,
    grouped_conv_to_group_loops,
)
from stagegraph.stages.x86.generic.elementwise_fusion import (
    duplicate_cheap_producers,
    fuse_elementwise_chains,
)
from stagegraph.stages.x86.generic.layout_sinking import sink_channels_last_transposes
from stagegraph.stages.x86.generic.linalg_parts import (
    body_block,
    body_yield,
    input_count,
    is_bool_tensor,
    is_contraction,
    result_owner,
)
from stagegraph.stages.x86.generic.transpose_fusion import (
    fold_constant_transposes,
    merge_transposes_into_elementwise,
    pads_as_filled_inserts,
    transposes_before_padding,
)
from stagegraph.stages.x86.generic.transpose_readers import merge_transposes_into_readers
from stagegraph.stages.x86.generic.unpadded_pools import dilated_pools_read_unpadded

_BITWISE = frozenset({"arith.andi", "arith.ori", "arith.xori"})


# ----------------------------------------------------------------------------- dead results


def _live_body_ops(op: Any, kept: list[int]) -> set[Any]:
    """Body ops the kept yield operands depend on (the body is a single block)."""
    live: set[Any] = set()
    work = [body_yield(op).operands[k] for k in kept]
    while work:
        value = work.pop()
        owner = result_owner(value)
        if owner is None or owner in live or owner.parent != op:
            continue
        live.add(owner)
        work.extend(owner.operands)
        for region in owner.regions:  # values used inside nested regions
            for inner in region.blocks:
                for nested in inner.operations:
                    work.extend(nested.operation.operands)
    return live


def _covers_loops(maps: list[Any], n_loops: int) -> bool:
    seen = {e.position for m in maps for e in m.results if isinstance(e, ir.AffineDimExpr)}
    return seen >= set(range(n_loops))


def _drop_dead(op: Any) -> bool:
    results = list(op.results)
    dead = [k for k, r in enumerate(results) if not list(r.uses)]
    if not dead or len(dead) == len(results):
        return False
    kept = [k for k in range(len(results)) if k not in dead]
    n_in = input_count(op)
    args = list(body_block(op).arguments)
    live = _live_body_ops(op, kept)
    # The dropped inits' block arguments must not feed what stays.
    for k in dead:
        arg = args[n_in + k]
        if any(use.owner.operation in live for use in arg.uses):
            return False
    maps = [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]
    keep_maps = maps[:n_in] + [maps[n_in + k] for k in kept]
    if not _covers_loops(keep_maps, maps[0].n_dims):
        return False
    operands = list(op.operands)
    inputs, inits = operands[:n_in], operands[n_in:]
    with ir.InsertionPoint(op), op.location:
        new = linalg_ops.GenericOp(
            [results[k].type for k in kept],
            inputs,
            [inits[k] for k in kept],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in keep_maps]),
            op.attributes["iterator_types"],
        )
    block = body_block(op)
    block.append_to(new.regions[0])
    old_yield = body_yield(new.operation)
    with ir.InsertionPoint(old_yield), old_yield.location:
        linalg_ops.YieldOp([old_yield.operands[k] for k in kept])
    old_yield.erase()
    # Erase the body ops nothing uses any more (reverse order: users first).
    for body_op in reversed(list(block.operations)[:-1]):
        body_op = body_op.operation
        if body_op not in live and all(not list(r.uses) for r in body_op.results):
            body_op.erase()
    for k in sorted(dead, reverse=True):
        block.erase_argument(n_in + k)
    for i, k in enumerate(kept):
        results[k].replace_all_uses_with(new.results[i])
    op.erase()
    return True


def drop_dead_results(fn: Any) -> int:
    """Remove unused results of the function's multi-result ``linalg.generic`` ops, then
    the tensor ops nothing reads any more (the fill of a dropped argmax's init)."""
    count = 0
    for op in top_level_ops(fn):
        if op.name == "linalg.generic" and len(op.results) > 1 and not is_contraction(op):
            count += _drop_dead(op)
    if count:
        count += erase_unused_tensor_ops(fn)
    return count


_PURE_ON_TENSORS = frozenset({"tensor.empty", "linalg.fill", "linalg.generic"})


def erase_unused_tensor_ops(fn: Any) -> int:
    """Erase the function's top-level ``tensor.empty``, ``linalg.fill`` and
    ``linalg.generic`` ops whose tensor results nobody uses (on tensors they have no other
    effect); returns the count. Left in place they would be bufferized and run: with
    their producers fused into consumers' tiles by the schedule, a transform's dead-code
    sweep used to erase them, but merged producers need no fusion step."""
    count = 0
    for op in reversed(top_level_ops(fn)):
        if op.name not in _PURE_ON_TENSORS or not list(op.results):
            continue
        if all(isinstance(r.type, ir.RankedTensorType) and not list(r.uses) for r in op.results):
            op.erase()
            count += 1
    return count


# ----------------------------------------------------------------------------- transposes


def unit_transposes_to_reshapes(fn: Any) -> int:
    """Replace each ``linalg.transpose`` that keeps its non-unit dims in order by reshapes."""
    tensor = dialect("tensor")
    count = 0
    for op in top_level_ops(fn):
        if op.name != "linalg.transpose" or len(op.results) != 1:
            continue
        source = op.operands[0]
        if not isinstance(source.type, ir.RankedTensorType):
            continue
        src_t = ir.RankedTensorType(source.type)
        out_t = ir.RankedTensorType(op.results[0].type)
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        src_shape, out_shape = list(src_t.shape), list(out_t.shape)
        if any(ir.ShapedType.is_dynamic_size(s) for s in src_shape):
            continue
        moved = [p for p in perm if src_shape[p] != 1]
        if moved != sorted(moved):
            continue
        src_groups, out_groups = non_unit_groups(src_shape), non_unit_groups(out_shape)
        with ir.InsertionPoint(op), op.location:
            value = source
            flat = [s for s in src_shape if s != 1]
            if src_groups is None or out_groups is None:
                continue  # all unit: nothing worth doing
            if len(src_groups) != len(src_shape):
                flat_t = ir.RankedTensorType.get(flat, src_t.element_type)
                value = tensor.CollapseShapeOp(flat_t, value, reassociation_attr(src_groups)).result
            if len(out_groups) != len(out_shape):
                value = tensor.ExpandShapeOp(
                    out_t, value, reassociation_attr(out_groups), [], out_shape
                ).result
        op.results[0].replace_all_uses_with(value)
        op.erase()
        count += 1
    return count


# ----------------------------------------------------------------------------- i1 -> i8


def _bool_classes(fn: Any) -> list[list[Any]]:
    """Groups of i1 tensor values tied through destination operands (result <-> init); a
    group holding a value that is not an op result of the function (an argument) is left
    out."""
    parent: dict[Any, Any] = {}

    def find(v: Any) -> Any:
        while parent[v] != v:
            v = parent[v]
        return v

    for op in top_level_ops(fn):
        for r in op.results:
            if is_bool_tensor(r.type):
                parent[r] = r
    bad: set[Any] = set()
    for op in top_level_ops(fn):
        if op.name not in ("linalg.generic", "linalg.fill"):
            continue
        inits = list(op.operands)[len(op.operands) - len(op.results) :]
        for r, init in zip(op.results, inits, strict=True):
            if r not in parent:
                continue
            if init not in parent:
                bad.add(r)
                continue
            a, b = find(r), find(init)
            if a != b:
                parent[a] = b
    classes: dict[Any, list[Any]] = {}
    for v in parent:
        classes.setdefault(find(v), []).append(v)
    bad_roots = {find(v) for v in bad}
    return [vs for root, vs in classes.items() if root not in bad_roots]


def _widenable(values: list[Any]) -> bool:
    for v in values:
        owner = result_owner(v)
        if owner is None or owner.name not in ("tensor.empty", "linalg.generic", "linalg.fill"):
            return False
        if owner.name == "linalg.generic" and is_contraction(owner):
            return False
        for use in v.uses:
            user = use.owner.operation
            if user.name == "linalg.fill" and use.operand_number == 1:
                continue
            if user.name != "linalg.generic" or is_contraction(user):
                return False
    return True


def _narrow_arg(arg: Any, block: Any, i1: Any, i8: Any) -> None:
    arith = dialect("arith")
    uses = [(u.owner.operation, u.operand_number) for u in arg.uses]
    arg.set_type(i8)
    if not uses:
        # (An unread init, as a comparison's: a truncation of it would read the init, and
        # a generic reading its init is not merged into its consumer by elementwise_fusion.)
        return
    first = next(iter(block.operations)).operation
    with ir.InsertionPoint(first), first.location:
        narrow = arith.TruncIOp(i1, arg).result
    for user, number in uses:
        user.operands[number] = narrow


def _widen_class(values: list[Any]) -> None:
    arith = dialect("arith")
    i1 = ir.IntegerType.get_signless(1)
    i8 = ir.IntegerType.get_signless(8)
    uses = [(u.owner.operation, u.operand_number) for v in values for u in v.uses]
    widened: list[Any] = []
    for v in values:
        owner = result_owner(v)
        shape = list(ir.RankedTensorType(v.type).shape)
        v.set_type(ir.RankedTensorType.get(shape, i8))
        index = ir.OpResult(v).result_number
        if owner.name == "linalg.generic":
            yield_op = body_yield(owner)
            with ir.InsertionPoint(yield_op), yield_op.location:
                wide = arith.ExtUIOp(i8, yield_op.operands[index]).result
            yield_op.operands[index] = wide
            widened.append(wide)
        elif owner.name == "linalg.fill":
            with ir.InsertionPoint(owner), owner.location:
                owner.operands[0] = arith.ExtUIOp(i8, owner.operands[0]).result
            for arg in body_block(owner).arguments:
                arg.set_type(i8)
    for user, number in uses:
        if user.name == "linalg.fill":
            continue  # its init: the fill's own result is in the class too
        block = body_block(user)
        arg = block.arguments[number]
        if arg.type == i1:
            _narrow_arg(arg, block, i1, i8)
    for wide in widened:
        _fold_bitwise(wide, i8)


def _fold_bitwise(wide: Any, i8: Any) -> None:
    """``extui(op(trunci a, trunci b))`` with a bitwise ``op`` on i8 ``a``, ``b`` (0 or 1):
    ``op(a, b)`` on i8, so a reduction's body keeps a single combiner."""
    ext = result_owner(wide)
    inner = result_owner(ext.operands[0])
    if inner is None or inner.name not in _BITWISE:
        return
    sources, truncs = [], []
    for operand in inner.operands:
        trunc = result_owner(operand)
        if trunc is None or trunc.name != "arith.trunci" or trunc.operands[0].type != i8:
            return
        sources.append(trunc.operands[0])
        if trunc not in truncs:
            truncs.append(trunc)
    with ir.InsertionPoint(ext), ext.location:
        folded = ir.Operation.create(inner.name, results=[i8], operands=sources).result
    ext.results[0].replace_all_uses_with(folded)
    for dead in (ext, inner, *truncs):
        if dead.attached and not list(dead.results[0].uses):
            dead.erase()


def widen_bool_tensors(fn: Any) -> int:
    """Turn the i1 tensors linalg ops pass to each other into i8 tensors; returns how many
    groups of tied values were widened."""
    count = 0
    for values in _bool_classes(fn):
        if _widenable(values):
            _widen_class(values)
            count += 1
    return count


# ----------------------------------------------------------------------------- powers


def _float_constant(value: Any) -> float | None:
    owner = result_owner(value)
    if owner is None or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return ir.FloatAttr(attr).value
    if isinstance(attr, ir.DenseFPElementsAttr) and ir.DenseFPElementsAttr(attr).is_splat:
        return ir.FloatAttr(ir.DenseFPElementsAttr(attr).get_splat_value()).value
    return None


def squares_to_multiplies(fn: Any) -> int:
    """Replace every ``math.powf(x, 2.0)`` in ``fn`` by ``x * x``; returns the count."""
    from stagegraph.mlir.walk import collect

    squares = collect(
        fn, lambda op: op.name == "math.powf" and _float_constant(op.operands[1]) == 2.0
    )
    for op in squares:
        with ir.InsertionPoint(op), op.location:
            square = arith.MulFOp(op.operands[0], op.operands[0]).result
        op.results[0].replace_all_uses_with(square)
        op.erase()
    return len(squares)


def prepare(
    module: Any,
    fn: Any,
    fuse_elementwise: bool = True,
    conv_channels_last: bool = True,
    width_kernel_lanes: int = 0,
    row_chain_lanes: int = 0,
    direct3d: Any = None,
    chain_channels_last: bool = True,
) -> bool:
    """All rewrites on the function ``fn`` of ``module``; whether anything changed.

    ``fuse_elementwise`` (the params' choice to fuse elementwise producers) also merges
    elementwise chains into single generics (:func:`fuse_elementwise_chains`).
    ``width_kernel_lanes``: when not 0, depthwise and grouped NCHW convolutions with few
    channels per group become direct kernels vectorized along the width with vectors of
    up to that many lanes (:mod:`stagegraph.stages.x86.conv.depthwise`).
    ``row_chain_lanes``: when not 0, softmax-shaped chains of row reductions become one
    kernel per row with vectors of that many lanes (:mod:`.row_chains`; after the chains
    are merged, which makes ``exp(x - max)`` one op).
    ``direct3d``: when given (a :class:`~stagegraph.stages.x86.conv.direct3d_plan.Target3d`)
    and ``conv_channels_last``, 3-D convolutions become one register-blocked kernel
    (:mod:`stagegraph.stages.x86.conv.direct3d`) instead of depth loops of 2-D ones.
    ``chain_channels_last``: the transposes between channels-last convolutions sink
    until they cancel (:mod:`.layout_sinking`).
    """
    del module
    changed = drop_dead_results(fn)
    changed += unit_transposes_to_reshapes(fn)
    changed += widen_bool_tensors(fn)
    changed += squares_to_multiplies(fn)
    if conv_channels_last:  # before the 3-D loops, so a 3-D convolution is transposed once
        from stagegraph.stages.x86.conv.direct3d import (
            conv3d_to_direct_kernels,
            takes_channels_first,
        )

        takes = takes_channels_first(fn, direct3d) if direct3d is not None else None
        changed += conv_to_channels_last(fn, takes)
        if direct3d is not None:  # (the kernel takes the channels-last form only)
            changed += conv3d_to_direct_kernels(fn, direct3d)
    changed += conv3d_to_conv2d_loops(fn)
    if width_kernel_lanes:  # depthwise/grouped NCHW: direct kernels along the width
        changed += grouped_to_width_kernels(fn, width_kernel_lanes)
    changed += grouped_conv_to_group_loops(fn)
    changed += depthwise_to_channels_last(fn)
    if chain_channels_last and sink_channels_last_transposes(fn):  # none between convolutions
        changed += 1 + erase_unused_tensor_ops(fn)
    changed += fold_constant_transposes(fn)  # channels-last filters, at compile time
    changed += dilated_pools_read_unpadded(fn)  # no padded copy for their loops to read
    changed += transposes_before_padding(fn)  # written in place into the padded input
    changed += pads_as_filled_inserts(fn)  # likewise for the other pads
    if fuse_elementwise:
        changed += merge_transposes_into_elementwise(fn)  # merged just below
        changed += merge_transposes_into_readers(fn)  # read by a norm's statistics and more
        changed += duplicate_cheap_producers(fn)
        changed += fuse_elementwise_chains(fn)
    if row_chain_lanes:
        from stagegraph.stages.x86.generic.row_chains import fuse_row_chains

        changed += fuse_row_chains(fn, row_chain_lanes)
    changed += _prepare_attention_blocks(fn, fuse_elementwise, row_chain_lanes)
    return bool(changed)


def _prepare_attention_blocks(fn: Any, fuse_elementwise: bool, row_chain_lanes: int) -> int:
    """The same rewrites in each attention block loop's body
    (:mod:`stagegraph.stages.x86.attention`): its softmax one kernel per row."""
    from stagegraph.stages.x86.attention import block_loops
    from stagegraph.stages.x86.generic.row_chains import fuse_row_chains

    changed = 0
    for loop in block_loops(fn):
        changed += drop_dead_results(loop)
        if fuse_elementwise:
            changed += fuse_elementwise_chains(loop)
        if row_chain_lanes:
            changed += fuse_row_chains(loop, row_chain_lanes)
    return changed
