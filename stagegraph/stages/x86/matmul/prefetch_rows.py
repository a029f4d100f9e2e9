"""Software prefetch for the packing loops that read rows of a matrix a few elements at a time.

Packing A for AVX2's 6x16 register tile reads six rows of A eight elements at a time (half a
cache line per row and step) and transposes them. Each panel starts six new row streams,
which the hardware prefetchers pick up only after their first lines have missed: at 512^3
the packing spent most of its time waiting on those loads. The schedule marks such a loop
(:data:`PREFETCH_ROWS_ATTR`); after bufferization, :func:`prefetch_rows` puts a
``memref.prefetch`` of every row a vector read covers, :data:`PREFETCH_BYTES` ahead along
the row, before the read. (Measured: docs/measurements.md, "Design decisions: the packed
matmul kernel".)
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import arith, dialect, ir
from stagegraph.mlir.walk import collect

#: Set by the matmul schedule on a packing step loop whose reads are rows of its source.
PREFETCH_ROWS_ATTR = "stagegraph.prefetch_rows"
#: How far ahead along a row (four cache lines; 512 B gained less).
PREFETCH_BYTES = 256


def prefetch_rows(module: Any) -> int:
    """Prefetch ahead of the row reads of every marked loop of ``module`` (buffer level);
    strip the marks. Returns how many prefetches were inserted. A read that is not of
    rows (a permuted or broadcast read, or one from a tensor) gets none."""
    count = 0
    for loop in collect(module, lambda op: PREFETCH_ROWS_ATTR in op.attributes):
        del loop.attributes[PREFETCH_ROWS_ATTR]
        for read in collect(loop, "vector.transfer_read"):
            count += _prefetch_ahead_of(read)
    return count


def _prefetch_ahead_of(read: Any) -> int:
    source = read.operands[0]
    if not isinstance(source.type, ir.MemRefType):
        return 0
    memref_type = ir.MemRefType(source.type)
    vector_shape = ir.VectorType(read.results[0].type).shape
    rank = memref_type.rank
    minor_identity = ir.AffineMap.get_minor_identity(rank, len(vector_shape))
    if ir.AffineMapAttr(read.attributes["permutation_map"]).value != minor_identity:
        return 0
    element_bytes = max(1, memref_type.element_type.width // 8)
    rows = vector_shape[-2] if len(vector_shape) >= 2 else 1
    indices = list(read.operands[1 : 1 + rank])
    index = ir.IndexType.get()
    memref = dialect("memref")
    with ir.InsertionPoint(read), read.location:
        distance = arith.ConstantOp(index, PREFETCH_BYTES // element_bytes).result
        ahead = arith.AddIOp(indices[-1], distance).result
        for row in range(rows):
            leading = indices[:-1]
            if row:
                offset = arith.ConstantOp(index, row).result
                leading = [*leading[:-1], arith.AddIOp(leading[-1], offset).result]
            memref.PrefetchOp(
                source, [*leading, ahead], isWrite=False, localityHint=3, isDataCache=True
            )
    return rows
