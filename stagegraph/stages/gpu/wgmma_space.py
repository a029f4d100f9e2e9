"""The wgmma kernels' search space (sm_90a): block tile width and pipeline depth, with the
z3 rules that keep a choice buildable on the target.

Declared beside :class:`~stagegraph.stages.gpu.params.KernelPlan` for the op kind
:data:`~stagegraph.stages.gpu.params.WGMMA_KIND`, so ``tune`` searches it like any other
space. The rules are the ones :func:`stagegraph.stages.gpu.wgmma.choose` applies: exact
tiles, no more loads in flight (``stages - 1``) than K steps, every stage (and the
epilogue's f32 C tile) within the target's opt-in shared memory per block, and the
accumulator within the registers a thread of a 128-thread block may hold.
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.tunable import Choice, declare_space
from stagegraph.stages.gpu.params import WGMMA_KIND, KernelPlan
from stagegraph.stages.gpu.wgmma import (
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
    """Named constraints over ``tile_n`` and ``stages`` (z3 expressions or plain values)."""
    m, n, k = op.loop_ranges[-3:]
    limit = target.shared_bytes_per_block_optin
    # stage_bytes is affine in tile_n: its value at 0 and its slope.
    base, per_n = stage_bytes(0), stage_bytes(1) - stage_bytes(0)
    return {
        f"block_rows_divide_m={m}": m % TILE_M == 0,
        f"tile_n_divides_n={n}": n % p.tile_n == 0,
        f"stages_within_k_steps={k // TILE_K}": p.stages <= k // TILE_K + 1,
        f"stages_fit_shared={limit}B": p.stages * (base + per_n * p.tile_n) + SHARED_ALIGN
        <= limit,
        f"c_tile_fits_shared={limit}B": TILE_M * 4 * p.tile_n + SHARED_ALIGN <= limit,
        f"accumulator_fits_registers={thread_registers(target)}": TILE_M * p.tile_n
        <= WARPGROUP * (thread_registers(target) - REGISTER_RESERVE),
    }


declare_space(
    KernelPlan, WGMMA_KIND, {"tile_n": Choice(TILE_NS), "stages": Choice(STAGES)},
    wgmma_space_rules, applies_to=lambda target: getattr(target, "arch", "") == "sm_90a",
)  # fmt: skip
