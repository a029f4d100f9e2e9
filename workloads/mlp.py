"""``mlp``: a stack of ``relu(x @ W_i + b_i)`` layers (ReLU after every layer, the last too).

``widths=w0-w1-...-wL`` gives the input width ``w0`` and each layer's output width; the entry
takes ``x[batch, w0], W_1[w0, w1], b_1[w1], W_2, b_2, ...`` and returns ``[batch, wL]``.
Each layer is a zero-filled ``linalg.matmul`` followed by a ``linalg.generic`` that adds the
bias (broadcast along rows) and applies ReLU (``arith.maximumf`` with 0).
"""

from __future__ import annotations

import itertools
import typing
from collections.abc import Callable
from typing import Annotated

import numpy as np
from pydantic import Field

from stagegraph.workload import (
    Complexity,
    TensorSpec,
    Workload,
    WorkloadParams,
    random_array,
    register,
)

from .matmul import build_module, zero_filled_matmul

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir


def bias_relu(x: ir.Value, bias: ir.Value, shape: list[int]) -> ir.Value:
    """``max(x[i, j] + bias[j], 0)`` as one ``linalg.generic`` into a fresh tensor."""
    from stagegraph.mlir.bindings import arith, ir, tensor
    from stagegraph.mlir.build import generic

    f32 = ir.F32Type.get()
    identity = ir.AffineMap.get_identity(2)
    columns = ir.AffineMap.get(2, 0, [ir.AffineDimExpr.get(1)])

    def body(value: ir.Value, b: ir.Value, _out: ir.Value) -> ir.Value:
        return arith.maximumf(arith.addf(value, b), arith.ConstantOp(f32, 0.0))

    empty = tensor.EmptyOp(shape, f32).result
    return generic([x, bias], [empty], [identity, columns, identity], ["parallel"] * 2, body)


class MlpParams(WorkloadParams):
    batch: int = Field(64, gt=0, description="rows of x")
    widths: list[Annotated[int, Field(gt=0)]] = Field(
        [256, 512, 256], min_length=2, description="input width, then each layer's width"
    )


@register
class Mlp(Workload):
    """Multi-layer perceptron with bias and ReLU, f32."""

    name = "mlp"
    Params = MlpParams
    params: MlpParams

    @property
    def _layers(self) -> list[tuple[int, int]]:
        w = self.params.widths
        return list(itertools.pairwise(w))

    def input_specs(self) -> list[TensorSpec]:
        specs = [TensorSpec(shape=(self.params.batch, self.params.widths[0]), dtype="f32")]
        for fan_in, fan_out in self._layers:
            specs += [
                TensorSpec(shape=(fan_in, fan_out), dtype="f32"),
                TensorSpec(shape=(fan_out,), dtype="f32"),
            ]
        return specs

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec(shape=(self.params.batch, self.params.widths[-1]), dtype="f32")]

    def build(self) -> ir.Module:
        from stagegraph.mlir.bindings import ir

        batch, layers = self.params.batch, self._layers

        def body(x: ir.Value, *weights: ir.Value) -> ir.Value:
            f32 = ir.F32Type.get()
            for i, (_, fan_out) in enumerate(layers):
                product = zero_filled_matmul(x, weights[2 * i], [batch, fan_out], f32)
                x = bias_relu(product, weights[2 * i + 1], [batch, fan_out])
            return x

        return build_module(self.input_specs(), body)

    def _generate_inputs(self) -> list[np.ndarray]:
        """x in [-1, 1); weights He-uniform (keeps activations O(1) across layers); small biases."""
        rng = self._rng()
        specs = self.input_specs()
        arrays = [random_array(rng, specs[0])]
        for i, (fan_in, _) in enumerate(self._layers):
            arrays.append(random_array(rng, specs[1 + 2 * i], scale=float(np.sqrt(6.0 / fan_in))))
            arrays.append(random_array(rng, specs[2 + 2 * i], scale=0.1))
        return arrays

    def _compute_reference(self) -> list[np.ndarray]:
        inputs = [a.astype(np.float64) for a in self.inputs()]
        return _forward(*inputs)

    @property
    def reduction_length(self) -> int:
        return sum(self.params.widths[:-1])

    @property
    def complexity(self) -> Complexity:
        batch = self.params.batch
        flops = sum(2 * batch * i * o + 2 * batch * o for i, o in self._layers)
        moved = sum(s.nbytes for s in self.input_specs() + self.output_specs())
        return Complexity(flops=flops, bytes_moved=moved)

    def numpy_equivalent(self) -> Callable[..., list[np.ndarray]] | None:
        return _forward


def _forward(x: np.ndarray, *weights: np.ndarray) -> list[np.ndarray]:
    for w, b in zip(weights[::2], weights[1::2], strict=True):
        x = np.maximum(x @ w + b, 0)
    return [x]
