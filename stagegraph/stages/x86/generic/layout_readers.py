"""The ops a channels-last transpose sinks past, other than generics (those:
:mod:`.layout_sinking`): each rewrite takes a reader of ``transpose(x, p)`` and rebuilds it
on ``x`` (padding, offsets, concatenation dim or pooling layout permuted), the transpose
moved after it; it returns the transposes it made (sunk next), or None where it cannot.

Also the helpers both modules use: building a transpose, rewiring a result's readers to
its transpose, and the permuted form of an init (a fresh ``tensor.empty`` or fill: no pass).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import dialect, ir
from stagegraph.mlir.build import named_structured_op, non_unit_groups
from stagegraph.mlir.walk import children
from stagegraph.stages.x86.generic.linalg_parts import result_owner
from stagegraph.stages.x86.generic.transpose_readers import _inv, _permutation

#: Pooling ops rebuilt channels-last, and their channels-last names.
_POOLINGS = {
    "linalg.pooling_nchw_max": "linalg.pooling_nhwc_max",
    "linalg.pooling_nchw_sum": "linalg.pooling_nhwc_sum",
}
#: NHWC -> NCHW: the only transpose a pooling takes in.
_TO_NCHW = [0, 3, 1, 2]


def static(value: Any) -> bool:
    """A ranked tensor of static shape: what every rewrite here needs."""
    kind = value.type
    return isinstance(kind, ir.RankedTensorType) and ir.RankedTensorType(kind).has_static_shape


def shape_of(value: Any) -> list[int]:
    """The static shape of a ranked tensor value."""
    return list(ir.RankedTensorType(value.type).shape)


def _new_transpose(source: Any, permutation: list[int]) -> Any:
    """``linalg.transpose`` of ``source`` (result dim k = source dim ``permutation[k]``) at
    the insertion point; the op."""
    shape = shape_of(source)
    element = ir.RankedTensorType(source.type).element_type
    empty = dialect("tensor").EmptyOp([shape[p] for p in permutation], element).result
    attributes = {"permutation": ir.DenseI64ArrayAttr.get(permutation)}
    return result_owner(named_structured_op("linalg.transpose", [source], [empty], attributes))


def transposed_back(op: Any, result: Any, permutation: list[int]) -> Any | None:
    """Rewire every reader of ``op``'s old ``result`` (now holding the permuted layout) to
    a transpose of it by ``permutation``, placed after ``op``; the transpose, or None when
    the permutation is the identity."""
    if permutation == sorted(permutation):
        return None
    uses = [(use.owner.operation, use.operand_number) for use in result.uses]
    with ir.InsertionPoint.after(op), op.location:
        back = _new_transpose(result, permutation)
    for user, number in uses:
        user.operands[number] = back.results[0]
    return back


def _replace_by_transposed(reader: Any, source: Any, permutation: list[int]) -> list[Any]:
    """Replace ``reader``'s single result by ``transpose(source, permutation)`` (or by
    ``source`` when the permutation is the identity); the transposes made."""
    if permutation == sorted(permutation):
        reader.results[0].replace_all_uses_with(source)
        return []
    with ir.InsertionPoint(reader), reader.location:
        back = _new_transpose(source, permutation)
    reader.results[0].replace_all_uses_with(back.results[0])
    return [back]


def _through_transpose(reader: Any, transpose: Any) -> list[Any] | None:
    """``transpose(transpose(x, p), q)`` -> ``transpose(x, p o q)``, or ``x``."""
    p, q = _permutation(transpose), _permutation(reader)
    return _replace_by_transposed(reader, transpose.operands[0], [p[k] for k in q])


def _through_pad(reader: Any, transpose: Any) -> list[Any] | None:
    """``pad(transpose(x, p))`` -> ``transpose(pad'(x), p)``, the padding permuted."""
    if len(reader.operands) != 1 or not static(reader.results[0]):
        return None
    body = children(reader)
    if len(body) != 1 or len(body[0].operands) != 1:
        return None
    padding = body[0].operands[0]
    if isinstance(padding, ir.BlockArgument) or result_owner(padding) is None:
        return None
    if result_owner(padding).parent == reader:
        return None  # computed inside the body
    p = _permutation(transpose)
    inverse = _inv(p)
    low = list(ir.DenseI64ArrayAttr(reader.attributes["static_low"]))
    high = list(ir.DenseI64ArrayAttr(reader.attributes["static_high"]))
    low, high = [low[k] for k in inverse], [high[k] for k in inverse]
    source = transpose.operands[0]
    shape = [size + lo + hi for size, lo, hi in zip(shape_of(source), low, high, strict=True)]
    with ir.InsertionPoint(reader), reader.location:
        padded = _pad(source, shape, low, high, padding)
    return _replace_by_transposed(reader, padded, p)


def _pad(source: Any, shape: list[int], low: list[int], high: list[int], padding: Any) -> Any:
    """``tensor.pad`` of ``source`` to ``shape`` with the constant ``padding``."""
    element = ir.RankedTensorType(source.type).element_type
    op = ir.Operation.create(
        "tensor.pad",
        results=[ir.RankedTensorType.get(shape, element)],
        operands=[source],
        attributes={
            "static_low": ir.DenseI64ArrayAttr.get(low),
            "static_high": ir.DenseI64ArrayAttr.get(high),
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 0, 0]),
        },
        regions=1,
    )
    block = op.regions[0].blocks.append(*[ir.IndexType.get()] * len(shape))
    with ir.InsertionPoint(block):
        ir.Operation.create("tensor.yield", operands=[padding])
    return op.results[0]


