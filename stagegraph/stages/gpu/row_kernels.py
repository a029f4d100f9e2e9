"""The independent rows of a scan, one GPU thread each, instead of one thread for all.

The stepping form of a scan (built when the payload is parsed, :mod:`stagegraph.mlir.scan`)
is an ``scf.forall`` over the rows whose body walks its row serially, in vectors. The
schedule leaves it unmapped, and :mod:`stagegraph.stages.gpu.host_kernels` ran such host
work in a kernel of one thread: every row one after the other. The rows never touch each
other (a forall's iterations are independent by definition), so here such a forall
becomes a ``gpu.launch`` of one thread per row, a warp of rows to a block (the target's
warp size: a warp per block spreads few rows over the most SMs), the rows past the last
one skipped. Each thread keeps its row's serial steps.

A thread's vector accesses are rewritten to ``vector.load``/``vector.store`` with the
alignment their addresses are known to have (:func:`known_multiple`, capped at 16 bytes):
a row of 255 floats starts at a 4-byte boundary only, and the GPU refuses a misaligned
16-byte access (``CUDA_ERROR_MISALIGNED_ADDRESS``, found on an H200); rows of 256 keep
their 16-byte loads.
"""

from __future__ import annotations

from math import gcd
from typing import Any

from stagegraph.stages.gpu.simt_plan import VECTOR_BYTES


def _constant(value: Any) -> int | None:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def known_multiple(value: Any) -> int:
    """What an index value is always a multiple of (0: always zero; 1: nothing known):
    constants, sums, differences and products of such, and the induction variable of an
    ``scf.for`` with constant bounds."""
    from stagegraph.mlir.bindings import ir

    constant = _constant(value)
    if constant is not None:
        return abs(constant)
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner
        if parent.name == "scf.for" and value == owner.arguments[0]:
            lower, step = _constant(parent.operands[0]), _constant(parent.operands[2])
            return gcd(lower, step) if lower is not None and step is not None else 1
        return 1
    if owner.name in ("arith.addi", "arith.subi"):
        return gcd(known_multiple(owner.operands[0]), known_multiple(owner.operands[1]))
    if owner.name == "arith.muli":
        return known_multiple(owner.operands[0]) * known_multiple(owner.operands[1])
    return 1


def _strides(memref: Any) -> tuple[list[int], int] | None:
    """A memref's static strides and offset (the dynamic ones as the bindings' sentinel)."""
    from stagegraph.mlir.bindings import ir

    try:
        strides, offset = ir.MemRefType(memref.type).get_strides_and_offset()
    except (ValueError, RuntimeError):
        return None
    return list(strides), offset


def offset_multiple(memref: Any) -> int:
    """What a memref's offset (in elements) is always a multiple of (0: always zero): its
    type's static offset, else through the ``memref.subview`` it was taken by."""
    from stagegraph.mlir.bindings import ir

    layout = _strides(memref)
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    if layout is None:
        return 1
    if layout[1] != dynamic:
        return abs(layout[1])
    owner = memref.owner
    if isinstance(owner, ir.Block) or owner.name != "memref.subview":
        return 1
    source = owner.operands[0]
    source_layout = _strides(source)
    if source_layout is None or dynamic in source_layout[0]:
        return 1
    multiple = offset_multiple(source)
    for index, stride in zip(_subview_offsets(owner), source_layout[0], strict=True):
        step = abs(index) if isinstance(index, int) else known_multiple(index)
        multiple = gcd(multiple, step * stride)
    return multiple


def _subview_offsets(subview: Any) -> list[Any]:
    """The subview's offsets, static ones as ints and dynamic ones as their values."""
    from stagegraph.mlir.bindings import ir

    static = list(ir.DenseI64ArrayAttr(subview.attributes["static_offsets"]))
    dynamic = iter(list(subview.operands)[1 : 1 + sum(
        1 for s in static if s == ir.ShapedType.get_dynamic_stride_or_offset())])  # fmt: skip
    sentinel = ir.ShapedType.get_dynamic_stride_or_offset()
    return [next(dynamic) if s == sentinel else s for s in static]


def access_alignment(memref: Any, indices: list[Any], element_bytes: int) -> int:
    """The bytes (a power of two, at most :data:`VECTOR_BYTES`) the address of
    ``memref[indices]`` is always a multiple of, assuming 16-byte aligned buffers."""
    from stagegraph.mlir.bindings import ir

    layout = _strides(memref)
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    if layout is None or layout[0][-1] != 1 or dynamic in layout[0]:
        return element_bytes
    multiple = offset_multiple(memref)
    for index, stride in zip(indices, layout[0], strict=True):
        multiple = gcd(multiple, known_multiple(index) * stride)
    bytes_ = VECTOR_BYTES if multiple == 0 else (multiple & -multiple) * element_bytes
    return max(element_bytes, min(VECTOR_BYTES, bytes_))


