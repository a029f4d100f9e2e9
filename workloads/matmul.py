"""``matmul``: ``C = A @ B`` into a fresh zero-filled accumulator.

The accumulator is ``tensor.empty`` + ``linalg.fill``, never an argument: accumulating into a
read-only argument makes bufferization copy the whole matrix. ``dtype=bf16`` takes bf16
inputs (numpy arrays of uint16 bit patterns) and accumulates and returns f32.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import Field

from stagegraph.workload import (
    Complexity,
    TensorSpec,
    Workload,
    WorkloadParams,
    decode,
    register,
)
from stagegraph.workload.verify import rms

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir

ACCUMULATOR = {"f32": "f32", "bf16": "f32"}


def element_type(dtype: str) -> ir.Type:
    """The MLIR element type for a dtype name (inside an active context)."""
    from stagegraph.mlir.bindings import ir

    return {"f32": ir.F32Type, "bf16": ir.BF16Type, "f16": ir.F16Type, "f64": ir.F64Type}[
        dtype
    ].get()


def tensor_type(spec: TensorSpec) -> ir.RankedTensorType:
    from stagegraph.mlir.bindings import ir

    return ir.RankedTensorType.get(list(spec.shape), element_type(spec.dtype))


def zero_filled_matmul(a: ir.Value, b: ir.Value, shape: list[int], acc: ir.Type) -> ir.Value:
    """``linalg.matmul(a, b)`` into ``fill(0, tensor.empty(shape))`` of element type ``acc``."""
    from stagegraph.mlir.bindings import arith, tensor
    from stagegraph.mlir.build import named_structured_op

    empty = tensor.EmptyOp(shape, acc).result
    zero = arith.ConstantOp(acc, 0.0).result
    filled = named_structured_op("linalg.fill", [zero], [empty])
    return named_structured_op("linalg.matmul", [a, b], [filled])


def build_module(arg_specs: list[TensorSpec], body: Callable[..., Any]) -> ir.Module:
    """A module with one public ``func.func @main(args) -> body(args)``."""
    from stagegraph.mlir.bindings import func, ir

    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        func.FuncOp.from_py_func(*(tensor_type(s) for s in arg_specs), name="main")(body)
    return module


class MatmulParams(WorkloadParams):
    m: int = Field(256, gt=0, description="rows of A and C")
    n: int = Field(256, gt=0, description="columns of B and C")
    k: int = Field(256, gt=0, description="reduction length")
    dtype: Literal["f32", "bf16"] = "f32"


@register
class Matmul(Workload):
    """``C[m,n] = A[m,k] @ B[k,n]``."""

    name = "matmul"
    Params = MatmulParams
    params: MatmulParams

    def input_specs(self) -> list[TensorSpec]:
        p = self.params
        return [
            TensorSpec(shape=(p.m, p.k), dtype=p.dtype),
            TensorSpec(shape=(p.k, p.n), dtype=p.dtype),
        ]

    def output_specs(self) -> list[TensorSpec]:
        p = self.params
        return [TensorSpec(shape=(p.m, p.n), dtype=ACCUMULATOR[p.dtype])]

    def build(self) -> ir.Module:
        p = self.params
        acc = element_type(ACCUMULATOR[p.dtype])
        return build_module(
            self.input_specs(), lambda a, b: zero_filled_matmul(a, b, [p.m, p.n], acc)
        )

    def _compute_reference(self) -> list[np.ndarray]:
        a, b = (decode(x, self.params.dtype) for x in self.inputs())
        return [a @ b]

    @property
    def reduction_length(self) -> int:
        return self.params.k

    def magnitudes(self) -> list[float]:
        """``sqrt(k) * rms(A) * rms(B)``: the size of a sum of ``k`` such products with random
        signs, i.e. of the partial sums whose rounding errors accumulate. It equals ``rms(C)``
        for random operands and keeps the scale when ``C`` is small by cancellation."""
        a, b = (decode(x, self.params.dtype) for x in self.inputs())
        return [float(np.sqrt(self.params.k)) * rms(a) * rms(b)]

    @property
    def complexity(self) -> Complexity:
        p = self.params
        moved = sum(s.nbytes for s in self.input_specs() + self.output_specs())
        return Complexity(flops=2 * p.m * p.n * p.k, bytes_moved=moved)

    def numpy_equivalent(self) -> Callable[..., list[np.ndarray]] | None:
        """``a @ b`` for f32; None for bf16 (numpy has no bf16 arithmetic)."""
        if self.params.dtype != "f32":
            return None
        return lambda a, b: [a @ b]
