"""Channels-last carried through a model's chain of convolutions: transposes sunk past the
ops between two convolutions until they meet the next convolution's and cancel.

The generic schedule runs each NCHW convolution channels-last between transposes
(:func:`stagegraph.stages.x86.conv.rewrites.conv_to_channels_last`): its result goes back
to NCHW, the BatchNorm, activation and padding after it run on NCHW, and the next
convolution transposes the padded tensor to channels-last again. Two passes over memory
per convolution that no later fusion removes. Here each transpose that leaves a
channels-last convolution (or pooling) moves past its readers instead:

* a ``linalg.generic`` reads the transpose's source through the composed map; where it
  then reads that source through a permutation of all its loops, its loops are renumbered
  so that the read is the identity (channels innermost: contiguous vectors), and each
  result whose map the renumbering leaves out of order is written in the loops' order and
  transposed back after the op (a new transpose, sunk in turn);
* a transpose of the transpose composes with it (the next convolution's input transpose:
  the identity, so both go);
* ``tensor.pad``, leading or any static ``tensor.extract_slice``, reshapes that only add
  or drop unit dims, and ``linalg.pooling_nchw_{max,sum}`` are rebuilt on the source
  (padding, offsets, pooling layout permuted), the transpose moved after them.

Readers that take none of these (a function result, a matmul, a concatenation, a reshape
that merges dims) keep reading the transpose, which stays where it is: converted where a
consumer needs NCHW. Nothing here reads printed IR: ops, maps and permutations are read
through the bindings.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import dialect, ir
from stagegraph.mlir.build import iterator_types_attr, named_structured_op
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.analysis.ops import declared_iterator_types
from stagegraph.stages.x86.generic.linalg_parts import input_count, result_owner
from stagegraph.stages.x86.generic.transpose_readers import _dims, _inv, _maps, _permutation

#: Pooling ops rebuilt channels-last, and their channels-last names.
_POOLINGS = {
    "linalg.pooling_nchw_max": "linalg.pooling_nhwc_max",
    "linalg.pooling_nchw_sum": "linalg.pooling_nhwc_sum",
}
#: NHWC -> NCHW: the only transpose a pooling takes in.
_TO_NCHW = [0, 3, 1, 2]


def count_transposes(fn: Any) -> int:
    """The top-level ``linalg.transpose`` ops of ``fn`` (a pass over memory each, unless a
    later rewrite merges one into a neighbour)."""
    return sum(op.name == "linalg.transpose" for op in top_level_ops(fn))


def sink_channels_last_transposes(fn: Any) -> int:
    """Sink every transpose of ``fn`` that leaves a convolution or pooling (and those the
    sinking makes) past the readers that can take the source instead; returns how many
    transposes moved or were removed."""
    moved = _fold_filled_transposes(fn)
    work = [op for op in top_level_ops(fn) if _leaves_window_op(op)]
    erased: set[Any] = set()
    while work:
        op = work.pop(0)
        if op in erased:
            continue
        made = _sink(op, erased)
        if made is not None:
            moved += 1
            work.extend(made)
    for op in reversed(top_level_ops(fn)):  # the other operands' of a concatenation
        if op.name == "linalg.transpose" and _unused(op):
            op.erase()
    return moved


def _fold_filled_transposes(fn: Any) -> int:
    """Replace each transpose of a ``tensor.empty`` or of a ``linalg.fill`` of one (a
    convolution's zero init, channels-last) by the empty or fill of the transposed shape;
    returns how many."""
    folded = 0
    for op in top_level_ops(fn):
        if op.name != "linalg.transpose" or len(op.results) != 1:
            continue
        if not _fresh(op.operands[0]):
            continue
        with ir.InsertionPoint(op), op.location:
            permuted = _permuted_init(op.operands[0], _permutation(op))
        op.results[0].replace_all_uses_with(permuted)
        op.erase()
        folded += 1
    return folded


def _leaves_window_op(op: Any) -> bool:
    if op.name != "linalg.transpose" or len(op.results) != 1:
        return False
    owner = result_owner(op.operands[0])
    return owner is not None and ("conv" in owner.name or "pooling" in owner.name)


def _static(value: Any) -> bool:
    kind = value.type
    return isinstance(kind, ir.RankedTensorType) and ir.RankedTensorType(kind).has_static_shape


def _shape(value: Any) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


# ----------------------------------------------------------------------------- one transpose


def _sink(transpose: Any, erased: set[Any]) -> list[Any] | None:
    """Move ``transpose`` past each reader that can read its source; the transposes this
    made (to sink next), or None where no reader could. The transpose itself goes once
    nothing reads it any more."""
    if not _static(transpose.operands[0]):
        return None
    value = transpose.results[0]
    readers = list(dict.fromkeys(use.owner.operation for use in value.uses))
    made: list[Any] = []
    took = False
    for reader in readers:
        rewrite = _REWRITES.get(reader.name)
        if rewrite is None or reader.parent != transpose.parent:
            continue
        if _unused(reader):  # dead: every op rewritten here is pure on tensors
            erased.add(reader)
            reader.erase()
            took = True
            continue
        result = rewrite(reader, transpose)
        if result is None:
            continue
        took = True
        made.extend(result)
        if not reader.attached or _unused(reader):
            erased.add(reader)
            if reader.attached:
                reader.erase()
    if not took:
        return None
    if not list(value.uses):
        erased.add(transpose)
        transpose.erase()
    return made


def _unused(op: Any) -> bool:
    return all(not list(r.uses) for r in op.results)


def _new_transpose(source: Any, permutation: list[int]) -> Any:
    """``linalg.transpose`` of ``source`` (result dim k = source dim ``permutation[k]``) at
    the insertion point; the op."""
    shape = _shape(source)
    element = ir.RankedTensorType(source.type).element_type
    empty = dialect("tensor").EmptyOp([shape[p] for p in permutation], element).result
    attributes = {"permutation": ir.DenseI64ArrayAttr.get(permutation)}
    return result_owner(named_structured_op("linalg.transpose", [source], [empty], attributes))


def _transposed_back(op: Any, result: Any, permutation: list[int]) -> Any | None:
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


# ----------------------------------------------------------------------------- readers


def _through_transpose(reader: Any, transpose: Any) -> list[Any] | None:
    """``transpose(transpose(x, p), q)`` -> ``transpose(x, p o q)``, or ``x``."""
    p, q = _permutation(transpose), _permutation(reader)
    return _replace_by_transposed(reader, transpose.operands[0], [p[k] for k in q])


def _through_pad(reader: Any, transpose: Any) -> list[Any] | None:
    """``pad(transpose(x, p))`` -> ``transpose(pad'(x), p)``, the padding permuted."""
    if len(reader.operands) != 1 or not _static(reader.results[0]):
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
    shape = [size + lo + hi for size, lo, hi in zip(_shape(source), low, high, strict=True)]
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
    if len(_shape(reader.results[0])) != len(sizes):
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
    wide = [d for d, size in enumerate(_shape(value)) if size != 1]
    kept = [d for d, size in enumerate(_shape(result)) if size != 1]
    if [_shape(value)[d] for d in wide] != [_shape(result)[d] for d in kept]:
        return None  # merges or splits dims
    # Source dims that are not unit, in source order, and the order the transpose reads
    # them in: reader dim kept[t] holds source's non-unit dim order[t].
    p = _permutation(transpose)
    source_wide = [d for d, size in enumerate(_shape(source)) if size != 1]
    order = [source_wide.index(p[d]) for d in wide]
    # The reshaped source: the result's unit dims where the result has them, the source's
    # non-unit dims in source order at the result's other positions.
    shape = list(_shape(result))
    permutation = list(range(len(shape)))
    for i, position in enumerate(kept):
        shape[position] = _shape(source)[source_wide[i]]
    for t, position in enumerate(kept):
        permutation[position] = kept[order[t]]
    with ir.InsertionPoint(reader), reader.location:
        reshaped = _unit_reshape(source, shape)
    return _replace_by_transposed(reader, reshaped, permutation)


def _unit_reshape(value: Any, shape: list[int]) -> Any:
    """``value`` reshaped to ``shape`` (the same non-unit dims in the same order): collapse
    to its non-unit dims, then expand to ``shape``."""
    from stagegraph.mlir.build import collapse_shape, expand_shape

    current = _shape(value)
    if current == shape:
        return value
    flat = [size for size in current if size != 1]
    if len(flat) != len(current):
        value = collapse_shape(value, _groups(current), flat)
    if len(flat) != len(shape):
        value = expand_shape(value, _groups(shape), shape)
    return value


def _groups(shape: list[int]) -> list[list[int]]:
    """Reassociation of ``shape`` onto its non-unit dims (unit dims join a neighbour;
    all-unit shapes: one group)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for d, size in enumerate(shape):
        pending.append(d)
        if size != 1:
            groups.append(pending)
            pending = []
    if not groups:
        return [pending] if pending else []
    groups[-1].extend(pending)
    return groups


def _through_pooling(reader: Any, transpose: Any) -> list[Any] | None:
    """``pool_nchw(transpose(x, NHWC->NCHW))`` -> ``transpose(pool_nhwc(x), ...)``."""
    if _permutation(transpose) != _TO_NCHW or reader.operands[0] != transpose.results[0]:
        return None
    window, init = reader.operands[1], reader.operands[2]
    attributes = {k: reader.attributes[k] for k in ("strides", "dilations")}
    with ir.InsertionPoint(reader), reader.location:
        init_last = _permuted_init(init, _inv(_TO_NCHW))
        pooled = named_structured_op(
            _POOLINGS[reader.name], [transpose.operands[0], window], [init_last], attributes
        )
    return _replace_by_transposed(reader, pooled, _TO_NCHW)


def _permuted_init(init: Any, permutation: list[int]) -> Any:
    """``transpose(init, permutation)`` built at the insertion point: a fresh
    ``tensor.empty`` or the same ``linalg.fill`` of one where ``init`` is either (no pass)."""
    if not _fresh(init):
        return _new_transpose(init, permutation).results[0]
    shape = _shape(init)
    element = ir.RankedTensorType(init.type).element_type
    empty = dialect("tensor").EmptyOp([shape[p] for p in permutation], element).result
    owner = result_owner(init)
    if owner.name == "tensor.empty":
        return empty
    return named_structured_op("linalg.fill", [owner.operands[0]], [empty])


def _fresh(value: Any) -> bool:
    """A static ``tensor.empty`` or a ``linalg.fill`` of one: any layout costs the same."""
    owner = result_owner(value)
    if owner is None or not _static(value):
        return False
    if owner.name == "linalg.fill":
        owner = result_owner(owner.operands[1])
    return owner is not None and owner.name == "tensor.empty"


def _through_generic(reader: Any, transpose: Any) -> list[Any] | None:
    """A ``linalg.generic`` reading ``transpose(x, p)``: reads ``x`` through the composed
    map. Where it then reads ``x`` through a permutation of all its loops (and its body
    does not ask for loop indices), its loops are renumbered to ``x``'s order and each
    result whose map that leaves out of order is written in order, transposed back."""
    value, source = transpose.results[0], transpose.operands[0]
    inputs = input_count(reader)
    maps = _maps(reader)
    slots = [k for k, operand in enumerate(reader.operands) if operand == value]
    if any(k >= inputs for k in slots):
        return None  # an init: written, not read
    inverse = _inv(_permutation(transpose))
    for k in slots:
        results = maps[k].results
        maps[k] = ir.AffineMap.get(maps[k].n_dims, 0, [results[i] for i in inverse])
        reader.operands[k] = source
    _set_maps(reader, maps)
    order = _dims(maps[slots[0]])
    if order is None or sorted(order) != list(range(maps[0].n_dims)):
        return []
    if any(inner.name == "linalg.index" for inner in children(reader)):
        return []
    return _renumber(reader, order)


def _set_maps(op: Any, maps: list[Any]) -> None:
    op.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])


def _renumbered(amap: Any, new_of_old: list[int]) -> Any | None:
    exprs = []
    for e in amap.results:
        if isinstance(e, ir.AffineDimExpr):
            exprs.append(ir.AffineDimExpr.get(new_of_old[ir.AffineDimExpr(e).position]))
        elif isinstance(e, ir.AffineConstantExpr):
            exprs.append(e)
        else:
            return None  # an expression of several loops
    return ir.AffineMap.get(amap.n_dims, 0, exprs)


def _renumber(op: Any, order: list[int]) -> list[Any]:
    """Renumber ``op``'s loops (new loop k is old loop ``order[k]``); each result whose
    map is then a permutation out of order is written in order and transposed back; those
    transposes. Maps of other than loop dims and constants: left as they are."""
    new_of_old = _inv(order)
    maps = [_renumbered(amap, new_of_old) for amap in _maps(op)]
    if any(amap is None for amap in maps):
        return []
    inputs = input_count(op)
    made = []
    for r, result in enumerate(op.results):
        dims = _dims(maps[inputs + r])
        if dims is None or dims == sorted(dims):
            continue  # constants in the map, or in order already
        # Result dim k is loop dims[k]; written in loop order, stored dim j is ranked[j].
        ranked = sorted(dims)
        back = [ranked.index(d) for d in dims]  # result dim k = stored dim back[k]
        with ir.InsertionPoint(op), op.location:
            op.operands[inputs + r] = _permuted_init(op.operands[inputs + r], _inv(back))
        maps[inputs + r] = ir.AffineMap.get(
            len(order), 0, [ir.AffineDimExpr.get(d) for d in ranked]
        )
        result.set_type(op.operands[inputs + r].type)
        transposed = _transposed_back(op, result, back)
        if transposed is not None:
            made.append(transposed)
    _set_maps(op, maps)
    kinds = declared_iterator_types(op)
    op.attributes["iterator_types"] = iterator_types_attr([kinds[k] for k in order])
    return made


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
        if not _static(owner.operands[0]):
            return None
        sources.append(owner.operands[0])
    dim = p[ir.IntegerAttr(reader.attributes["dim"]).value]
    shape = list(_shape(sources[0]))
    shape[dim] = sum(_shape(source)[dim] for source in sources)
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
    if not _fresh(dest):
        return None
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(reader.attributes[a])) for a in attributes)
    value = transpose.results[0]
    if len(_shape(value)) != len(sizes):
        if [n for n in _shape(value) if n != 1] != [n for n in sizes if n != 1]:
            return None
        with ir.InsertionPoint(reader), reader.location:
            reader.operands[0] = _unit_reshape(value, sizes)
        return [transpose]  # read again, through the expansion
    p = _permutation(transpose)
    inverse = _inv(p)
    offsets, sizes, strides = ([values[k] for k in inverse] for values in (offsets, sizes, strides))
    with ir.InsertionPoint(reader), reader.location:
        into = _permuted_init(dest, inverse)
        inserted = (
            dialect("tensor")
            .InsertSliceOp(transpose.operands[0], into, [], [], [], offsets, sizes, strides)
            .result
        )
    return _replace_by_transposed(reader, inserted, p)


_REWRITES: dict[str, Any] = {
    "tensor.insert_slice": _through_insert,
    "tensor.concat": _through_concat,
    "linalg.transpose": _through_transpose,
    "linalg.generic": _through_generic,
    "tensor.pad": _through_pad,
    "tensor.extract_slice": _through_slice,
    "tensor.collapse_shape": _through_unit_reshape,
    "tensor.expand_shape": _through_unit_reshape,
    **dict.fromkeys(_POOLINGS, _through_pooling),
}
