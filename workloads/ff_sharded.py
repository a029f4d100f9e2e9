"""``ff-sharded``: the feed-forward block ``sigmoid(A @ B) @ C`` annotated for MPI ranks.

Weight-stationary partitioning: each rank keeps its slice of the weights ``B[k, n]`` and
``C[n, k]``; activations move.

* 1-D grid ``N``: ``B`` split on columns (``n``), ``C`` on rows (``n``), ``A`` and the result
  replicated. The second matmul yields partial sums, which an all-reduce completes.
* 2-D grid ``RxC``: ``B`` split ``k`` over grid axis 0 and ``n`` over axis 1, ``C`` split
  ``n`` over axis 1 and ``k`` over axis 0; ``A`` and the result split ``k`` over axis 0. Each
  rank holds ``1/(R*C)`` of each weight; the two matmuls end in all-reduces over axis 0 and
  axis 1 respectively.

Payload and reference come from :mod:`stagegraph.workloads.ff`; this module only adds the
``shard`` annotations and the sharding layout (:meth:`FeedForwardSharded.layout`) that the
MPI runner uses to scatter inputs and gather results.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from stagegraph.workload import Complexity, TensorSpec, Workload, register
from stagegraph.workload.layout import Layout, Split, local_slices, owns_block  # noqa: F401

from .ff import FeedForward, FfParams, _ff, sigmoid
from .matmul import build_module, zero_filled_matmul

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir

GRID = "grid"
_GRID_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)?$")


class FfShardedParams(FfParams):
    grid: str = Field("2", description="device grid: N (1-D) or RxC (2-D)")

    @field_validator("grid")
    @classmethod
    def _grid_shape(cls, value: str) -> str:
        if not _GRID_RE.match(value):
            raise ValueError(f"grid must look like N or RxC (e.g. 4 or 2x2), got {value!r}")
        return value

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.grid.split("x"))


@register
class FeedForwardSharded(Workload):
    """``sigmoid(A @ B) @ C`` with weight-stationary ``shard`` annotations."""

    name = "ff-sharded"
    Params = FfShardedParams
    params: FfShardedParams

    def __init__(self, params: FfShardedParams | None = None, /, **values: Any) -> None:
        super().__init__(params, **values)
        self._check_divisible()

    def _dense(self) -> FeedForward:
        p = self.params
        return FeedForward(m=p.m, n=p.n, k=p.k, seed=p.seed)

    def layout(self) -> Layout:
        grid = self.params.grid_shape
        if len(grid) == 1:
            replicated: Split = ((), ())
            return Layout(
                grid=grid, inputs=(replicated, ((), (0,)), ((0,), ())), outputs=(replicated,)
            )
        return Layout(
            grid=grid,
            inputs=(((), (0,)), ((0,), (1,)), ((1,), (0,))),
            outputs=(((), (0,)),),
        )

    def _check_divisible(self) -> None:
        from stagegraph.errors import WorkloadParamError

        layout = self.layout()
        for spec, split in zip(
            self.input_specs() + self.output_specs(), layout.inputs + layout.outputs, strict=True
        ):
            for dim, axes in zip(spec.shape, split, strict=False):
                parts = int(np.prod([layout.grid[a] for a in axes], dtype=np.int64))
                if dim % parts:
                    raise WorkloadParamError(
                        f"workload {self.name!r}: dimension {dim} of shape {spec.shape} does "
                        f"not divide evenly over grid {self.params.grid}"
                    )

    def input_specs(self) -> list[TensorSpec]:
        return self._dense().input_specs()

    def output_specs(self) -> list[TensorSpec]:
        return self._dense().output_specs()

    def build(self) -> ir.Module:
        from stagegraph.mlir.bindings import dialect, ir

        shard = dialect("shard")
        p, layout = self.params, self.layout()
        f32 = ir.F32Type.get()

        def body(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
            a, b, c = (
                annotate(x, split, for_users=True)
                for x, split in zip((a, b, c), layout.inputs, strict=True)
            )
            hidden = sigmoid(zero_filled_matmul(a, b, [p.m, p.n], f32), [p.m, p.n])
            result = zero_filled_matmul(hidden, c, [p.m, p.k], f32)
            # a value's own sharding, then the one its user (the return) wants
            result = annotate(result, layout.outputs[0], for_users=False)
            return annotate(result, layout.outputs[0], for_users=True)

        def annotate(value: ir.Value, split: Split, for_users: bool) -> ir.Value:
            sharding = shard.sharding(GRID, split_axes_attr(split), [], [])
            return shard.shard(value, sharding, annotate_for_users=for_users or None)

        module = build_module(self.input_specs(), body)
        with ir.InsertionPoint.at_block_begin(module.body):
            shard.grid(GRID, list(layout.grid))
        return module

    def _compute_reference(self) -> list[np.ndarray]:
        return _ff(*(x.astype(np.float64) for x in self.inputs()))

    def _generate_inputs(self) -> list[np.ndarray]:
        return self._dense()._generate_inputs()

    @property
    def reduction_length(self) -> int:
        return self._dense().reduction_length

    @property
    def complexity(self) -> Complexity:
        return self._dense().complexity

    def numpy_equivalent(self) -> Callable[..., list[np.ndarray]] | None:
        return _ff

    @property
    def requirements(self) -> list[str]:
        return ["libmpi"]


def split_axes_attr(split: Split) -> ir.Attribute:
    """The ``shard`` grid-axes array attribute.

    The bindings have no builder for ``Shard_GridAxesArrayAttr`` (``ir.AttrBuilder`` does not
    contain it and ``shard`` has no attribute class), so the attribute is parsed from its
    assembly form — the one place this workload writes IR syntax.
    """
    from stagegraph.mlir.bindings import ir

    body = ", ".join("[" + ", ".join(str(a) for a in axes) + "]" for axes in split)
    return ir.Attribute.parse(f"#shard<axisarray[{body}]>")
