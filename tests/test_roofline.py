"""The analytical roofline's traffic model: every operand's bytes count at its cache level.

Regression tests for a dict keyed by level that kept one operand per level: A's block and
B's panel at the same level dropped one of them, and the L1 micro-kernel loads overwrote
whatever else streamed from L1, so the ranking ignored tile sizes it should have punished.
"""

from __future__ import annotations

import math

import pytest

from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul import roofline as roofline
from stagegraph.stages.x86.matmul.params import MatmulParams
from stagegraph.stages.x86.matmul.roofline import estimate_seconds, traffic_by_level

#: A pinned machine, so the levels below do not depend on the host's caches.
TARGET = Target(isa=frozenset({"avx2", "fma"}), cores=1, vector_bits=256, l1d_bytes=32 * 1024,
                l2_bytes=1024 * 1024, l3_bytes=8 * 1024 * 1024, frequency_ghz=2.5)  # fmt: skip
M = N = K = 512
ELEM = 4


def params(**fields) -> MatmulParams:
    base = dict(tile_m=64, tile_n=256, tile_k=0, reg_m=4, reg_n=32, vector_width=8,
                vector_registers=32, pack=False, threads=1)  # fmt: skip
    return MatmulParams(**{**base, **fields})


def operand_bytes(p: MatmulParams) -> tuple[float, float, float]:
    """A's, B's and the micro-kernel's bytes, computed independently of the module."""
    a = M * K * ELEM * math.ceil(N / p.tile_n)
    b = K * N * ELEM * math.ceil(M / p.tile_m)
    mp, np_ = math.ceil(M / p.reg_m) * p.reg_m, math.ceil(N / p.reg_n) * p.reg_n
    inner = mp * np_ * K / (p.reg_m * p.reg_n) * (p.reg_m + p.reg_n) * ELEM
    return a, b, inner


def test_a_block_and_b_panel_at_the_same_level_both_count():
    p = params()  # A block 64x512 f32 = 128 KiB, B panel 512x32 f32 = 64 KiB: both in L2
    assert 32 * 1024 < p.tile_m * K * ELEM <= 1024 * 1024
    assert 32 * 1024 < K * p.reg_n * ELEM <= 1024 * 1024
    a, b, inner = operand_bytes(p)
    traffic = traffic_by_level(p, M, N, K, ELEM, TARGET)
    assert traffic["l2"] == pytest.approx(a + b + inner / 2)  # unpacked: half the loads miss
    assert traffic["l1"] == pytest.approx(inner)


def test_l1_micro_kernel_loads_add_to_operands_in_l1():
    p = params(tile_m=4, tile_k=64, reg_m=4, reg_n=16, pack=True)  # everything fits in L1
    a, b, inner = operand_bytes(p)
    c = 2 * M * N * ELEM * math.ceil(K / p.tile_k)  # C tile 4x256 f32 = 4 KiB, also in L1
    traffic = traffic_by_level(p, M, N, K, ELEM, TARGET)
    assert set(traffic) == {"l1"}
    assert traffic["l1"] == pytest.approx(a + b + inner + c)


def test_c_traffic_of_k_blocks_lands_at_its_own_level():
    p = params(tile_m=256, tile_n=512, tile_k=64, reg_m=4, reg_n=16, pack=True)
    c = 2 * M * N * ELEM * math.ceil(K / p.tile_k)  # C tile 256x512 f32 = 512 KiB: L2
    with_c = traffic_by_level(p, M, N, K, ELEM, TARGET)
    without_c = traffic_by_level(p.model_copy(update={"tile_k": 0}), M, N, K, ELEM, TARGET)
    a, _, _ = operand_bytes(p)
    # A's block (256x64 f32 = 64 KiB) and C's tile share L2; B's 64x16 panel moves to L1.
    assert with_c["l2"] == pytest.approx(a + c)
    assert sum(with_c.values()) == pytest.approx(sum(without_c.values()) + c)


@pytest.fixture
def memory_bound(monkeypatch):
    """Slow every level down so the estimate is the traffic term, not compute."""
    monkeypatch.setattr(roofline, "_BYTES_PER_CYCLE", {"l1": 1e-3, "l2": 1e-3, "l3": 1e-3,
                                                       "mem": 1e-3})  # fmt: skip


def test_estimate_grows_with_a_traffic_when_b_shares_its_level(memory_bound):
    # A smaller tile_n re-reads A more often; B's panel and A's block stay in L2.
    more_a, less_a = params(tile_n=64), params(tile_n=256)
    assert operand_bytes(more_a)[0] > operand_bytes(less_a)[0]
    assert operand_bytes(more_a)[1] == operand_bytes(less_a)[1]
    slow = estimate_seconds(more_a, M, N, K, ELEM, TARGET)
    fast = estimate_seconds(less_a, M, N, K, ELEM, TARGET)
    assert slow > fast


def test_estimate_grows_with_b_traffic_when_a_shares_its_level(memory_bound):
    # A smaller tile_m re-reads B more often; A's block (32x512 f32 = 64 KiB) stays in L2.
    more_b, less_b = params(tile_m=32), params(tile_m=64)
    assert operand_bytes(more_b)[1] > operand_bytes(less_b)[1]
    slow = estimate_seconds(more_b, M, N, K, ELEM, TARGET)
    fast = estimate_seconds(less_b, M, N, K, ELEM, TARGET)
    assert slow > fast


def test_peak_and_chains_follow_the_fma_units_width():
    """Zen 1's 128-bit FMA units complete one 256-bit FMA per cycle: half the peak of
    full-width units, reached with half the independent chains (vector FMAs per cycle x
    latency). So a 2x16 tile (4 chains) runs as fast on both, and a 6x16 tile (12 chains)
    twice as fast on full-width units."""
    zen1 = TARGET.model_copy(update={"fma_bits": 128})
    assert roofline.peak_flops(TARGET) == pytest.approx(2.5e9 * 16 * 2)
    assert roofline.peak_flops(zen1) == pytest.approx(roofline.peak_flops(TARGET) / 2)
    mk = dict(tile_m=48, tile_n=64, tile_k=64, reg_n=16, vector_registers=16, pack=True)
    few, many = params(reg_m=2, **mk), params(reg_m=6, **mk)  # blocks in L1/L2: compute-bound
    assert estimate_seconds(few, M, N, K, ELEM, zen1) == pytest.approx(
        estimate_seconds(few, M, N, K, ELEM, TARGET), rel=0.05
    )
    assert estimate_seconds(many, M, N, K, ELEM, zen1) == pytest.approx(
        2 * estimate_seconds(many, M, N, K, ELEM, TARGET), rel=0.05
    )
