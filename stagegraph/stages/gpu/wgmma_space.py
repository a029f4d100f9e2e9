"""The wgmma kernels' search space (sm_90a): block tile width, pipeline depth and warp
specialization, with the z3 rules that keep a choice buildable on the target.

Declared beside :class:`~stagegraph.stages.gpu.params.KernelPlan` for the op kind
:data:`~stagegraph.stages.gpu.params.WGMMA_KIND`, so ``tune`` searches it like any other
space. The rules are the ones :func:`stagegraph.stages.gpu.wgmma.choose` applies: exact
tiles, no more loads in flight (``stages - 1``) than K steps, every stage (and the
epilogue's f32 C tile) within the target's opt-in shared memory per block, the
accumulator within a thread's registers (a plain block's 128 threads share 128 rows; a
warp-specialized block's two consumers 64 rows each, at their ``setmaxnreg`` count),
and a specialized block's threads and register split within the block's limits.
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.tunable import Choice, declare_space
from stagegraph.stages.gpu.kernel_plan import WGMMA_KIND, KernelPlan
from stagegraph.stages.gpu.wgmma import (
    CONSUMER_REGISTERS,
    CONSUMERS,
    PRODUCER_REGISTERS,
    REGISTER_RESERVE,
    SHARED_ALIGN,
    STAGES,
    TILE_K,
    TILE_M,
    TILE_NS,
    WARPGROUP,
    stage_bytes,
    thread_registers,
)


def wgmma_space_rules(p: Any, op: Any, target: Any, logic: Any) -> dict:
    """Named constraints over ``tile_n``, ``stages`` and ``warp_specialized`` (z3
    expressions or plain values; ``warp_specialized`` is 0 or 1)."""
    m, n, k = op.loop_ranges[-3:]
    limit = target.shared_bytes_per_block_optin
    ws = p.warp_specialized
    plain = thread_registers(target)
    # stage_bytes is affine in tile_n: its value at 0 and its slope.
    base, per_n = stage_bytes(0), stage_bytes(1) - stage_bytes(0)
    # Accumulator rows per consumer thread, times 128: 128 rows plain, 64 specialized.
    rows = TILE_M - (TILE_M - TILE_M // CONSUMERS) * ws
    budget = plain + (CONSUMER_REGISTERS - plain) * ws
    split = WARPGROUP * (PRODUCER_REGISTERS + CONSUMERS * CONSUMER_REGISTERS)
    return {
        f"block_rows_divide_m={m}": m % TILE_M == 0,
        f"tile_n_divides_n={n}": n % p.tile_n == 0,
        f"stages_within_k_steps={k // TILE_K}": p.stages <= k // TILE_K + 1,
        f"stages_fit_shared={limit}B": p.stages * (base + per_n * p.tile_n) + SHARED_ALIGN <= limit,
        f"c_tile_fits_shared={limit}B": TILE_M * 4 * p.tile_n + SHARED_ALIGN <= limit,
        f"accumulator_fits_registers={plain}|{CONSUMER_REGISTERS}": rows * p.tile_n
        <= WARPGROUP * (budget - REGISTER_RESERVE),
        f"threads_fit_block={target.max_threads_per_block}": WARPGROUP * (1 + CONSUMERS * ws)
        <= target.max_threads_per_block,
        f"register_split_fits_block={target.registers_per_block}": split * ws
        <= target.registers_per_block,
    }


declare_space(
    KernelPlan, WGMMA_KIND,
    {"tile_n": Choice(TILE_NS), "stages": Choice(STAGES), "warp_specialized": Choice((0, 1))},
    wgmma_space_rules, applies_to=lambda target: getattr(target, "arch", "") == "sm_90a",
)  # fmt: skip
