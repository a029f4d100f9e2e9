"""The measured FMA peak's loop: independent FMA chains that compute what they should."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.app.fma_peak import TRIPS, build_fma_loop, fma_peak_gflops
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import detect_target


@pytest.mark.parametrize("threads", [1, 2])
def test_fma_loop_runs_its_chains_on_every_thread(threads):
    """Each chain is x <- 0.999 x + 0.001 for TRIPS trips from near 1: it ends at 1, so each
    thread's row holds the chain count; the lowered loop body has one FMA per chain."""
    target = detect_target()
    loop = build_fma_loop(threads, target)
    assert loop.chains == target.vector_registers - 4
    loop.run()
    np.testing.assert_allclose(loop.out, np.full_like(loop.out, loop.chains), rtol=1e-4)
    lanes = target.vector_bits // 32
    assert loop.flops == 2.0 * TRIPS * loop.chains * lanes * threads
    fmas = collect(loop.module, "llvm.intr.fmuladd")
    assert len(fmas) == loop.chains
    assert fma_peak_gflops(threads, target, seconds=0.05) > 0
