"""Which path a dense channels-first convolution takes: the direct kernel or the implicit
GEMM (:mod:`stagegraph.stages.x86.conv.gemm`), by a cost model over its shape and the
target.

Both estimates are in cycles of one core; the FMA peak (vector lanes times FMA units) and
the L2 size come from the :class:`~stagegraph.stages.target.Target`, the other constants
are :class:`~stagegraph.stages.x86.conv.config.ConvGemmConfig` fields, fitted by
``benchmarks/conv_paths.py`` (see docs/measurements.md, "Convolutions: direct or GEMM").

* **Direct** (channels-last, register blocked along the filters and the output width):
  ``flops / (peak * direct_peak_fraction * lanes used * C / (C + direct_channels_half)
  / (1 + direct_l1_weight * S / L1))``: "lanes used" the filters over the filters rounded
  up to whole vectors; few input channels (an RGB image's 3) leave each tap's reduction
  too short to hide the loads; ``S`` the filter slice a register block reads per output
  tile (two vectors of filters over every channel and tap), reloaded from L2 once it
  outgrows L1. A 1-D convolution has no channels-last direct form: it runs at
  ``direct_1d_fraction``. When the whole filter outgrows L2 it streams from L3 once per
  output row, at ``direct_weight_bytes_per_cycle``.
  The input rows one output row's windows read, against L1, weigh
  ``direct_rows_l1_weight`` (0 by default: what it measured was a transpose's cost).
* **Direct, 3-D**: the channels-last 3-D kernel (:mod:`.direct3d`, on unless
  ``GenericParams.conv3d_direct`` turns it off) estimates its own cycles from its register
  blocking (:func:`~.direct3d_plan.plan_blocks`: FMAs, loads and the FMA latency per
  reduction step, the taps that read only a zero-padded border skipped); the path runs
  at ``direct3d_efficiency`` of that estimate. Shapes the kernel does not take (filters
  ending in a partial vector past ``MAX_VECTORS`` vectors) keep the estimate above.
* **GEMM**: the matmul (``F`` rows, ``N*O`` columns, ``C*T`` deep) at
  ``gemm_peak_fraction * F / (F + gemm_rows_half) * C*T / (C*T + gemm_depth_half)``
  (few filters: short micro-kernel row blocks, and the packing of the patch matrix is
  shared by fewer rows; a short reduction: each K panel's accumulator loads and stores
  and packing spread over few FMAs), plus the
  patch copy, ``patch_cycles`` per element while the patch matrix of one block (of one
  image's output rows, see :mod:`stagegraph.stages.x86.conv.gemm_blocks`) fits L2 and
  ``patch_spill_cycles`` beyond, and the output's transpose at the same rate where
  several images too narrow to run one by one share one GEMM.

* **Winograd** (3x3, stride 1, 2-D, f32; :mod:`stagegraph.stages.x86.conv.winograd`):
  :func:`~stagegraph.stages.x86.conv.winograd_cost.winograd_cycles`, the ``alpha^2`` matmuls
  plus the transforms; it wins only by ``winograd_margin``.

The smallest estimate wins. ``ConvGemmConfig.path`` forces one path on every convolution,
``ConvGemmConfig.paths`` on single ones by :func:`conv_key`; ``x86.normalize`` stamps its
decision, both estimates and the key on the op it leaves (the kept convolution, or the
GEMM's matmul) as :data:`PATH_ATTRIBUTE`, so ``--print-ir-after normalize`` shows it and
:func:`stamped_choices` reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.conv.rates import element_bits, peak_per_cycle

#: The discardable attribute ``x86.normalize`` puts on each decided convolution's op.
PATH_ATTRIBUTE = "stagegraph.conv_path"


@dataclass(frozen=True)
class PathChoice:
    """One convolution's decision: its ``key``, the ``path`` taken, both estimates (cycles
    of one core) and what decided (``cost model``, ``path``, ``paths`` or ``shape``: a
    shape the GEMM does not take, see :func:`~stagegraph.stages.x86.conv.gemm.gemm_worth`)."""

    key: str
    path: str
    direct_cycles: float
    gemm_cycles: float
    decided_by: str
    winograd_cycles: float = 0.0  # 0: Winograd not considered


def conv_key(shape: ConvShape) -> str:
    """A convolution's name in ``ConvGemmConfig.paths``: rank, images, channels, filters,
    window, output, strides, dilations (``conv2d.n1.c64.f64.k3x3.o56x56.s1x1.d1x1``)."""

    def dims(values: tuple[int, ...]) -> str:
        return "x".join(str(v) for v in values)

    return (
        f"conv{len(shape.taps)}d.n{shape.n}.c{shape.c}.f{shape.f}.k{dims(shape.taps)}"
        f".o{dims(shape.out)}.s{dims(shape.strides)}.d{dims(shape.dilations)}"
    )


def flops(shape: ConvShape) -> int:
    """Multiplies and adds of the convolution."""
    return 2 * shape.f * shape.depth * shape.columns


def direct3d_cycles(
    shape: ConvShape,
    target: Target,
    config: ConvGemmConfig,
    element: str = "f32",
    padding: Sequence[tuple[int, int]] | None = None,
) -> float | None:
    """The 3-D kernel's estimated cycles over ``direct3d_efficiency``, or ``None`` when
    it does not take ``shape``; ``padding`` (real size, low pad per spatial dim) when the
    input is zero-padded (see the module)."""
    from stagegraph.stages.x86.conv.direct3d_plan import Conv3dShape, Window, plan_blocks

    bits = element_bits(element)
    if len(shape.taps) != 3 or bits not in (32, 64):
        return None
    windows = []
    for d in range(3):
        reach = (shape.out[d] - 1) * shape.strides[d] + (shape.taps[d] - 1) * shape.dilations[d]
        size, pad = padding[d] if padding else (reach + 1, 0)
        windows.append(Window(shape.out[d], shape.taps[d], shape.strides[d],
                              shape.dilations[d], size, pad))  # fmt: skip
    lanes = max(1, target.vector_bits // bits)
    fma_units = max(1, target.fma_lanes_per_cycle() // max(1, target.vector_bits // 32))
    conv = Conv3dShape(shape.n, shape.c, shape.f, tuple(windows))  # type: ignore[arg-type]
    plan = plan_blocks(conv, lanes, target.vector_registers, fma_units)
    return None if plan is None else plan.cycles / config.direct3d_efficiency


def direct_cycles(
    shape: ConvShape,
    target: Target,
    config: ConvGemmConfig,
    element: str = "f32",
    padding: Sequence[tuple[int, int]] | None = None,
) -> float:
    """The direct path's estimated cycles (see the module)."""
    bits = element_bits(element)
    kernel = direct3d_cycles(shape, target, config, element, padding) if config.direct3d else None
    if kernel is not None:
        return kernel
    if len(shape.taps) == 1:
        fraction = config.direct_1d_fraction
    else:
        lanes = max(1, target.vector_bits // bits)
        used = shape.f / (math.ceil(shape.f / lanes) * lanes)
        channels = shape.c / (shape.c + config.direct_channels_half)
        # the filter slice one register block reads per output tile (two vectors of filters
        # over every channel and tap), against L1: past it, every tile reloads it from L2
        block = shape.depth * 2 * lanes * bits // 8 / target.l1d_bytes
        # the input rows one output row's windows read (every channel, the window's rows),
        # against L1: past it, each filter tile of the row reloads them from L2
        reach = (
            (shape.out[-1] - 1) * shape.strides[-1] + shape.dilations[-1] * (shape.taps[-1] - 1) + 1
        )
        rows = shape.c * math.prod(shape.taps[:-1]) * reach * bits // 8 / target.l1d_bytes
        fraction = (
            config.direct_peak_fraction * used * channels
            / (1 + config.direct_l1_weight * block) / (1 + config.direct_rows_l1_weight * rows)
        )  # fmt: skip
    cycles = flops(shape) / (peak_per_cycle(target, element) * fraction)
    weight_bytes = shape.f * shape.depth * bits // 8
    if weight_bytes > target.l2_bytes:
        rows = shape.n * math.prod(shape.out[:-1])
        cycles += rows * weight_bytes / config.direct_weight_bytes_per_cycle
    return cycles


def gemm_cycles(
    shape: ConvShape, target: Target, config: ConvGemmConfig, element: str = "f32"
) -> float:
    """The implicit GEMM's estimated cycles: matmul plus patch copy (see the module)."""
    bits = element_bits(element)
    fraction = (
        config.gemm_peak_fraction * shape.f / (shape.f + config.gemm_rows_half)
        * shape.depth / (shape.depth + config.gemm_depth_half)
    )  # fmt: skip
    cycles = flops(shape) / (peak_per_cycle(target, element) * fraction)
    from stagegraph.stages.x86.conv.gemm_blocks import block_rows, per_image

    # the patch matrix of one block of one image's output rows (gemm_blocks), or of all
    # images, then transposed, when they are too narrow to run one by one
    rows = block_rows(shape, target, config, element)
    alone = rows < shape.out[0] or per_image(shape, target, config, element)
    block = shape.depth * rows * math.prod(shape.out[1:]) * (1 if alone else shape.n)
    per_element = (
        config.patch_cycles if block * bits // 8 <= target.l2_bytes else config.patch_spill_cycles
    )
    moved = shape.depth * shape.columns + (0 if alone or shape.n == 1 else shape.f * shape.columns)
    return cycles + moved * per_element


def choose_path(
    shape: ConvShape,
    target: Target,
    config: ConvGemmConfig,
    element: str = "f32",
    padding: Sequence[tuple[int, int]] | None = None,
) -> PathChoice:
    """The path of a convolution the GEMM may take: ``config.paths`` for its key, else
    ``config.path`` when it forces one, else the cheaper estimate (``padding``: of a
    zero-padded input, see :func:`direct3d_cycles`)."""
    from stagegraph.stages.x86.conv.winograd_cost import winograd_cycles, winograd_worth

    key = conv_key(shape)
    direct = direct_cycles(shape, target, config, element, padding)
    gemm = gemm_cycles(shape, target, config, element)
    worth = winograd_worth(shape, config, element)
    winograd = winograd_cycles(shape, target, config, element) if worth else 0.0
    if key in config.paths and (worth or config.paths[key] != "winograd"):
        return PathChoice(key, config.paths[key], direct, gemm, "paths", winograd)
    if config.path != "auto" and (worth or config.path != "winograd"):
        return PathChoice(key, config.path, direct, gemm, "path", winograd)
    path = "gemm" if gemm < direct else "direct"
    if worth and winograd * config.winograd_margin < min(gemm, direct):
        path = "winograd"
    return PathChoice(key, path, direct, gemm, "cost model", winograd)


def path_attribute(choice: PathChoice) -> Any:
    """``choice`` as the dictionary attribute :data:`PATH_ATTRIBUTE` holds."""
    from stagegraph.mlir.bindings import ir

    i64 = ir.IntegerType.get_signless(64)
    fields = {
        "key": ir.StringAttr.get(choice.key),
        "path": ir.StringAttr.get(choice.path),
        "decided_by": ir.StringAttr.get(choice.decided_by),
        # whole cycles as i64: an f64 this large prints in hex
        "direct_cycles": ir.IntegerAttr.get(i64, round(choice.direct_cycles)),
        "gemm_cycles": ir.IntegerAttr.get(i64, round(choice.gemm_cycles)),
        "winograd_cycles": ir.IntegerAttr.get(i64, round(choice.winograd_cycles)),
    }
    return ir.DictAttr.get(fields)


def stamped_choices(module: Any) -> list[PathChoice]:
    """The decisions ``x86.normalize`` stamped on ``module``'s functions' ops, in walk
    order."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect, top_level_ops

    found = []
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        # a blocked GEMM's matmul sits in its loop (gemm_blocks)
        for op in collect(fn, lambda op: PATH_ATTRIBUTE in op.attributes):
            fields = ir.DictAttr(op.attributes[PATH_ATTRIBUTE])

            def text(name: str, fields: Any = fields) -> str:
                return ir.StringAttr(fields[name]).value

            def number(name: str, fields: Any = fields) -> float:
                return float(ir.IntegerAttr(fields[name]).value)

            winograd = number("winograd_cycles") if "winograd_cycles" in fields else 0.0
            found.append(
                PathChoice(text("key"), text("path"), number("direct_cycles"),
                           number("gemm_cycles"), text("decided_by"), winograd)
            )  # fmt: skip
    return found
