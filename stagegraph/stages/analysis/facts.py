"""The facts the analysis gives: what a cost model knows of a payload (pydantic schemas)."""

from __future__ import annotations

import math
import typing
from typing import Literal

from stagegraph.core.ports import Facts
from stagegraph.dtypes import byte_size
from stagegraph.stages.analysis.decisions import Decision

# In priority order: a payload is named by the first class it contains (``primary_class``).
OpClass = Literal["matmul", "convolution", "pooling", "reduction", "elementwise", "other"]
IteratorType = Literal["parallel", "reduction"]
CLASS_PRIORITY: tuple[OpClass, ...] = typing.get_args(OpClass)
# Signless integers and floats: what the analysis and the schedules handle.
SUPPORTED_DTYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"})


class ValueFacts(Facts):
    """A function argument/result or a linalg operand.

    ``shape`` is ``()`` for scalars; ``-1`` marks a dynamic size, which only functions other
    than the entry may have. ``type`` is the printed type, for display only.
    """

    kind: Literal["tensor", "memref", "scalar", "other"]
    shape: tuple[int, ...] = ()
    dtype: str
    type: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * byte_size(self.dtype, default=0)


class FunctionFacts(Facts):
    """A ``func.func`` of the payload (wrapper functions are not listed)."""

    name: str
    visibility: str = "public"
    has_body: bool = True
    arguments: tuple[ValueFacts, ...] = ()
    results: tuple[ValueFacts, ...] = ()


class ContractionFacts(Facts):
    """Sizes of a matmul-like op; ``*_dims`` are loop positions, sizes are their products.

    ``transpose_a`` means A is read k-major (``A[k, m]``), ``transpose_b`` means B is read
    ``B[n, k]`` (the ``matmul_transpose_b`` layout).
    """

    batch: int
    m: int
    n: int
    k: int
    batch_dims: tuple[int, ...] = ()
    m_dims: tuple[int, ...] = ()
    n_dims: tuple[int, ...] = ()
    k_dims: tuple[int, ...] = ()
    transpose_a: bool = False
    transpose_b: bool = False

    @property
    def is_matvec(self) -> bool:
        """m or n is 1 (matrix-vector, vector-matrix, dot): a row reduction with no reuse of
        either operand, which register tiles of an m x n micro-kernel would mostly pad."""
        return self.m == 1 or self.n == 1


class ConvolutionFacts(Facts):
    """Loop positions of a convolution or pooling op, with its strides and dilations."""

    batch: tuple[int, ...] = ()
    output_image: tuple[int, ...] = ()
    output_channel: tuple[int, ...] = ()
    filter_loop: tuple[int, ...] = ()
    input_channel: tuple[int, ...] = ()
    depth: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()


class OpFacts(Facts):
    """One linalg op of the entry function, in program order (``index``).

    ``producers`` names where each operand (inputs, then outputs) comes from: ``%argN`` for
    an entry argument, else the defining op (``linalg.transpose``, ``tensor.empty``, ...).
    ``indexing_maps`` are printed for display only; ``operand_dims`` gives, per operand
    (inputs, then outputs), the loop each of its dims is indexed by (-1: not a bare loop
    index, e.g. a sum or a constant), which is what cost models decide access patterns by.
    """

    index: int
    name: str
    op_class: OpClass
    inputs: tuple[ValueFacts, ...] = ()
    outputs: tuple[ValueFacts, ...] = ()
    producers: tuple[str, ...] = ()
    indexing_maps: tuple[str, ...] = ()
    iterator_types: tuple[IteratorType, ...] = ()
    loop_ranges: tuple[int, ...] = ()
    body_ops: tuple[str, ...] = ()
    operand_dims: tuple[tuple[int, ...], ...] = ()
    producer_ops: tuple[int, ...] = ()  # per operand: the linalg op (index) defining it, or -1
    flops: int = 0
    contraction: ContractionFacts | None = None
    convolution: ConvolutionFacts | None = None
    #: An input read through a map that is no projected permutation (a strided or shifted
    #: window, as in an implicit GEMM's patch copy): a target's schedule may have to fold
    #: the tiles' unit dims to vectorize them (the x86 generic schedule does).
    window_reads: bool = False

    def signature(self) -> str:
        """What the op is, independent of the payload it sits in: kind, op name, loop
        ranges and element types (``convolution linalg.conv_2d_nchw_fchw 1x8x30x30x3x3x3
        f32,f32->f32``). Tuned params are stored and found by it, so the same layer in
        another payload gets them."""
        ranges = "x".join(map(str, self.loop_ranges)) or "scalar"
        ins = ",".join(v.dtype for v in self.inputs)
        outs = ",".join(v.dtype for v in self.outputs)
        return f"{self.op_class} {self.name} {ranges} {ins}->{outs}"


class LayerFacts(Facts):
    """A matmul-like op and the chain of elementwise consumers that could be fused into it."""

    contraction: int  # index into PayloadFacts.ops
    epilogue: tuple[int, ...] = ()
    epilogue_ops: tuple[str, ...] = ()  # body ops of the epilogue, e.g. addf (bias), maximumf
    # The chain's single elementwise consumer of C's shape that changes the element type
    # (a rounding to a half output, often fused with the epilogue), if any; not in epilogue.
    cast: int | None = None
    init: int | None = None  # the linalg op writing the accumulator's start, read by it only
    batch: int = 1
    m: int = 1
    n: int = 1
    k: int = 1


class PayloadFacts(Facts):
    """What a cost model knows of a payload."""

    entry: str
    functions: tuple[FunctionFacts, ...]
    ops: tuple[OpFacts, ...] = ()
    layers: tuple[LayerFacts, ...] = ()
    classes: frozenset[OpClass] = frozenset()
    primary_class: OpClass | None = None  # first of CLASS_PRIORITY present
    flops: int = 0
    bytes: int = 0  # arguments + results of the entry function
    dtypes: frozenset[str] = frozenset()
    #: Choices rewrites before the analysis stamped on the entry's ops (see
    #: :mod:`stagegraph.stages.analysis.decisions`): a cost model's tunable defaults.
    decisions: tuple[Decision, ...] = ()

    @property
    def entry_function(self) -> FunctionFacts:
        return next(f for f in self.functions if f.name == self.entry)

    @property
    def reduction_length(self) -> int:
        """The longest chain of terms one output element accumulates (product of an op's
        reduction loop extents): what rounding errors grow with (the verifier's n)."""
        return max(
            (
                math.prod(r for r, it in zip(op.loop_ranges, op.iterator_types, strict=False)
                          if it == "reduction")
                for op in self.ops
            ),
            default=1,
        )  # fmt: skip

    def ops_of(self, op_class: OpClass) -> tuple[OpFacts, ...]:
        return tuple(op for op in self.ops if op.op_class == op_class)
