"""A transpose read by several generics (and leading slices) merged into all its readers.

A channels-last convolution's result goes back to NCHW through a ``linalg.transpose``
(:func:`stagegraph.stages.x86.conv.rewrites.conv_to_channels_last`), a pass over memory.
:func:`~stagegraph.stages.x86.generic.transpose_fusion.merge_transposes_into_elementwise`
merges it into its reader when one elementwise generic alone reads it. A norm after the
convolution reads it three times: its statistics (one reduction,
:mod:`.batch_stats`), its per-group first elements (a leading slice) and its
normalization (an elementwise generic). Here each of those reads the channels-last
result itself: a generic through the composed map, a slice as the transpose of the
channels-last slice (a few elements). A reduction then also has its loops interchanged
to the channels-last order, so that it reads the channels as contiguous vectors (a
reduction over outer dims, vector adds) instead of one strided element at a time.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import dialect, ir
from stagegraph.mlir.build import generic, iterator_types_attr
from stagegraph.mlir.walk import children, top_level_ops
from stagegraph.stages.analysis.ops import declared_iterator_types
from stagegraph.stages.x86.generic.linalg_parts import input_count, is_contraction


def merge_transposes_into_readers(fn: Any) -> int:
    """Merge each top-level ``linalg.transpose`` of ``fn`` read only by generics (through
    permutation maps) and leading slices into all of them; returns how many."""
    merged = 0
    for op in top_level_ops(fn):
        if op.name != "linalg.transpose" or len(op.results) != 1:
            continue
        readers = [use.owner.operation for use in op.results[0].uses]
        if readers and all(_takes(reader, op) for reader in readers):
            _merge(op, readers)
            merged += 1
    return merged


def _maps(op: Any) -> list[Any]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def _dims(amap: Any) -> list[int] | None:
    """The loop dim of each result of ``amap``; None if a result is not a dim."""
    if not all(isinstance(e, ir.AffineDimExpr) for e in amap.results):
        return None
    return [ir.AffineDimExpr(e).position for e in amap.results]


def _permutation(op: Any) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))


def _takes(reader: Any, transpose: Any) -> bool:
    """Whether ``reader`` can read the transpose's input instead of its result."""
    value = transpose.results[0]
    if reader.parent != transpose.parent:
        return False
    if reader.name == "tensor.extract_slice":
        offsets = list(ir.DenseI64ArrayAttr(reader.attributes["static_offsets"]))
        strides = list(ir.DenseI64ArrayAttr(reader.attributes["static_strides"]))
        sizes = list(ir.DenseI64ArrayAttr(reader.attributes["static_sizes"]))
        kept_rank = ir.RankedTensorType(reader.results[0].type).rank == len(sizes)
        return len(reader.operands) == 1 and not any(offsets) and set(strides) == {1} and kept_rank
    if reader.name != "linalg.generic" or is_contraction(reader):
        return False
    if any(inner.name == "linalg.index" for inner in children(reader)):
        return False
    inputs = input_count(reader)
    maps = _maps(reader)
    for k, operand in enumerate(reader.operands):
        if operand != value:
            continue
        dims = _dims(maps[k])
        if k >= inputs or dims is None or sorted(dims) != list(range(maps[k].n_dims)):
            return False  # an init, or a read that is not a permutation of the loops
        if "reduction" in declared_iterator_types(reader):
            # Interchanged to the source's order, its outputs must keep theirs (a per-
            # channel sum: yes; a reduction over depth writing NCHW from NDHWC: no, its
            # write would be a transpose of its own).
            order = [dims[i] for i in _inv(_permutation(transpose))]
            new_of_old = _inv(order)
            for amap in maps[inputs:]:
                kept = _dims(_without_zeros(amap))
                if kept is None or [new_of_old[d] for d in kept] != sorted(
                    new_of_old[d] for d in kept
                ):
                    return False
    return True


def _without_zeros(amap: Any) -> Any:
    """``amap`` without its constant-0 results (kept unit dims)."""
    exprs = [e for e in amap.results if not isinstance(e, ir.AffineConstantExpr)]
    return ir.AffineMap.get(amap.n_dims, 0, exprs)


def _merge(transpose: Any, readers: list[Any]) -> None:
    source, value = transpose.operands[0], transpose.results[0]
    # transpose: result[i] = source[p[i]], so source dim k is result dim inverse[k].
    inverse = _inv(_permutation(transpose))
    for reader in readers:
        if reader.name == "tensor.extract_slice":
            if not _slice_read_in_place(reader, source, transpose):
                _slice_of_source(reader, source, transpose)
            continue
        _read_through(reader, value, source, inverse)
        if "reduction" in declared_iterator_types(reader):
            _interchange_to(reader, source)
    transpose.erase()


