"""The measured FMA peak's loop: independent FMA chains that compute what they should."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.app.fma_peak import (
    OFFSET,
    SCALE,
    TRIPS,
    build_fma_loop,
    chain_start,
    fma_peak_gflops,
)
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import detect_target


@pytest.mark.parametrize("threads", [1, 2])
def test_fma_loop_runs_its_chains_on_every_thread(threads):
    """Each chain is x <- SCALE x + OFFSET for TRIPS trips: it ends at
    1 + (start - 1) SCALE^TRIPS, so each lane of each thread's row holds the sum of that over
    the chains, and a chain folded away or skipped would show (it would keep its start).
    The lowered loop body has one FMA per chain."""
    target = detect_target()
    loop = build_fma_loop(threads, target)
    assert loop.chains == target.vector_registers - 4
    loop.run()
    a, b = float(np.float32(SCALE)), float(np.float32(OFFSET))  # f32, as the loop has them
    limit, decay = b / (1 - a), a**TRIPS
    expected = sum(limit + (chain_start(c) - limit) * decay for c in range(loop.chains))
    np.testing.assert_allclose(loop.out, np.full_like(loop.out, expected), rtol=1e-3)
    lanes = target.vector_bits // 32
    assert loop.flops == 2.0 * TRIPS * loop.chains * lanes * threads
    fmas = collect(loop.module, "llvm.intr.fmuladd")
    assert len(fmas) == loop.chains
    assert fma_peak_gflops(threads, target, seconds=0.05) > 0
