"""Which ops the x86 matmul schedule takes: pure facts, no MLIR, so a cost model can ask
without loading the transform dialects (:mod:`stagegraph.stages.x86.matmul.canonical`)."""

from __future__ import annotations

from stagegraph.dtypes import byte_size, is_float
from stagegraph.stages.analysis import CONTRACTION_OPS, ContractionFacts, OpFacts

# Matmul-like ops rewritten into linalg.matmul (per batch element) before scheduling: of
# the analysis' contractions, the plain and batched matmuls (either operand transposed)
# and linalg.contract (no matvec, packed mmt4d, batch-reduce or quantized form); and a
# linalg.generic whose facts make it a matmul.
_MATMUL_FORMS = ("matmul", "matmul_transpose_a", "matmul_transpose_b", "contract")
_CANONICALIZABLE = frozenset(
    name
    for name in CONTRACTION_OPS
    if name.removeprefix("linalg.").removeprefix("batch_") in _MATMUL_FORMS
) | {"linalg.generic"}


def canonicalizable(op: OpFacts) -> bool:
    """Whether :func:`canonicalize_contractions` turns this op into ``linalg.matmul``s: a
    float contraction with one m, one n and one k loop, any batch loops and no broadcast
    operand (each operand indexes all of its loops); with batch loops, m, n and k > 1."""
    c = op.contraction
    if op.op_class != "matmul" or c is None or op.name not in _CANONICALIZABLE:
        return False
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        return False
    if not (len(c.m_dims) == len(c.n_dims) == len(c.k_dims) == 1) or runs_as_matvec(c):
        return False  # a matvec runs as a vectorized reduction (the generic schedule)
    values = (*op.inputs, *op.outputs)
    if any(v.kind != "tensor" or not is_float(v.dtype) for v in values):
        return False
    if len({v.dtype for v in op.inputs}) != 1 or byte_size(op.inputs[0].dtype) > byte_size(
        op.outputs[0].dtype
    ):
        return False
    if c.batch_dims and c.k == 1:
        return False  # dropping the unit batch dim would drop this unit dim too (no matmul)
    rank = len(c.batch_dims) + 2
    return len(op.loop_ranges) == rank + 1 and all(len(v.shape) == rank for v in values)


def runs_as_matvec(c: ContractionFacts) -> bool:
    """Whether a contraction runs as a vectorized reduction (the generic schedule): a
    matrix-vector product (``is_matvec``) whose rows are read along k. One row of A
    against ``B[k, n]`` is not: the matmul kernel's register tile of one row reads B's
    rows along n, contiguously (as a reduction along k it read B's columns, one element
    per row: 48x PyTorch's time for 1024 -> 1000 at batch 1, Xeon, 1 thread)."""
    if not c.is_matvec:
        return False
    return not (c.m == 1 and c.n > 1 and not c.transpose_b and not c.batch_dims)


def matmul_like_ops(facts) -> list[OpFacts]:
    """The entry's ops that the matmul schedule handles, in walk order: one
    ``linalg.matmul`` site per op (per batch element, in a loop over the batch)."""
    return [op for op in facts.ops if canonicalizable(op)]


def reads_constant_b(op: OpFacts, facts) -> bool:
    """Whether a matmul's B is a compile-time constant, read as it is or through a
    transpose of a constant (``nn.Linear``'s weight): the schedule packs such a B once, at
    compile time (:mod:`stagegraph.stages.x86.matmul.constant_pack`), so packing costs the
    run nothing and always pays. Only a batch-free 2-D B qualifies (one matmul site)."""
    if len(op.producers) < 2 or len(op.inputs) < 2 or len(op.inputs[1].shape) != 2:
        return False
    if op.producers[1] == "arith.constant":
        return True
    if op.producers[1] != "linalg.transpose":
        return False
    shape = tuple(op.inputs[1].shape)
    transposes = [
        t for t in facts.ops
        if t.index < op.index and t.name == "linalg.transpose"
        and t.outputs and tuple(t.outputs[0].shape) == shape
    ]  # fmt: skip
    return bool(transposes) and all(t.producers[:1] == ("arith.constant",) for t in transposes)


def packs_b_from_memory(op: OpFacts) -> bool:
    """Whether a batch-free matmul packs its B per call straight from a tensor in memory
    (a function argument, a reshape of one, another kernel's result), not from a linalg op
    the schedule fuses into B's packing (a widening copy, an implicit GEMM's patch gather,
    :mod:`.patch_operands`, whose fused gather runs in one column block). Such a B may take
    column blocks sized to L2 (``heuristic.B_SLICE_L2_PARTS``)."""
    if len(op.producers) < 2 or len(op.inputs) < 2 or len(op.inputs[1].shape) != 2:
        return False
    return not op.producers[1].startswith("linalg.") and op.producers[1] != "arith.constant"
