"""IR rewrites (through the bindings) that make more of a payload vectorizable by the
generic schedule; run by ``generic_schedule.apply_generic_schedule`` before labelling.

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
* :func:`duplicate_cheap_producers`: a cheap elementwise generic (a cast) read by several
  generics is copied per reader, so each copy fuses into its reader's loops.
* :func:`fuse_elementwise_chains`: an elementwise generic used only by an elementwise
  generic or a reduction (read without broadcast) is merged into it, so a chain is one op:
  the schedule then needs no per-producer fusion, whose cost grows with the whole function,
  and a reduction computes its inputs in registers (no temporary buffer per tile).

Ops are found by walking the entry function; matmul-like ops are never changed.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import arith, dialect, ir, linalg_native, linalg_ops
from stagegraph.mlir.build import reassociation_attr
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.x86.prepare_convolutions import (
    conv3d_to_conv2d_loops,
    conv_to_channels_last,
    depthwise_to_channels_last,
    grouped_conv_to_group_loops,
)

_BITWISE = frozenset({"arith.andi", "arith.ori", "arith.xori"})


def _is_contraction(op: Any) -> bool:
    return op.name != "linalg.generic" or bool(linalg_native.isa_contraction_op(op))


def _n_inputs(op: Any) -> int:
    return int(next(iter(op.attributes["operandSegmentSizes"])))


def _body(op: Any) -> Any:
    return op.regions[0].blocks[0]


def _yield(op: Any) -> Any:
    return children(op)[-1]


def _owner_op(value: Any) -> Any | None:
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


# ----------------------------------------------------------------------------- dead results


def _live_body_ops(op: Any, kept: list[int]) -> set[Any]:
    """Body ops the kept yield operands depend on (the body is a single block)."""
    live: set[Any] = set()
    work = [_yield(op).operands[k] for k in kept]
    while work:
        value = work.pop()
        owner = _owner_op(value)
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
    n_in = _n_inputs(op)
    args = list(_body(op).arguments)
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
    block = _body(op)
    block.append_to(new.regions[0])
    old_yield = _yield(new.operation)
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
        if op.name == "linalg.generic" and len(op.results) > 1 and not _is_contraction(op):
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


def _groups(shape: list[int]) -> list[list[int]] | None:
    """Reassociation of ``shape`` onto its non-unit dims (unit dims join a neighbour)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for d, size in enumerate(shape):
        pending.append(d)
        if size != 1:
            groups.append(pending)
            pending = []
    if not groups:
        return None
    groups[-1].extend(pending)
    return groups


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
        src_groups, out_groups = _groups(src_shape), _groups(out_shape)
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


def _is_bool_tensor(t: Any) -> bool:
    if not isinstance(t, ir.RankedTensorType):
        return False
    element = ir.RankedTensorType(t).element_type
    return isinstance(element, ir.IntegerType) and ir.IntegerType(element).width == 1


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
            if _is_bool_tensor(r.type):
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
        owner = _owner_op(v)
        if owner is None or owner.name not in ("tensor.empty", "linalg.generic", "linalg.fill"):
            return False
        if owner.name == "linalg.generic" and _is_contraction(owner):
            return False
        for use in v.uses:
            user = use.owner.operation
            if user.name == "linalg.fill" and use.operand_number == 1:
                continue
            if user.name != "linalg.generic" or _is_contraction(user):
                return False
    return True


def _narrow_arg(arg: Any, block: Any, i1: Any, i8: Any) -> None:
    arith = dialect("arith")
    uses = [(u.owner.operation, u.operand_number) for u in arg.uses]
    arg.set_type(i8)
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
        owner = _owner_op(v)
        shape = list(ir.RankedTensorType(v.type).shape)
        v.set_type(ir.RankedTensorType.get(shape, i8))
        index = ir.OpResult(v).result_number
        if owner.name == "linalg.generic":
            yield_op = _yield(owner)
            with ir.InsertionPoint(yield_op), yield_op.location:
                wide = arith.ExtUIOp(i8, yield_op.operands[index]).result
            yield_op.operands[index] = wide
            widened.append(wide)
        elif owner.name == "linalg.fill":
            with ir.InsertionPoint(owner), owner.location:
                owner.operands[0] = arith.ExtUIOp(i8, owner.operands[0]).result
            for arg in _body(owner).arguments:
                arg.set_type(i8)
    for user, number in uses:
        if user.name == "linalg.fill":
            continue  # its init: the fill's own result is in the class too
        block = _body(user)
        arg = block.arguments[number]
        if arg.type == i1:
            _narrow_arg(arg, block, i1, i8)
    for wide in widened:
        _fold_bitwise(wide, i8)


