"""Elementwise consumers of a loop that writes its result block by block move into the
loop, onto each block, so a matmul computing the block fuses them.

A target's implicit GEMM in row blocks (the x86 graph's convolution rewrite) is one
``scf.for`` whose body computes a block of the output with a matmul and writes it with a
``tensor.insert_slice`` into the tensor the loop carries. A bias, ReLU or residual add after
the loop then reads the whole output back: a pass over memory of its own. Applied to each
block before it is written (its other operands sliced to the block), the op becomes the
block matmul's consumer through reshapes, which
:mod:`stagegraph.stages.common.reshaped_epilogues` then moves onto the matmul.

Only a loop whose body writes disjoint blocks covering its whole result moves an op in
(else the elements no block writes would skip it): the loop counts from 0 by 1, its body
yields one ``insert_slice`` into the carried tensor, and the trips times the block's
elements equal the result's. The blocks of one loop are disjoint when a matmul computed
them, stamped by the convolution path (``stagegraph.conv_path``) that built the loop so.
"""

from __future__ import annotations

import math
from typing import Any

from stagegraph.mlir.build import collapse_shape, expand_shape
from stagegraph.mlir.walk import DefUse, collect, top_level_ops
from stagegraph.stages.common.reshaped_epilogues import RESHAPES, chain_end, elementwise

#: The stamp of an op the convolution-path choice made (the x86 graph's cost model).
_BLOCK_STAMP = "stagegraph.conv_path"


def sink_epilogues_into_blocks(module: Any) -> int:
    """Move the elementwise consumer of each block-writing loop of ``module``'s functions
    (through reshapes of its result) into the loop; returns how many moved."""
    moved = 0
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        for loop in collect(fn, lambda op: op.name == "scf.for"):
            while _sink_one(fn, loop):
                moved += 1
    return moved


def _block_write(links: DefUse, loop: Any) -> Any | None:
    """The ``tensor.insert_slice`` that the body of ``loop`` yields into its carried tensor,
    when the loop writes disjoint blocks covering its whole result, else None."""
    from stagegraph.mlir.bindings import ir

    if len(loop.results) != 1 or not isinstance(loop.results[0].type, ir.RankedTensorType):
        return None
    bounds = [_constant(links, loop.operands[i]) for i in range(3)]
    if bounds[0] != 0 or bounds[2] != 1 or bounds[1] is None:
        return None
    body = loop.regions[0].blocks[0]
    writes = [
        op
        for op in links.users(body.arguments[1])
        if op.name == "tensor.insert_slice"
        and op.operands[1] == body.arguments[1]
        and [u.name for u in links.users(op.results[0])] == ["scf.yield"]
        and links.users(op.results[0])[0].parent == loop
    ]
    if len(writes) != 1:
        return None
    write = writes[0]
    block = ir.RankedTensorType(write.operands[0].type)
    whole = ir.RankedTensorType(loop.results[0].type)
    if not block.has_static_shape or bounds[1] * math.prod(block.shape) != math.prod(whole.shape):
        return None
    if not collect(loop, _stamped):
        return None
    return write


def _stamped(op: Any) -> bool:
    return op.name == "linalg.matmul" and _BLOCK_STAMP in op.attributes


def _constant(links: DefUse, value: Any) -> int | None:
    from stagegraph.mlir.bindings import ir

    owner = links.owner(value)
    if owner is None or owner.name != "arith.constant":
        return None
    return ir.IntegerAttr(owner.attributes["value"]).value


def _sink_one(fn: Any, loop: Any) -> bool:
    """Move the elementwise consumer of ``loop``'s result (through reshapes) into it."""
    from stagegraph.mlir.bindings import ir

    links = DefUse(fn)
    write = _block_write(links, loop)
    if write is None:
        return False
    reshaped, op = chain_end(links, loop.results[0])
    if op is None or not elementwise(op) or not _outside(links, op, loop, reshaped):
        return False
    whole = list(ir.RankedTensorType(loop.results[0].type).shape)
    space = list(ir.RankedTensorType(op.results[0].type).shape)
    spread = [d for d in range(len(space)) if space[d] != 1]
    kept = [d for d in range(len(whole)) if whole[d] != 1]
    if [space[d] for d in spread] != [whole[d] for d in kept]:
        return False  # not the loop's result with unit dims added or dropped
    to_whole = dict(zip(spread, kept, strict=True))
    _rebuild_in_block(links, op, write, reshaped, to_whole)
    return True