def _through_slice(reader: Any, transpose: Any) -> list[Any] | None:
    """``slice(transpose(x, p))`` -> ``transpose(slice'(x), p)`` (static, rank kept)."""
    attributes = ("static_offsets", "static_sizes", "static_strides")
    if len(reader.operands) != 1:
        return None
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(reader.attributes[a])) for a in attributes)
    if len(shape_of(reader.results[0])) != len(sizes):
        return None  # rank-reducing
    p = _permutation(transpose)
    inverse = _inv(p)
    offsets, sizes, strides = ([values[k] for k in inverse] for values in (offsets, sizes, strides))
    element = ir.RankedTensorType(reader.results[0].type).element_type
    with ir.InsertionPoint(reader), reader.location:
        sliced = dialect("tensor").ExtractSliceOp(
            ir.RankedTensorType.get(sizes, element), transpose.operands[0], [], [], [],
            offsets, sizes, strides,
        ).result  # fmt: skip
    return _replace_by_transposed(reader, sliced, p)


def _through_unit_reshape(reader: Any, transpose: Any) -> list[Any] | None:
    """``reshape(transpose(x, p))`` where the reshape only adds or drops unit dims ->
    ``transpose(reshape'(x), p')``: ``x`` reshaped to the result's unit dims, in place."""
    value, result = reader.operands[0], reader.results[0]
    source = transpose.operands[0]
    wide = [d for d, size in enumerate(shape_of(value)) if size != 1]
    kept = [d for d, size in enumerate(shape_of(result)) if size != 1]
    if [shape_of(value)[d] for d in wide] != [shape_of(result)[d] for d in kept]:
        return None  # merges or splits dims
    # Source dims that are not unit, in source order, and the order the transpose reads
    # them in: reader dim kept[t] holds source's non-unit dim order[t].
    p = _permutation(transpose)
    source_wide = [d for d, size in enumerate(shape_of(source)) if size != 1]
    order = [source_wide.index(p[d]) for d in wide]
    # The reshaped source: the result's unit dims where the result has them, the source's
    # non-unit dims in source order at the result's other positions.
    shape = list(shape_of(result))
    permutation = list(range(len(shape)))
    for i, position in enumerate(kept):
        shape[position] = shape_of(source)[source_wide[i]]
    for t, position in enumerate(kept):
        permutation[position] = kept[order[t]]
    with ir.InsertionPoint(reader), reader.location:
        reshaped = _unit_reshape(source, shape)
    return _replace_by_transposed(reader, reshaped, permutation)


def _unit_reshape(value: Any, shape: list[int]) -> Any:
    """``value`` reshaped to ``shape`` (the same non-unit dims in the same order): collapse
    to its non-unit dims, then expand to ``shape``."""
    from stagegraph.mlir.build import collapse_shape, expand_shape

    current = shape_of(value)
    if current == shape:
        return value
    flat = [size for size in current if size != 1]
    if len(flat) != len(current):
        value = collapse_shape(value, _groups(current), flat)
    if len(flat) != len(shape):
        value = expand_shape(value, _groups(shape), shape)
    return value


def _groups(shape: list[int]) -> list[list[int]]:
    """:func:`~stagegraph.mlir.build.non_unit_groups`, an all-unit shape as one group."""
    return non_unit_groups(shape) or ([list(range(len(shape)))] if shape else [])