def _read_through(reader: Any, value: Any, source: Any, inverse: list[int]) -> None:
    """``reader`` reads ``source`` where it read ``value``, its transpose (``inverse``:
    the result dim of each source dim), through the composed maps."""
    maps = _maps(reader)
    for k, operand in enumerate(list(reader.operands)):
        if operand == value:
            results = maps[k].results
            maps[k] = ir.AffineMap.get(maps[k].n_dims, 0, [results[i] for i in inverse])
            reader.operands[k] = source
    reader.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])


def _slice_read_in_place(reader: Any, source: Any, transpose: Any) -> bool:
    """A leading slice read only by generics (a norm's first elements, read by its
    statistics): they read the slice of ``source`` through composed maps instead, so the
    reduction, interchanged to ``source``'s order, reads it as whole vectors."""
    users = [use.owner.operation for use in reader.results[0].uses]
    for user in users:
        if user.name != "linalg.generic" or user.parent != reader.parent:
            return False
        for k, operand in enumerate(user.operands):
            if operand == reader.results[0] and (
                k >= input_count(user) or not _projection(_maps(user)[k])
            ):
                return False
    with ir.InsertionPoint(reader), reader.location:
        block = _source_slice(reader, source, transpose)
    for user in dict.fromkeys(users):
        _read_through(user, reader.results[0], block, _inv(_permutation(transpose)))
    reader.erase()
    return True


def _source_slice(reader: Any, source: Any, transpose: Any) -> Any:
    """The slice of ``source`` that the leading slice ``reader`` of its transpose holds,
    in ``source``'s order, built at the insertion point."""
    sizes = list(ir.DenseI64ArrayAttr(reader.attributes["static_sizes"]))
    source_sizes = [sizes[i] for i in _inv(_permutation(transpose))]
    rank = len(source_sizes)
    element = ir.RankedTensorType(source.type).element_type
    return dialect("tensor").ExtractSliceOp(
        ir.RankedTensorType.get(source_sizes, element), source, [], [], [],
        [0] * rank, source_sizes, [1] * rank,
    ).result  # fmt: skip


def _projection(amap: Any) -> bool:
    """Each result a loop dim or the constant 0."""
    return all(
        isinstance(e, ir.AffineDimExpr)
        or (isinstance(e, ir.AffineConstantExpr) and ir.AffineConstantExpr(e).value == 0)
        for e in amap.results
    )


def _slice_of_source(reader: Any, source: Any, transpose: Any) -> None:
    """``slice(transpose(s))`` -> ``transpose(slice(s))`` (the slice's few elements)."""
    permutation = _permutation(transpose)
    sizes = list(ir.DenseI64ArrayAttr(reader.attributes["static_sizes"]))
    rank = len(permutation)
    element = ir.RankedTensorType(source.type).element_type
    with ir.InsertionPoint(reader), reader.location:
        block = _source_slice(reader, source, transpose)
        empty = dialect("tensor").EmptyOp(sizes, element).result
        # result[i] = block[k] where p[i] = k: block dim k is loop inverse[k]
        read = ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(i) for i in _inv(permutation)])
        identity = ir.AffineMap.get_identity(rank)
        moved = generic([block], [empty], [read, identity], ["parallel"] * rank, lambda x, _o: x)
    reader.results[0].replace_all_uses_with(moved)
    reader.erase()


def _inv(permutation: list[int]) -> list[int]:
    inverse = [0] * len(permutation)
    for i, k in enumerate(permutation):
        inverse[k] = i
    return inverse


def renumbered_map(amap: Any, new_of_old: list[int]) -> Any | None:
    """``amap`` with loop ``d`` renamed ``new_of_old[d]``; None when a result is more than
    a loop dim or a constant (an expression of several loops)."""
    exprs = []
    for e in amap.results:
        if isinstance(e, ir.AffineDimExpr):
            exprs.append(ir.AffineDimExpr.get(new_of_old[ir.AffineDimExpr(e).position]))
        elif isinstance(e, ir.AffineConstantExpr):
            exprs.append(e)
        else:
            return None
    return ir.AffineMap.get(amap.n_dims, 0, exprs)


def _interchange_to(reader: Any, source: Any) -> None:
    """Renumber ``reader``'s loops so that it reads ``source`` through the identity map
    (when every map is a projection: dims and zeros)."""
    maps = _maps(reader)
    slot = next(k for k, operand in enumerate(reader.operands) if operand == source)
    order = _dims(maps[slot])  # new loop k is old loop order[k]
    if order is None:
        return
    new_of_old = _inv(order)
    renumbered = [renumbered_map(amap, new_of_old) for amap in maps]
    if any(amap is None for amap in renumbered):
        return  # an expression of several loops: left as it is
    kinds = declared_iterator_types(reader)
    reader.attributes["indexing_maps"] = ir.ArrayAttr.get(
        [ir.AffineMapAttr.get(m) for m in renumbered]
    )
    reader.attributes["iterator_types"] = iterator_types_attr([kinds[k] for k in order])
