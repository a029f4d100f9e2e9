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
* ``tensor.pad``, static ``tensor.extract_slice``, reshapes that only add or drop unit
  dims, ``linalg.pooling_nchw_{max,sum}``, concatenations of transposes by one
  permutation (a U-Net's skip connections) and insertions into a fresh tensor (a strided
  transposed convolution's spread input) are rebuilt on the source (padding, offsets,
  dims, pooling layout permuted), the transpose moved after them
  (:mod:`.layout_readers`).

Transposes of fresh tensors (a convolution's zero init) become fresh tensors of the
transposed shape. Readers that take none of these (a function result, a matmul, a reshape
that merges dims) keep reading the transpose, which stays where it is: the layout goes
back to NCHW only where a consumer needs it. Nothing here reads printed IR: ops, maps and
permutations are read through the bindings.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import ir
from stagegraph.mlir.build import iterator_types_attr
from stagegraph.mlir.walk import collect, top_level_ops
from stagegraph.stages.analysis.ops import declared_iterator_types
from stagegraph.stages.x86.generic.layout_readers import (
    READERS,
    fresh,
    permuted_init,
    static,
    transposed_back,
)
from stagegraph.stages.x86.generic.linalg_parts import input_count, result_owner
from stagegraph.stages.x86.generic.transpose_readers import (
    _dims,
    _inv,
    _maps,
    _permutation,
    renumbered_map,
)

#: A unit attribute on a transpose whose source is channels-last but made by no convolution
#: or pooling op (Winograd's output transform, :mod:`stagegraph.stages.x86.conv.winograd`):
#: it sinks as one that leaves a convolution does.
SINKS_ATTRIBUTE = "stagegraph.sink_layout"


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
        if not fresh(op.operands[0]):
            continue
        with ir.InsertionPoint(op), op.location:
            permuted = permuted_init(op.operands[0], _permutation(op))
        op.results[0].replace_all_uses_with(permuted)
        op.erase()
        folded += 1
    return folded


def _leaves_window_op(op: Any) -> bool:
    if op.name != "linalg.transpose" or len(op.results) != 1:
        return False
    if SINKS_ATTRIBUTE in op.attributes:
        return True
    owner = result_owner(op.operands[0])
    return owner is not None and ("conv" in owner.name or "pooling" in owner.name)


def _sink(transpose: Any, erased: set[Any]) -> list[Any] | None:
    """Move ``transpose`` past each reader that can read its source; the transposes this
    made (to sink next), or None where no reader could. The transpose itself goes once
    nothing reads it any more."""
    if not static(transpose.operands[0]):
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


def _through_generic(reader: Any, transpose: Any) -> list[Any] | None:
    """A ``linalg.generic`` reading ``transpose(x, p)``: reads ``x`` through the composed
    map. Where it then reads ``x`` through a permutation of all its loops, its loops are
    renumbered to ``x``'s order (``linalg.index`` ops too) and each result whose map that
    leaves out of order is written in order, transposed back."""
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
    return _renumber(reader, order)


def _set_maps(op: Any, maps: list[Any]) -> None:
    op.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])


def _renumber(op: Any, order: list[int]) -> list[Any]:
    """Renumber ``op``'s loops (new loop k is old loop ``order[k]``); each result whose
    map is then a permutation out of order is written in order and transposed back; those
    transposes. Maps of other than loop dims and constants: left as they are."""
    new_of_old = _inv(order)
    maps = [renumbered_map(amap, new_of_old) for amap in _maps(op)]
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
            op.operands[inputs + r] = permuted_init(op.operands[inputs + r], _inv(back))
        maps[inputs + r] = ir.AffineMap.get(
            len(order), 0, [ir.AffineDimExpr.get(d) for d in ranked]
        )
        result.set_type(op.operands[inputs + r].type)
        transposed = transposed_back(op, result, back)
        if transposed is not None:
            made.append(transposed)
    _set_maps(op, maps)
    i64 = ir.IntegerType.get_signless(64)
    for inner in collect(op, "linalg.index"):  # loop indices the body asks for (argmax)
        old = ir.IntegerAttr(inner.attributes["dim"]).value
        inner.attributes["dim"] = ir.IntegerAttr.get(i64, new_of_old[old])
    kinds = declared_iterator_types(op)
    op.attributes["iterator_types"] = iterator_types_attr([kinds[k] for k in order])
    return made


_REWRITES: dict[str, Any] = {**READERS, "linalg.generic": _through_generic}