def _fold_bitwise(wide: Any, i8: Any) -> None:
    """``extui(op(trunci a, trunci b))`` with a bitwise ``op`` on i8 ``a``, ``b`` (0 or 1):
    ``op(a, b)`` on i8, so a reduction's body keeps a single combiner."""
    ext = _owner_op(wide)
    inner = _owner_op(ext.operands[0])
    if inner is None or inner.name not in _BITWISE:
        return
    sources, truncs = [], []
    for operand in inner.operands:
        trunc = _owner_op(operand)
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


# ----------------------------------------------------------------------------- elementwise chains


def _all_parallel(op: Any) -> bool:
    """Compares the whole attribute: reading its elements would import the linalg module
    (see ``analysis.ops.declared_iterator_types``)."""
    from stagegraph.mlir.build import iterator_types_attr

    declared = op.attributes["iterator_types"]
    parallel = iterator_types_attr(["parallel"] * len(ir.ArrayAttr(declared)), op.context)
    return declared == parallel


def _maps(op: Any) -> list[Any]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def _element_type(value_type: Any) -> Any:
    if isinstance(value_type, ir.ShapedType):
        return ir.ShapedType(value_type).element_type
    return value_type


def _plain_elementwise(op: Any) -> bool:
    """A single-result, all-parallel ``linalg.generic`` on ranked tensors whose body reads
    neither its init nor ``linalg.index`` (so it can be inlined anywhere with only its
    input arguments remapped)."""
    if op.name != "linalg.generic" or len(op.results) != 1 or _is_contraction(op):
        return False
    if not isinstance(op.results[0].type, ir.RankedTensorType) or not _all_parallel(op):
        return False
    if _is_bool_tensor(op.results[0].type):
        return False  # i1 vectors are bit-packed: the schedule leaves these alone
    block = _body(op)
    if list(block.arguments[_n_inputs(op)].uses):
        return False
    return all(inner.name != "linalg.index" for inner in children(op))


def _feeds_named_linalg(op: Any) -> bool:
    """Whether a result of ``op`` is an operand of a linalg op other than a plain generic
    (a matmul, a transpose, ...): such producers are left to that op's schedule."""
    for result in op.results:
        for use in result.uses:
            user = use.owner.operation
            if user.name.startswith("linalg.") and _is_contraction(user):
                return True
    return False


def _plain_reduction(op: Any) -> bool:
    """A single-result ``linalg.generic`` on ranked tensors with a reduction loop, whose body
    reads no ``linalg.index``, and not a contraction: a consumer whose elementwise producers
    can be inlined into its body like an elementwise consumer's."""
    if op.name != "linalg.generic" or len(op.results) != 1 or _is_contraction(op):
        return False
    if not isinstance(op.results[0].type, ir.RankedTensorType) or _all_parallel(op):
        return False
    if _is_bool_tensor(op.results[0].type):
        return False
    return all(inner.name != "linalg.index" for inner in children(op))


_MULTIPLIES = frozenset({"arith.mulf", "arith.muli"})


def _multiplies_inputs(producer: Any) -> bool:
    """Whether ``producer`` yields the product of two of its inputs (through casts at most):
    inlined into a sum, that is a contraction, which the generic schedule does not take."""
    value = _yield(producer).operands[0]
    owner = _owner_op(value)
    if owner is None or owner.name not in _MULTIPLIES:
        return False
    sources = []
    for operand in owner.operands:
        while (inner := _owner_op(operand)) is not None and len(inner.operands) == 1:
            operand = inner.operands[0]  # a cast or another unary op
        sources.append(operand)
    arguments = list(_body(producer).arguments)
    return all(v in arguments for v in sources) and sources[0] != sources[1]


