"""Software prefetch ahead of the register tiles' reads of a weight packed at compile time.

A constant B packed at compile time (:mod:`.constant_pack`) is read by the register tiles
straight from the packed constant, ``[N / reg_n, K, reg_n]``: with one K block (small M,
see ``heuristic``) the kernel walks it once, panel after panel, each panel contiguous over
k, so the whole weight is one sequential stream. When the weight lies past the caches and
M is small (a Linear layer at batch 16 against a 4096x4096 weight: 2 FMAs per element
loaded per row of the tile), the run time is the time that stream takes; the hardware
prefetchers, which stop at every 4 KiB page and learn each stream again, keep fewer lines
in flight than the memory system can serve (measured on a Xeon, 1 thread: 7 GB/s of the
17 a plain sum reaches).

The schedule marks such a kernel's k loop (:data:`STREAM_PREFETCH_ATTR`, its value the
prefetch distance in bytes). After bufferization, :func:`prefetch_streams` puts before
every read of a constant global in a marked loop one ``memref.prefetch`` per cache line
the read covers, ``distance`` bytes further along the global's memory (the next panel's
first lines when the read is near a panel's end: the stream's order is its memory order).
The address goes through a flat view of the global and is clamped to its last element, so
every prefetch stays inside the buffer.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import arith, dialect, ir
from stagegraph.mlir.walk import collect

#: Set by the matmul schedule on the kernel's k loop: prefetch distance in bytes.
STREAM_PREFETCH_ATTR = "stagegraph.stream_prefetch"
#: ``memref.prefetch``'s locality hint for L2 (``prefetcht1``): the register tiles' reads
#: then hit L2, and the prefetches do not hold L1's few line-fill buffers (into L1,
#: ``prefetcht0``, the stream ran 1.25x faster than without prefetch; into L2, 1.6-1.8x).
L2_HINT = 2
#: Bytes of a cache line (one prefetch each).
LINE_BYTES = 64


def prefetch_streams(module: Any) -> int:
    """Prefetch ahead of the reads of constant globals in every marked loop of ``module``
    (buffer level); strip the marks. Returns how many prefetches were inserted."""
    count = 0
    flat_views: dict[Any, Any] = {}
    with module.context:
        for loop in collect(module, lambda op: STREAM_PREFETCH_ATTR in op.attributes):
            distance = ir.IntegerAttr(loop.attributes[STREAM_PREFETCH_ATTR]).value
            del loop.attributes[STREAM_PREFETCH_ATTR]
            for read in collect(loop, "vector.transfer_read"):
                count += _prefetch_ahead_of(read, distance, flat_views)
    return count


def _constant_global(value: Any) -> Any | None:
    """The ``memref.get_global`` op defining ``value`` when it reads a constant global with
    the identity layout."""
    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return None
    owner = owner.operation
    if owner.name != "memref.get_global":
        return None
    memref_type = ir.MemRefType(value.type)
    layout = memref_type.layout
    identity = ir.AffineMap.get_identity(memref_type.rank)
    if not isinstance(layout, ir.AffineMapAttr) or layout.value != identity:
        return None
    if not memref_type.has_static_shape:
        return None
    return owner


def _flat_view(get_global: Any, flat_views: dict[Any, Any]) -> Any:
    """A 1-D view of the global (one per ``get_global``), built right after it."""
    key = get_global.results[0]
    if key not in flat_views:
        memref = dialect("memref")
        memref_type = ir.MemRefType(key.type)
        size = 1
        for extent in memref_type.shape:
            size *= extent
        with ir.InsertionPoint(get_global), get_global.location:
            flat_type = ir.MemRefType.get([size], memref_type.element_type)
            i64 = ir.IntegerType.get_signless(64)
            dims = [ir.IntegerAttr.get(i64, d) for d in range(memref_type.rank)]
            reassociation = ir.ArrayAttr.get([ir.ArrayAttr.get(dims)])
            view = memref.CollapseShapeOp(flat_type, key, reassociation)
        # (built before the get_global, then moved after it: the view reads its result)
        view.operation.move_after(get_global)
        flat_views[key] = view.result
    return flat_views[key]


def _prefetch_ahead_of(read: Any, distance: int, flat_views: dict[Any, Any]) -> int:
    source = read.operands[0]
    if not isinstance(source.type, ir.MemRefType):
        return 0
    get_global = _constant_global(source)
    if get_global is None:
        return 0
    memref_type = ir.MemRefType(source.type)
    rank = memref_type.rank
    vector_shape = ir.VectorType(read.results[0].type).shape
    minor_identity = ir.AffineMap.get_minor_identity(rank, len(vector_shape))
    if ir.AffineMapAttr(read.attributes["permutation_map"]).value != minor_identity:
        return 0
    shape = memref_type.shape
    if list(vector_shape[1:]) != list(shape[rank - len(vector_shape) + 1 :]):
        return 0  # (rows of the read not adjacent in memory: not one stretch of lines)
    element_bytes = max(1, memref_type.element_type.width // 8)
    span = element_bytes
    for extent in vector_shape:
        span *= extent
    lines = max(1, span // LINE_BYTES)
    strides = [1] * rank
    for dim in range(rank - 2, -1, -1):
        strides[dim] = strides[dim + 1] * shape[dim + 1]
    last = strides[0] * shape[0] - 1
    flat = _flat_view(get_global, flat_views)
    index = ir.IndexType.get()
    memref = dialect("memref")
    with ir.InsertionPoint(read), read.location:

        def constant(value: int) -> Any:
            return arith.ConstantOp(index, value).result

        linear = None
        for position, stride in zip(read.operands[1 : 1 + rank], strides, strict=True):
            term = position if stride == 1 else arith.MulIOp(position, constant(stride)).result
            linear = term if linear is None else arith.AddIOp(linear, term).result
        ahead = arith.AddIOp(linear, constant(distance // element_bytes)).result
        for line in range(lines):
            at = ahead
            if line:
                at = arith.AddIOp(ahead, constant(line * LINE_BYTES // element_bytes)).result
            at = arith.MinUIOp(at, constant(last)).result
            memref.PrefetchOp(flat, [at], isWrite=False, localityHint=L2_HINT, isDataCache=True)
    return lines
