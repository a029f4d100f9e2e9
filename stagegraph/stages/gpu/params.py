"""The GPU cost model: how each linalg op of the payload maps to blocks and threads.

Every op becomes (at least) one kernel. Its parallel loops are split in two levels: the
innermost one or two parallel loops (the output's contiguous dims, so neighbouring threads
touch neighbouring elements) go to the threads of a block, up to ``threads_per_block``;
every other parallel loop goes to the grid, one block per index. Reduction loops stay
sequential inside each thread, except in a reduction over contiguous rows: there a
block of threads shares each row (:mod:`stagegraph.stages.gpu.reduction`). Tiles divide
their loop exactly (the largest divisor that fits), so every block and thread forall has
a static trip count the GPU mapping needs.
An op without parallel loops (a full reduction) is left unmapped: the GPU lowering runs it
in a kernel of one thread (:mod:`stagegraph.stages.gpu.host_kernels`).

Elementwise producers were fused into their consumers before (``gpu.normalize``); a fill
that initialises a reduction's output is its own kernel, launched before the reduction's.
"""

from __future__ import annotations

from pydantic import Field

from stagegraph.core.ports import Params
from stagegraph.core.stage import stage
from stagegraph.stages.analysis import OpFacts, PayloadFacts
from stagegraph.stages.common.costmodel import CostModelConfig, apply_overrides
from stagegraph.stages.gpu.kernel_plan import MMA_KIND, WGMMA_KIND, KernelPlan
from stagegraph.stages.gpu.simt_plan import plan_op, vector_width
from stagegraph.stages.gpu.target import GpuTarget


class GpuParams(Params):
    """``threads_per_block``: the most threads a kernel's block gets (a multiple of the
    warp size); ``kernels``: one plan per linalg op of the entry, in program order;
    ``tf32``: f32 matmuls on tensor cores through TF32 (off by default: it rounds the
    inputs to 10 mantissa bits, so results change); ``tensor_cores``: off puts every
    matmul on the SIMT path (to compare the two); ``wgmma``: off keeps sm_90a matmuls on
    ``mma.sync`` (to compare the two Hopper paths); ``epilogues``: a matmul's elementwise
    consumer and zero fill run in its kernel (:mod:`stagegraph.stages.gpu.epilogue`; off
    gives each its own kernel, to compare; on wgmma blocks the epilogue runs as the block
    copies its C tile out, :mod:`stagegraph.stages.gpu.wgmma_epilogue`); ``row_kernels``:
    a pointwise op and the row reductions it reads run in one kernel per row
    (:mod:`stagegraph.stages.gpu.row_fusion`; off: a kernel each, to compare)."""

    threads_per_block: int = Field(256, ge=32, le=1024, multiple_of=32)
    tf32: bool = False
    tensor_cores: bool = True
    wgmma: bool = True  # verified on an H200 (docs/measurements.md); false: mma.sync
    epilogues: bool = True  # a matmul's elementwise consumer and fill run in its kernel
    row_kernels: bool = True  # a pointwise op and the row reductions it reads: one kernel
    kernels: tuple[KernelPlan, ...] = ()

    def tuning_sites(self, facts: PayloadFacts, per_op: bool = False) -> list:
        """What a tuner varies: the block tile of each tensor-core kernel."""
        return gpu_tuning_sites(self, facts, per_op)


def plan_mma(op: OpFacts, target: GpuTarget, tf32: bool) -> KernelPlan | None:
    """A tensor-core plan (:mod:`stagegraph.stages.gpu.mma`) for a matmul that takes one on
    ``target`` (sm_80 and up), or None."""
    from stagegraph.dtypes import byte_size
    from stagegraph.stages.gpu.mma import WARP_GRID, WARP_SIZE, mma_shape
    from stagegraph.stages.gpu.mma_bounds import choose_block_tile

    shape = mma_shape(op, tf32) if target.sm >= 80 else None
    if shape is None:
        return None
    m, n, k = op.loop_ranges[-3:]
    if m < shape[0] or n < shape[1] or k < shape[2]:
        return None  # less than one instruction (a matrix-vector product): SIMT does better
    batches = op.loop_ranges[0] if len(op.loop_ranges) == 4 else 1
    size = byte_size(op.inputs[0].dtype, 2)
    block = choose_block_tile(m, n, k, batches, shape, size, target)
    if block is None:
        return None
    warps = WARP_GRID[0] * WARP_GRID[1]
    return KernelPlan(op=op.index, name=op.name, threads=(warps * WARP_SIZE,), mma=shape,
                      tile_m=block[0], tile_n=block[1])  # fmt: skip