def _fusable_operand(consumer: Any) -> int | None:
    """The first input of ``consumer`` made by an elementwise generic that only it uses, read
    without broadcast or reduction (each producer element computed once), else None. A
    product of two inputs is not inlined into a reduction (it would make a contraction)."""
    maps = _maps(consumer)
    reduction = not _all_parallel(consumer)
    for k in range(_n_inputs(consumer)):
        producer = _owner_op(consumer.operands[k])
        if producer is None or producer.parent != consumer.parent:
            continue
        if not _plain_elementwise(producer) or not maps[k].is_permutation:
            continue
        if reduction and _multiplies_inputs(producer):
            continue
        if _reading_slots(consumer, producer) is None:
            continue
        if not _maps(producer)[-1].is_permutation:
            continue
        return k
    return None


def _reading_slots(consumer: Any, producer: Any) -> list[int] | None:
    """The inputs of ``consumer`` that read ``producer``'s result, if ``consumer`` is its only
    reader and reads it through one map (``(x - m) * (x - m)`` reads ``x - m`` twice); else
    None."""
    slots = []
    for use in producer.results[0].uses:
        if use.owner.operation != consumer or use.operand_number >= _n_inputs(consumer):
            return None
        slots.append(use.operand_number)
    maps = _maps(consumer)
    return slots if all(maps[j] == maps[slots[0]] for j in slots) else None


def _fuse_producer(consumer: Any, k: int) -> Any:
    """Replace ``consumer`` and the producer of its input ``k`` by one generic computing
    both bodies per element; returns the new op."""
    producer = _owner_op(consumer.operands[k])
    # Other inputs reading the same result through the same map read the same element: they
    # become uses of input k's block argument, and are dropped.
    c_in = _n_inputs(consumer)
    c_args = list(_body(consumer).arguments)
    duplicates = [j for j in _reading_slots(consumer, producer) or [k] if j != k]
    for j in duplicates:
        c_args[j].replace_all_uses_with(c_args[k])
    keep = [j for j in range(len(c_args)) if j not in duplicates]
    c_maps, p_maps = _maps(consumer), _maps(producer)
    n_loops = c_maps[0].n_dims
    # Producer loop p_out.results[i] runs along the consumer's c_maps[k].results[i].
    to_consumer: list[Any] = [None] * p_maps[-1].n_dims
    for p_expr, c_expr in zip(p_maps[-1].results, c_maps[k].results, strict=True):
        to_consumer[ir.AffineDimExpr(p_expr).position] = c_expr
    remap = ir.AffineMap.get(n_loops, 0, to_consumer)
    p_in = _n_inputs(producer)
    p_inputs = list(producer.operands)[:p_in]
    c_operands = [consumer.operands[j] for j in keep]
    c_maps = [c_maps[j] for j in keep]
    c_args = [c_args[j] for j in keep]
    k, c_in = keep.index(k), c_in - len(duplicates)
    inputs = c_operands[:k] + p_inputs + c_operands[k + 1 : c_in]
    inits = c_operands[c_in:]
    p_in_maps = [
        ir.AffineMap.get(n_loops, 0, [e.compose(remap) for e in m.results]) for m in p_maps[:p_in]
    ]
    maps = c_maps[:k] + p_in_maps + c_maps[k + 1 :]
    with ir.InsertionPoint(consumer), consumer.location:
        fused = linalg_ops.GenericOp(
            [r.type for r in consumer.results],
            inputs,
            inits,
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            consumer.attributes["iterator_types"],
        )
    types = [_element_type(v.type) for v in inputs + inits]
    block = ir.Block.create_at_start(fused.regions[0], types, [consumer.location] * len(types))
    new_args = list(block.arguments)
    p_block, c_block = _body(producer), _body(consumer)
    for old, new in zip(list(p_block.arguments)[:p_in], new_args[k : k + p_in], strict=True):
        old.replace_all_uses_with(new)
    p_yield = _yield(producer)
    c_args[k].replace_all_uses_with(p_yield.operands[0])
    kept = c_args[:k] + c_args[k + 1 :]
    for old, new in zip(kept, new_args[:k] + new_args[k + p_in :], strict=True):
        old.replace_all_uses_with(new)
    into = ir.InsertionPoint(block)
    for body_op in [o.operation for o in p_block.operations][:-1]:
        body_op.detach_from_parent()
        into.insert(body_op)
    for body_op in [o.operation for o in c_block.operations]:
        body_op.detach_from_parent()
        into.insert(body_op)
    for old, new in zip(consumer.results, fused.results, strict=True):
        old.replace_all_uses_with(new)
    consumer.erase()
    producer.erase()
    return fused.operation