def _outside(links: DefUse, op: Any, loop: Any, reshaped: Any) -> bool:
    """Whether ``op`` reads ``reshaped`` once by an identity map, writes an empty tensor,
    and its other operands are defined before ``loop`` (so the body can read them)."""
    from stagegraph.mlir.bindings import ir

    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    operands = list(op.operands)
    if operands.count(reshaped) != 1 or operands[-1] == reshaped:
        return False
    if maps[operands.index(reshaped)] != ir.AffineMap.get_identity(maps[-1].n_dims):
        return False
    init = links.owner(operands[-1])
    if init is None or init.name != "tensor.empty":
        return False
    return all(_available(links, v, loop) for v in operands[:-1] if v != reshaped)


def _available(links: DefUse, value: Any, loop: Any) -> bool:
    """Whether the body of ``loop`` can read ``value``: defined before it, or a reshape
    after it of such a value (moved before it: a reshape reads nothing)."""
    from stagegraph.mlir.bindings import ir

    owner = links.owner(value)
    if owner is None:  # a block argument: of the loop's block only
        return isinstance(value, ir.BlockArgument) and value.owner == loop.block
    if owner.block != loop.block:
        return False
    if owner.is_before_in_block(loop):
        return True
    if owner.name in RESHAPES and _available(links, owner.operands[0], loop):
        owner.move_before(loop)
        return True
    return False


def _rebuild_in_block(
    links: DefUse, op: Any, write: Any, reshaped: Any, to_whole: dict[int, int]
) -> None:
    """A copy of ``op`` in the loop over the block ``write`` writes (its other operands
    sliced to the block), its result written instead; ``op``'s users read ``reshaped``."""
    from stagegraph.mlir.bindings import dialect, ir

    tensor = dialect("tensor")
    offsets = _offsets(write)
    sizes = list(ir.DenseI64ArrayAttr(write.attributes["static_sizes"]))
    space = list(ir.RankedTensorType(op.results[0].type).shape)
    local = [sizes[to_whole[d]] if d in to_whole else 1 for d in range(len(space))]
    element = ir.RankedTensorType(op.results[0].type).element_type
    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    block_value = write.operands[0]
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    with ir.InsertionPoint(write), op.location:
        inputs = []
        for value, amap in zip(list(op.operands)[:-1], maps[:-1], strict=True):
            if value == reshaped:
                inputs.append(_reshaped(block_value, local))
                continue
            dims = [e.position for e in amap.results]
            shape = [local[d] for d in dims]
            picked = [offsets[to_whole[d]] if d in to_whole else 0 for d in dims]
            static = [dynamic if isinstance(o, ir.Value) else o for o in picked]
            values = [o for o in picked if isinstance(o, ir.Value)]
            result_type = ir.RankedTensorType.get(shape, element)
            inputs.append(tensor.ExtractSliceOp(
                result_type, value, values, [], [], static, shape, [1] * len(shape)
            ).result)  # fmt: skip
        inputs.append(tensor.EmptyOp(local, element).result)
        # after its operands, before the write; the body moves over
        copy = ir.Operation.create(
            "linalg.generic",
            results=[ir.RankedTensorType.get(local, element)],
            operands=inputs,
            attributes={name: op.attributes[name] for name in op.attributes},
            regions=1,
        )
        op.regions[0].blocks[0].append_to(copy.regions[0])
        block_shape = list(ir.RankedTensorType(block_value.type).shape)
        write.operands[0] = _reshaped(copy.results[0], block_shape)
    old_init = op.operands[len(maps) - 1]
    dead = links.owner(old_init) if len(links.users(old_init)) == 1 else None
    op.results[0].replace_all_uses_with(reshaped)
    op.erase()
    if dead is not None:
        dead.erase()


def _offsets(write: Any) -> list[Any]:
    """The offsets of ``write`` (an insert_slice) per dim: ints, or the ``ir.Value`` given."""
    from stagegraph.mlir.bindings import ir

    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    values = iter(list(write.operands)[2:])
    return [
        next(values) if o == dynamic else o
        for o in ir.DenseI64ArrayAttr(write.attributes["static_offsets"])
    ]


def _reshaped(value: Any, shape: list[int]) -> Any:
    """``value`` reshaped to ``shape`` (the same elements): through one flat dim."""
    from stagegraph.mlir.bindings import ir

    source = list(ir.RankedTensorType(value.type).shape)
    if source == shape:
        return value
    flat = collapse_shape(value, [list(range(len(source)))], [math.prod(source)])
    return expand_shape(flat, [list(range(len(shape)))], shape)