@stage("params", name="gpu.heuristic")
def gpu_heuristic(facts: PayloadFacts, target: GpuTarget, config: CostModelConfig) -> GpuParams:
    """Blocks and threads per op from the target's block limit and the ops' loop ranges."""
    default = GpuParams.model_fields["threads_per_block"].default
    # Overrides first (validated, an invalid --param is a ConfigError naming the rule);
    # then the ops are mapped with the block size they settle on.
    params = apply_overrides(
        GpuParams(threads_per_block=min(default, target.max_threads_per_block)), config.overrides
    )
    if "kernels" in config.overrides:
        return params
    from stagegraph.stages.gpu.wgmma import plan_wgmma

    def wgmma_plan(op: OpFacts) -> KernelPlan | None:
        return plan_wgmma(op, target) if params.wgmma else None

    from stagegraph.stages.gpu.column_reduction import plan_column_reduction
    from stagegraph.stages.gpu.full_reduction import plan_full_reduction
    from stagegraph.stages.gpu.reduction import in_registers, plan_row_reduction

    tpb = params.threads_per_block
    kernels = [(params.tensor_cores and (wgmma_plan(op) or plan_mma(op, target, params.tf32)))
               or plan_row_reduction(op, target.warp_size, tpb)
               or plan_full_reduction(op, target.warp_size, tpb, target.sm_count)
               or plan_column_reduction(op, target.sm_count, target.max_threads_per_sm, tpb)
               or in_registers(op, plan_op(op, tpb, vector_width(op)))
               for op in facts.ops]  # fmt: skip
    if params.epilogues:
        from stagegraph.stages.gpu.epilogue import fuse_epilogues

        kernels = fuse_epilogues(kernels, facts)
    if params.row_kernels:
        from stagegraph.stages.gpu.row_fusion import fuse_rows

        kernels = fuse_rows(kernels, facts)
    return params.model_copy(update={"kernels": tuple(kernels)})


# -- search space (read by the tuner through stagegraph.core.tunable) ---------------------

#: Block tile sizes a tuner tries for a tensor-core matmul (rows and columns alike).
MMA_TILES = (16, 32, 64, 128, 256)


def gpu_tuning_sites(params: GpuParams, facts: PayloadFacts, per_op: bool = False) -> list:
    """One site per tensor-core kernel (its block tile); the SIMT mapping is not tuned."""
    from stagegraph.core.tunable import TuningSite

    ops = {op.index: op for op in facts.ops}
    return [
        TuningSite(f"op{plan.op}", ("kernels", i), KernelPlan, (ops[plan.op],),
                   kind_of=lambda op, wgmma=bool(plan.stages): WGMMA_KIND if wgmma else MMA_KIND)
        for i, plan in enumerate(params.kernels) if plan.mma and plan.op in ops
    ]  # fmt: skip


def mma_space_rules(p: object, op: OpFacts, target: GpuTarget, logic: object) -> dict:
    """The schedule's tiling rules for a tensor-core matmul: the block tile reaches past
    C's edge by less than a warp's rows (columns) and splits into the 2x2 warps' tiles of
    whole instructions (:func:`stagegraph.stages.gpu.mma_bounds.whole_warp_tiles`), the
    warp fragments within the registers a thread may hold
    (:func:`~stagegraph.stages.gpu.mma.fragment_registers`, multiplied through by 128 to
    stay free of division; fewer for a partial tile, whose masks take registers too), and
    the cp.async stages within
    static shared memory (:func:`~stagegraph.stages.gpu.mma_staged.shared_bytes`)."""
    from stagegraph.dtypes import byte_size
    from stagegraph.stages.gpu.mma import WARP_GRID, register_budget
    from stagegraph.stages.gpu.mma_bounds import MASK_REGISTERS
    from stagegraph.stages.gpu.mma_staged import STATIC_SHARED_BYTES, shared_bytes

    m, n, k = op.loop_ranges[-3:]
    shape = tuple(p.mma)
    warps = WARP_GRID[0] * WARP_GRID[1]
    size = byte_size(op.inputs[0].dtype, 2)
    # shared_bytes is affine in (wm, wn) = (tile_m, tile_n) / 2: its value at 0 and slopes.
    base = shared_bytes(0, 0, shape[2], size, warps)
    per_m = shared_bytes(1, 0, shape[2], size, warps) - base
    per_n = shared_bytes(0, 1, shape[2], size, warps) - base
    fragments = p.tile_m * p.tile_n + 16 * p.tile_m + 16 * p.tile_n
    budget = register_budget(target.registers_per_block)
    return {  # partial tiles are masked (gpu.mma_bounds): a tile may pass C's edge by a warp's
        f"tile_m_within_m={m}": p.tile_m <= m + WARP_GRID[0] * shape[0] - 1,
        f"tile_n_within_n={n}": p.tile_n <= n + WARP_GRID[1] * shape[1] - 1,
        "warp_rows_whole_instructions": p.tile_m % (WARP_GRID[0] * shape[0]) == 0,
        "warp_cols_whole_instructions": p.tile_n % (WARP_GRID[1] * shape[1]) == 0,
        "fragments_fit_registers": fragments <= 128 * budget,
        # A partial tile's masks take registers too (gpu.mma_bounds.fits_registers).
        "masked_fragments_fit_registers": logic.Or(
            logic.And(m % p.tile_m == 0, n % p.tile_n == 0, k % shape[2] == 0),
            fragments <= 128 * (budget - MASK_REGISTERS),
        ),
        # Every warp's cp.async stages of its A and B tiles (gpu.mma_staged), times 2.
        f"staging_fits_shared={STATIC_SHARED_BYTES}B": 2 * base
        + p.tile_m * per_m
        + p.tile_n * per_n
        <= 2 * STATIC_SHARED_BYTES,
    }


def _declare() -> None:
    from stagegraph.core.tunable import Choice, declare_space

    declare_space(
        KernelPlan, MMA_KIND, {"tile_m": Choice(MMA_TILES), "tile_n": Choice(MMA_TILES)},
        mma_space_rules, applies_to=lambda target: getattr(target, "sm", 0) >= 80,
    )  # fmt: skip


_declare()
import stagegraph.stages.gpu.wgmma_space  # noqa: E402,F401  (declares the wgmma space)