#: Body ops (besides the yield) of an elementwise generic cheap enough to recompute for
#: each consumer rather than store once and read back per consumer.
CHEAP_BODY_OPS = 2


def _cheap(op: Any) -> bool:
    body = [inner.name for inner in children(op)][:-1]
    return len(body) <= CHEAP_BODY_OPS and not any(n.startswith("math.") for n in body)


def duplicate_cheap_producers(fn: Any) -> int:
    """Give each consumer of a cheap elementwise generic (a cast, a negation, a scaling) its
    own copy; returns the number of copies made.

    PyTorch's decompositions widen an input once (``extf`` to f64 for a variance) and read
    it in two reductions: stored, the widened copy is written and read twice at twice the
    width; copied per consumer, each copy fuses into its consumer's loops. A consumer that
    reads the producer broadcast (it would recompute each element per copy), a matmul-like
    or other named op, and the function's return keep the original."""
    count = 0
    for op in top_level_ops(fn):
        if not _plain_elementwise(op) or not _cheap(op) or _feeds_named_linalg(op):
            continue
        reads: dict[Any, list[int]] = {}  # user -> operand numbers (a user may read it twice)
        for use in op.results[0].uses:
            reads.setdefault(use.owner.operation, []).append(use.operand_number)
        readers = [user for user, ks in reads.items() if _reads_elementwise(user, op, ks)]
        if len(reads) < 2 or not readers:
            continue
        for user in readers[1:] if len(readers) == len(reads) else readers:
            with ir.InsertionPoint(user):
                copy = op.clone()
            for k in reads[user]:
                user.operands[k] = copy.results[0]
            count += 1
    return count


def _reads_elementwise(user: Any, producer: Any, operands: list[int]) -> bool:
    """Whether ``user`` is a generic beside ``producer`` reading it only as inputs, each
    element once (a permutation map: no broadcast)."""
    if user.name != "linalg.generic" or user.parent != producer.parent:
        return False
    maps = _maps(user)
    return all(k < _n_inputs(user) and maps[k].is_permutation for k in operands)


def fuse_elementwise_chains(fn: Any) -> int:
    """Merge each elementwise ``linalg.generic`` into its only consumer when that consumer is
    an elementwise generic or a reduction reading it without broadcast; returns the number
    of merges.

    A recurrent model unrolls into thousands of tiny elementwise ops in chains; one generic
    per chain gives the schedule one sub-sequence per chain, with no producer to fuse into
    tile loops (``transform.structured.fuse_into_containing_op`` costs time proportional to
    the whole function per producer: quadratic overall). A reduction's producers (a
    widening to f64, a square) inlined into its body are computed in the registers the
    sum reads them from; fused into its row tiles instead, each tile's producer was
    vectorized on its own and stored to a temporary buffer, read back by the sum.
    Consumers feeding a matmul-like or other named linalg op are left alone (their
    schedule decides about producers).
    """
    count = 0
    for op in top_level_ops(fn):
        if not (_plain_elementwise(op) or _plain_reduction(op)) or _feeds_named_linalg(op):
            continue
        while (k := _fusable_operand(op)) is not None:
            op = _fuse_producer(op, k)
            count += 1
    return count


# ----------------------------------------------------------------------------- powers


def _float_constant(value: Any) -> float | None:
    owner = _owner_op(value)
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
    module: Any, fn: Any, fuse_elementwise: bool = True, conv_channels_last: bool = True
) -> bool:
    """All rewrites on the function ``fn`` of ``module``; whether anything changed.

    ``fuse_elementwise`` (the params' choice to fuse elementwise producers) also merges
    elementwise chains into single generics (:func:`fuse_elementwise_chains`).
    """
    del module
    changed = drop_dead_results(fn)
    changed += unit_transposes_to_reshapes(fn)
    changed += widen_bool_tensors(fn)
    changed += squares_to_multiplies(fn)
    if conv_channels_last:  # before the 3-D loops, so a 3-D convolution is transposed once
        changed += conv_to_channels_last(fn)
    changed += conv3d_to_conv2d_loops(fn)
    changed += grouped_conv_to_group_loops(fn)
    changed += depthwise_to_channels_last(fn)
    if fuse_elementwise:
        changed += duplicate_cheap_producers(fn)
        changed += fuse_elementwise_chains(fn)
    return bool(changed)