def _vector_access(op: Any) -> bool:
    """A 1-D in-bounds transfer with the identity-minor map: a plain vector load/store."""
    from stagegraph.mlir.bindings import ir

    vector = ir.VectorType(op.results[0].type if op.name == "vector.transfer_read"
                           else op.operands[0].type)  # fmt: skip
    if vector.rank != 1 or list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[-1]:
        return False  # a masked transfer
    if "in_bounds" not in op.attributes:
        return False
    if not all(ir.BoolAttr(b).value for b in ir.ArrayAttr(op.attributes["in_bounds"])):
        return False
    memref = op.operands[0 if op.name == "vector.transfer_read" else 1]
    rank = ir.MemRefType(memref.type).rank
    permutation = ir.AffineMapAttr(op.attributes["permutation_map"]).value
    return permutation == ir.AffineMap.get_minor_identity(rank, 1)


def aligned_accesses(root: Any) -> int | None:
    """Rewrite the vector transfers in ``root`` as loads and stores with their known
    alignment (:func:`access_alignment`); None (nothing changed) when one is not a plain
    vector access, else how many were rewritten."""
    from stagegraph.mlir.bindings import dialect, ir
    from stagegraph.mlir.walk import collect

    transfers = collect(root, {"vector.transfer_read", "vector.transfer_write"})
    if not all(_vector_access(op) for op in transfers):
        return None
    vector_ops = dialect("vector")
    i64 = ir.IntegerType.get_signless(64)
    for op in transfers:
        reading = op.name == "vector.transfer_read"
        memref = op.operands[0 if reading else 1]
        rank = ir.MemRefType(memref.type).rank
        indices = list(op.operands)[(1 if reading else 2) : (1 if reading else 2) + rank]
        element = ir.MemRefType(memref.type).element_type
        align = access_alignment(memref, indices, max(1, element.width // 8))
        alignment = ir.IntegerAttr.get(i64, align)
        with ir.InsertionPoint(op), op.location:
            if reading:
                load = vector_ops.LoadOp(op.results[0].type, memref, indices)
                load.operation.attributes["alignment"] = alignment
                op.results[0].replace_all_uses_with(load.result)
            else:
                store = vector_ops.StoreOp(op.operands[0], memref, indices)
                store.operation.attributes["alignment"] = alignment
        op.erase()
    return len(transfers)


def _rows(forall: Any) -> int | None:
    """The trip count of a one-dim forall with static bounds from 0 by 1 and no results."""
    from stagegraph.mlir.bindings import ir

    if forall.name != "scf.forall" or "mapping" in forall.attributes or forall.results:
        return None
    try:
        lower = list(ir.DenseI64ArrayAttr(forall.attributes["staticLowerBound"]))
        upper = list(ir.DenseI64ArrayAttr(forall.attributes["staticUpperBound"]))
        steps = list(ir.DenseI64ArrayAttr(forall.attributes["staticStep"]))
    except KeyError:
        return None
    if len(upper) != 1 or lower != [0] or steps != [1] or upper[0] < 1:
        return None
    return upper[0] if len(list(forall.operands)) == 0 else None


def launch_rows(run: list[Any], rows_per_block: int) -> bool:
    """Make ``run`` (host work: see :func:`~.host_kernels.host_runs`) a launch of one
    thread per row, ``rows_per_block`` rows to a block, when it is one unmapped row forall
    (:func:`_rows`) whose vector accesses can carry their alignment; False (nothing
    changed) otherwise."""
    from stagegraph.mlir.bindings import arith, gpu, ir, scf

    if len(run) != 1 or (rows := _rows(run[0])) is None:
        return False
    forall = run[0]
    if aligned_accesses(forall) is None:
        return False
    blocks = -(-rows // rows_per_block)
    threads = min(rows, rows_per_block)
    index = ir.IndexType.get()
    with ir.InsertionPoint(forall), forall.location:
        grid = arith.ConstantOp(index, blocks).result
        block = arith.ConstantOp(index, threads).result
        one = arith.ConstantOp(index, 1).result
        launch = gpu.LaunchOp((grid, one, one), (block, one, one))
    body = launch.regions[0].blocks[0]
    x = ir.Attribute.parse("#gpu<dim x>")
    with ir.InsertionPoint(body), forall.location:
        block_id = ir.Operation.create("gpu.block_id", results=[index], attributes={"dimension": x})
        thread_id = ir.Operation.create("gpu.thread_id", results=[index],
                                        attributes={"dimension": x})  # fmt: skip
        width = arith.ConstantOp(index, threads).result
        row = arith.AddIOp(arith.MulIOp(block_id.result, width).result, thread_id.result).result
        target = body
        if rows % threads:
            limit = arith.ConstantOp(index, rows).result
            inside = arith.CmpIOp(arith.CmpIPredicate.ult, row, limit).result
            guard = scf.IfOp(inside)
            target = guard.then_block
            with ir.InsertionPoint(target):
                scf.YieldOp([])
        gpu.TerminatorOp()
    old = forall.regions[0].blocks[0]
    old.arguments[0].replace_all_uses_with(row)
    anchor = list(target.operations)[-1]
    for op in list(old.operations)[:-1]:  # all but the (empty) scf.forall.in_parallel
        op.move_before(anchor)
    forall.erase()
    return True
