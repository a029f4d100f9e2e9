"""``ff``: the feed-forward block ``sigmoid(A @ B) @ C``, f32.

Shapes: ``A[m, k]`` (activations), ``B[k, n]`` (up-projection), ``C[n, k]`` (down-projection),
result ``[m, k]`` — the hidden width ``n`` is the reduction of the second matmul. The sigmoid
``1 / (1 + exp(-x))`` is a ``linalg.generic`` of ``arith`` ops and ``math.exp`` (lowered to
``llvm.intr.exp``, which the JIT resolves from the process's libm).
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import numpy as np
from pydantic import Field

from stagegraph.workload import Complexity, TensorSpec, Workload, WorkloadParams, register

from .matmul import build_module, zero_filled_matmul

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir

SIGMOID_FLOPS = 4  # neg, exp, add, div


def sigmoid(x: ir.Value, shape: list[int]) -> ir.Value:
    """Elementwise ``1 / (1 + exp(-x))`` into a fresh tensor."""
    from stagegraph.mlir.bindings import arith, dialect, ir, tensor
    from stagegraph.mlir.build import generic

    math = dialect("math")
    f32 = ir.F32Type.get()
    identity = ir.AffineMap.get_identity(len(shape))

    def body(value: ir.Value, _out: ir.Value) -> ir.Value:
        one = arith.ConstantOp(f32, 1.0)
        return arith.divf(one, arith.addf(one, math.exp(arith.negf(value))))

    empty = tensor.EmptyOp(shape, f32).result
    return generic([x], [empty], [identity, identity], ["parallel"] * len(shape), body)


class FfParams(WorkloadParams):
    m: int = Field(256, gt=0, description="rows (tokens)")
    n: int = Field(512, gt=0, description="hidden width")
    k: int = Field(256, gt=0, description="model width")


@register
class FeedForward(Workload):
    """``sigmoid(A @ B) @ C``."""

    name = "ff"
    Params = FfParams
    params: FfParams

    def input_specs(self) -> list[TensorSpec]:
        m, n, k = self.params.m, self.params.n, self.params.k
        return [
            TensorSpec(shape=(m, k), dtype="f32"),
            TensorSpec(shape=(k, n), dtype="f32"),
            TensorSpec(shape=(n, k), dtype="f32"),
        ]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec(shape=(self.params.m, self.params.k), dtype="f32")]

    def build(self) -> ir.Module:
        from stagegraph.mlir.bindings import ir

        m, n, k = self.params.m, self.params.n, self.params.k

        def body(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
            f32 = ir.F32Type.get()
            hidden = sigmoid(zero_filled_matmul(a, b, [m, n], f32), [m, n])
            return zero_filled_matmul(hidden, c, [m, k], f32)

        return build_module(self.input_specs(), body)

    def _compute_reference(self) -> list[np.ndarray]:
        return _ff(*(x.astype(np.float64) for x in self.inputs()))

    @property
    def reduction_length(self) -> int:
        return self.params.k + self.params.n

    @property
    def complexity(self) -> Complexity:
        m, n, k = self.params.m, self.params.n, self.params.k
        moved = sum(s.nbytes for s in self.input_specs() + self.output_specs())
        return Complexity(flops=4 * m * n * k + SIGMOID_FLOPS * m * n, bytes_moved=moved)

    def numpy_equivalent(self) -> Callable[..., list[np.ndarray]] | None:
        return _ff


def _ff(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[np.ndarray]:
    return [(1.0 / (1.0 + np.exp(-(a @ b)))) @ c]