def _through_pooling(reader: Any, transpose: Any) -> list[Any] | None:
    """``pool_nchw(transpose(x, NHWC->NCHW))`` -> ``transpose(pool_nhwc(x), ...)``."""
    if _permutation(transpose) != _TO_NCHW or reader.operands[0] != transpose.results[0]:
        return None
    window, init = reader.operands[1], reader.operands[2]
    attributes = {k: reader.attributes[k] for k in ("strides", "dilations")}
    with ir.InsertionPoint(reader), reader.location:
        init_last = permuted_init(init, _inv(_TO_NCHW))
        pooled = named_structured_op(
            _POOLINGS[reader.name], [transpose.operands[0], window], [init_last], attributes
        )
    return _replace_by_transposed(reader, pooled, _TO_NCHW)


def permuted_init(init: Any, permutation: list[int]) -> Any:
    """``transpose(init, permutation)`` built at the insertion point: a fresh
    ``tensor.empty`` or the same ``linalg.fill`` of one where ``init`` is either (no pass)."""
    if not fresh(init):
        return _new_transpose(init, permutation).results[0]
    shape = shape_of(init)
    element = ir.RankedTensorType(init.type).element_type
    empty = dialect("tensor").EmptyOp([shape[p] for p in permutation], element).result
    owner = result_owner(init)
    if owner.name == "tensor.empty":
        return empty
    return named_structured_op("linalg.fill", [owner.operands[0]], [empty])


def fresh(value: Any) -> bool:
    """A static ``tensor.empty`` or a ``linalg.fill`` of one: any layout costs the same."""
    owner = result_owner(value)
    if owner is None or not static(value):
        return False
    if owner.name == "linalg.fill":
        owner = result_owner(owner.operands[1])
    return owner is not None and owner.name == "tensor.empty"


def _through_concat(reader: Any, transpose: Any) -> list[Any] | None:
    """``concat(transpose(x1, p), ..., transpose(xn, p))`` -> ``transpose(concat'(x1, ...,
    xn), p)`` along the permuted dim, once every operand is such a transpose (a U-Net's
    upsampled and skipped tensors; the last of them to arrive takes the concatenation)."""
    p = _permutation(transpose)
    sources = []
    for operand in reader.operands:
        owner = result_owner(operand)
        if owner is None or owner.name != "linalg.transpose" or _permutation(owner) != p:
            return None
        if not static(owner.operands[0]):
            return None
        sources.append(owner.operands[0])
    dim = p[ir.IntegerAttr(reader.attributes["dim"]).value]
    shape = list(shape_of(sources[0]))
    shape[dim] = sum(shape_of(source)[dim] for source in sources)
    element = ir.RankedTensorType(sources[0].type).element_type
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint(reader), reader.location:
        joined = ir.Operation.create(
            "tensor.concat",
            results=[ir.RankedTensorType.get(shape, element)],
            operands=sources,
            attributes={"dim": ir.IntegerAttr.get(i64, dim)},
        ).result
    return _replace_by_transposed(reader, joined, p)


def _through_insert(reader: Any, transpose: Any) -> list[Any] | None:
    """``insert(transpose(x, p) into d)`` with ``d`` fresh (a fill: the zeros a strided
    transposed convolution's input is spread over) -> ``transpose(insert'(x into d'), p)``.
    A rank-reducing insertion first reads its source expanded to the slice's rank (the
    transpose then sinks through that expansion, and comes back here)."""
    attributes = ("static_offsets", "static_sizes", "static_strides")
    if len(reader.operands) != 2 or reader.operands[0] != transpose.results[0]:
        return None
    dest = reader.operands[1]
    if not fresh(dest):
        return None
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(reader.attributes[a])) for a in attributes)
    value = transpose.results[0]
    if len(shape_of(value)) != len(sizes):
        if [n for n in shape_of(value) if n != 1] != [n for n in sizes if n != 1]:
            return None
        with ir.InsertionPoint(reader), reader.location:
            reader.operands[0] = _unit_reshape(value, sizes)
        return [transpose]  # read again, through the expansion
    p = _permutation(transpose)
    inverse = _inv(p)
    offsets, sizes, strides = ([values[k] for k in inverse] for values in (offsets, sizes, strides))
    with ir.InsertionPoint(reader), reader.location:
        into = permuted_init(dest, inverse)
        inserted = (
            dialect("tensor")
            .InsertSliceOp(transpose.operands[0], into, [], [], [], offsets, sizes, strides)
            .result
        )
    return _replace_by_transposed(reader, inserted, p)


#: The rewrite of each reader op kind but ``linalg.generic``.
READERS: dict[str, Any] = {
    "tensor.insert_slice": _through_insert,
    "tensor.concat": _through_concat,
    "linalg.transpose": _through_transpose,
    "tensor.pad": _through_pad,
    "tensor.extract_slice": _through_slice,
    "tensor.collapse_shape": _through_unit_reshape,
    "tensor.expand_shape": _through_unit_reshape,
    **dict.fromkeys(_POOLINGS, _through_pooling),
}
