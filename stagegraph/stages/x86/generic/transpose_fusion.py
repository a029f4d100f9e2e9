"""Transposes around channels-last convolutions that need no pass of their own.

The generic schedule runs an NCHW convolution channels-last, between transposes
(:func:`stagegraph.stages.x86.conv.rewrites.conv_to_channels_last`): of the image, of the
filter, of the init, and of the result back. As named ``linalg.transpose`` ops each is a
loop nest over the whole tensor, a pass over memory, even where its neighbours are
elementwise ops that stream the same tensor anyway. Here, before elementwise chains are
merged (:mod:`.elementwise_fusion`):

* a transpose of a constant (the filter of a model's convolution) becomes the transposed
  constant, computed at compile time (:mod:`stagegraph.stages.common.constant_eval`): no
  pass at all;
* a transpose whose input is an elementwise generic that only it reads (the broadcast of a
  bias into the init), or whose result only an elementwise generic reads (the activation,
  residual add or BatchNorm after the convolution), becomes the equivalent
  ``linalg.generic``, which the chain merge folds into its neighbour: the bias is broadcast
  straight into the channels-last init, and the result is transposed back inside the
  epilogue's loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stagegraph.mlir.bindings import arith, ir
from stagegraph.mlir.build import clone_mapped, collapse_shape, generic
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.common.constant_eval import ConstantValues, NotConstantError
from stagegraph.stages.x86.generic.elementwise_fusion import _plain_elementwise
from stagegraph.stages.x86.generic.linalg_parts import body_block, input_count, result_owner

_RESHAPES = frozenset({"tensor.expand_shape", "tensor.collapse_shape"})

#: Constants larger than this (elements) are not transposed at compile time (a 512 MiB
#: embedding is better transposed by the loop than copied through numpy).
MAX_CONSTANT_ELEMENTS = 1 << 26


def _permutation(op: Any) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))


def fold_constant_transposes(fn: Any) -> int:
    """Replace each top-level ``linalg.transpose`` of a constant in ``fn`` by the transposed
    constant; returns how many."""
    values = ConstantValues(fn)  # its context is all the constant probe needs
    found = []
    for op in top_level_ops(fn):
        if op.name != "linalg.transpose":
            continue
        shape = ir.RankedTensorType(op.results[0].type)
        if not shape.has_static_shape or np.prod(shape.shape) > MAX_CONSTANT_ELEMENTS:
            continue
        if not isinstance(shape.element_type, ir.F32Type | ir.F64Type):
            continue  # bf16 comes back from the probe as raw 16-bit integers
        if not _stored_constant(op.operands[0]):
            continue  # a computed tensor (a broadcast bias): stored, it would cost a pass
        leaves = values.leaves(op.operands[0])
        if leaves:
            found.append((op, leaves))
    if not found:
        return 0
    try:
        values.load([leaf for _, leaves in found for leaf in leaves])
    except NotConstantError:
        return 0
    folded = 0
    for op, _ in found:
        try:
            array = np.ascontiguousarray(np.transpose(values.value(op.operands[0]),
                                                      _permutation(op)))  # fmt: skip
        except (NotConstantError, ValueError):
            continue
        with ir.InsertionPoint(op), op.location:
            constant = arith.ConstantOp(op.results[0].type, ir.DenseElementsAttr.get(array))
        op.results[0].replace_all_uses_with(constant.result)
        source = op.operands[0]
        op.erase()
        _erase_if_unused(source)
        folded += 1
    return folded


def merge_transposes_into_elementwise(fn: Any) -> int:
    """Merge each top-level ``linalg.transpose`` of ``fn`` into the elementwise generic that
    alone reads its result (through unit-dim reshapes: the epilogue after a channels-last
    convolution) or alone feeds it (the bias broadcast into its init); returns how many."""
    merged = 0
    for op in top_level_ops(fn):
        if op.name != "linalg.transpose" or len(op.results) != 1:
            continue
        if _merge_into_reader(op) or _merge_producer(op):
            merged += 1
    return merged


def _inverse(permutation: list[int]) -> list[int]:
    inverse = [0] * len(permutation)
    for position, dim in enumerate(permutation):
        inverse[dim] = position
    return inverse


def _shape(value: Any) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _non_unit(shape: list[int]) -> list[int]:
    """Positions of the dims of ``shape`` that are not 1."""
    return [d for d, size in enumerate(shape) if size != 1]


def _unit_reshapes_down(value: Any) -> tuple[Any, list[Any]] | None:
    """Follow single-use unit-dim reshapes from ``value`` to the one op that reads the last;
    returns (the value that op reads, the reshapes), or None if some use is shared."""
    chain = []
    while True:
        uses = list(value.uses)
        if len(uses) != 1:
            return None
        user = uses[0].owner.operation
        if user.name not in _RESHAPES or not _same_non_unit(value, user.results[0]):
            return value, chain
        chain.append(user)
        value = user.results[0]


def _same_non_unit(a: Any, b: Any) -> bool:
    """Whether a reshape from ``a`` to ``b`` only adds or drops unit dims."""
    sa, sb = _shape(a), _shape(b)
    return [sa[d] for d in _non_unit(sa)] == [sb[d] for d in _non_unit(sb)]


def _merge_into_reader(op: Any) -> bool:
    """``E(reshape(transpose(r)))`` -> ``E`` reading ``r`` through the composed map."""
    followed = _unit_reshapes_down(op.results[0])
    if followed is None:
        return False
    read, reshapes = followed
    reader = next(iter(read.uses)).owner.operation
    if not _plain_elementwise(reader) or reader.parent != op.parent:
        return False
    maps = [ir.AffineMapAttr(a).value for a in reader.attributes["indexing_maps"]]
    slots = [k for k, operand in enumerate(reader.operands) if operand == read]
    mapping = maps[slots[0]]
    if len(slots) != 1 or not all(isinstance(e, ir.AffineDimExpr) for e in mapping.results):
        return False
    source, transposed = op.operands[0], op.results[0]
    inverse = _inverse(_permutation(op))
    t_non_unit, u_non_unit = _non_unit(_shape(transposed)), _non_unit(_shape(read))
    # The source without its unit dims (a free reshape): the read is then a permutation,
    # which the elementwise chain merge composes.
    kept = [dim for dim in range(len(inverse)) if inverse[dim] in t_non_unit]
    exprs = [mapping.results[u_non_unit[t_non_unit.index(inverse[dim])]] for dim in kept]
    maps[slots[0]] = ir.AffineMap.get(mapping.n_dims, 0, exprs)
    if len(kept) != len(inverse):
        with ir.InsertionPoint(op), op.location:
            source = _drop_unit_dims(source, kept)
    reader.operands[slots[0]] = source
    reader.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])
    for reshape in reversed(reshapes):
        reshape.erase()
    op.erase()
    return True


def _drop_unit_dims(value: Any, kept: list[int]) -> Any:
    """``value`` collapsed to its dims ``kept`` (every other one is a unit dim)."""
    rank = len(_shape(value))
    groups: list[list[int]] = [[] for _ in kept]
    for dim in range(rank):
        # a unit dim joins the next kept dim (the last kept one when none follows)
        later = [i for i, k in enumerate(kept) if k >= dim]
        groups[later[0] if later else len(kept) - 1].append(dim)
    return collapse_shape(value, groups, [_shape(value)[k] for k in kept])


def _merge_producer(op: Any) -> bool:
    """``transpose(reshape(G(...)))`` -> one generic computing ``G``'s body straight into
    the transposed shape (``G`` elementwise, read by nothing else)."""
    value, reshapes = op.operands[0], []
    while (owner := result_owner(value)) is not None and owner.name in _RESHAPES:
        if len(list(value.uses)) != 1 or not _same_non_unit(owner.operands[0], value):
            return False
        reshapes.append(owner)
        value = owner.operands[0]
    producer = result_owner(value)
    if producer is None or not _plain_elementwise(producer) or len(list(value.uses)) != 1:
        return False
    if any(inner.regions for inner in children(producer)):
        return False
    maps = [ir.AffineMapAttr(a).value for a in producer.attributes["indexing_maps"]]
    if maps[-1] != ir.AffineMap.get_identity(maps[-1].n_dims):
        return False
    transposed = op.results[0]
    rank = len(_shape(transposed))
    inverse = _inverse(_permutation(op))
    before = op.operands[0]  # the transpose's input, G's result reshaped
    g_non_unit, b_non_unit = _non_unit(_shape(value)), _non_unit(_shape(before))
    # G's loop dim j, as an expression of the transposed space's loops.
    loops = []
    for j in range(maps[-1].n_dims):
        if j not in g_non_unit:
            loops.append(ir.AffineConstantExpr.get(0))
        else:
            b_dim = b_non_unit[g_non_unit.index(j)]
            loops.append(ir.AffineDimExpr.get(inverse[b_dim]))
    inputs = input_count(producer)
    new_maps = []
    for mapping in maps[:inputs]:
        exprs = []
        for expr in mapping.results:
            if isinstance(expr, ir.AffineDimExpr):
                exprs.append(loops[expr.position])
            elif isinstance(expr, ir.AffineConstantExpr):
                exprs.append(expr)
            else:
                return False
        new_maps.append(ir.AffineMap.get(rank, 0, exprs))
    new_maps.append(ir.AffineMap.get_identity(rank))
    with ir.InsertionPoint(op), op.location:
        merged = generic(list(producer.operands)[:inputs], [op.operands[1]], new_maps,
                         ["parallel"] * rank, _cloned_body(producer))  # fmt: skip
    op.results[0].replace_all_uses_with(merged)
    op.erase()
    for reshape in reshapes:
        reshape.erase()
    producer.erase()
    return True


def _cloned_body(producer: Any) -> Any:
    """A body builder for :func:`generic` that clones ``producer``'s body ops (none with
    regions), its block arguments mapped to the new ones."""
    block = body_block(producer)
    ops = children(producer)

    def build(*arguments: Any) -> list[Any]:
        mapping = dict(zip(block.arguments, arguments, strict=True))
        for inner in ops[:-1]:
            clone_mapped(inner, mapping)
        return [mapping.get(v, v) for v in ops[-1].operands]

    return build


def _stored_constant(value: Any) -> bool:
    """An ``arith.constant``, perhaps reshaped: as large as its transpose anyway."""
    owner = result_owner(value)
    while owner is not None and owner.name in _RESHAPES:
        owner = result_owner(owner.operands[0])
    return owner is not None and owner.name == "arith.constant"


def _erase_if_unused(value: Any) -> None:
    owner = result_owner(value)
    if owner is not None and owner.name == "arith.constant" and not list(value.uses):
        owner.erase()


def transposes_before_padding(fn: Any) -> int:
    """Rewrite each top-level ``transpose(pad(x))`` or ``transpose(expand_shape(pad(x)))``
    of ``fn`` (the input of a channels-last convolution, padded in NCHW) as the transposed
    ``x`` inserted into a filled tensor of the padded, transposed shape; returns how many.

    Transposed before it is padded, ``x`` merges into its producer when that is an
    elementwise generic read by nothing else (:func:`merge_transposes_into_elementwise`),
    and inserted rather than padded it is written in place into the padded buffer (the
    bufferization pipeline runs ``eliminate-empty-tensors``): of the pad's fill, copy and
    transpose, only the fill remains a pass of its own."""
    rewritten = 0
    for op in top_level_ops(fn):
        if op.name == "linalg.transpose" and _pad_after_transpose(op):
            rewritten += 1
    return rewritten


def _pad_after_transpose(op: Any) -> bool:
    # the pad read through an expand_shape (a grouped convolution's channels split), or
    # directly (a plain 2-D convolution's padding)
    expand = result_owner(op.operands[0])
    if expand is not None and expand.name == "tensor.pad":
        expand, pad = None, expand
    elif expand is None or expand.name != "tensor.expand_shape":
        return False
    else:
        pad = result_owner(expand.operands[0])
    if pad is None or pad.name != "tensor.pad" or len(pad.operands) != 1:
        return False
    if len(list(pad.results[0].uses)) != 1 or (
        expand is not None and len(list(expand.results[0].uses)) != 1
    ):
        return False
    value = _pad_value(pad)
    if value is None:
        return False
    low = list(ir.DenseI64ArrayAttr(pad.attributes["static_low"]))
    high = list(ir.DenseI64ArrayAttr(pad.attributes["static_high"]))
    if expand is None:
        groups = [[d] for d in range(len(low))]
    else:
        groups = [[int(ir.IntegerAttr(d).value) for d in ir.ArrayAttr(g)]
                  for g in ir.ArrayAttr(expand.attributes["reassociation"])]  # fmt: skip
    padded_shape = _shape((expand or pad).results[0])
    source = pad.operands[0]
    source_shape = _shape(source)
    expanded_shape = list(padded_shape)
    low_e, high_e = [0] * len(padded_shape), [0] * len(padded_shape)
    for k, group in enumerate(groups):
        wide = [d for d in group if padded_shape[d] != 1]
        if low[k] == 0 and high[k] == 0:
            continue
        if len(wide) != 1:
            return False
        low_e[wide[0]], high_e[wide[0]] = low[k], high[k]
        expanded_shape[wide[0]] = source_shape[k]
    permutation = _permutation(op)
    low_t = [low_e[p] for p in permutation]
    shape_t = [expanded_shape[p] for p in permutation]
    with ir.InsertionPoint(op), op.location:
        from stagegraph.mlir.bindings import dialect, linalg_native  # noqa: F401
        from stagegraph.mlir.build import expand_shape, named_structured_op

        tensor = dialect("tensor")
        element = ir.RankedTensorType(op.results[0].type).element_type
        result_type = ir.RankedTensorType(op.results[0].type)
        # The fill first: the transposed value's init must come after it for the
        # bufferization to write that value in place (eliminate-empty-tensors).
        full = tensor.EmptyOp(result_type.shape, element).result
        filled = named_structured_op("linalg.fill", [value], [full])
        unpadded = source if expand is None else expand_shape(source, groups, expanded_shape)
        empty = tensor.EmptyOp(shape_t, element).result
        transposed = named_structured_op("linalg.transpose", [unpadded], [empty],
                                         {"permutation": op.attributes["permutation"]})  # fmt: skip
        inserted = tensor.InsertSliceOp(transposed, filled, [], [], [], low_t, shape_t,
                                        [1] * len(shape_t)).result  # fmt: skip
    op.results[0].replace_all_uses_with(inserted)
    op.erase()
    if expand is not None:
        expand.erase()
    pad.erase()
    return True


def _pad_value(pad: Any) -> Any | None:
    """The constant a ``tensor.pad`` pads with (its body yields a value defined outside),
    else None."""
    body = children(pad)
    if len(body) != 1 or len(body[0].operands) != 1:
        return None
    value = body[0].operands[0]
    owner = result_owner(value)
    return value if owner is not None and owner.name == "arith.constant" else None


def pads_as_filled_inserts(fn: Any) -> int:
    """Rewrite each top-level ``tensor.pad`` of ``fn`` with static sizes and a constant
    value as its source inserted into a filled tensor, the fill placed before the source's
    producer; returns how many. A pad bufferizes to a fill and a copy of its source; as an
    insertion, a producer that writes a fresh tensor (a pooling's input made by an
    activation) writes straight into the padded buffer instead (``eliminate-empty-tensors``
    in the bufferization pipeline), and the copy is gone."""
    from stagegraph.mlir.bindings import dialect
    from stagegraph.mlir.build import named_structured_op

    tensor = dialect("tensor")
    rewritten = 0
    for op in top_level_ops(fn):
        if op.name != "tensor.pad" or len(op.operands) != 1:
            continue
        value = _pad_value(op)
        result = ir.RankedTensorType(op.results[0].type)
        source = op.operands[0]
        if value is None or not result.has_static_shape:
            continue
        producer = result_owner(source)
        anchor = producer if producer is not None and producer.parent == op.parent else op
        low = list(ir.DenseI64ArrayAttr(op.attributes["static_low"]))
        with ir.InsertionPoint(anchor), op.location:
            full = tensor.EmptyOp(result.shape, result.element_type).result
            filled = named_structured_op("linalg.fill", [value], [full])
        shape = _shape(source)
        with ir.InsertionPoint(op), op.location:
            inserted = tensor.InsertSliceOp(source, filled, [], [], [], low, shape,
                                            [1] * len(shape)).result  # fmt: skip
        op.results[0].replace_all_uses_with(inserted)
        op.erase()
        rewritten += 1
    return rewritten
