"""The x86 matmul schedule: params constraints, IR structure and results of every variant."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
from pydantic import ValidationError

from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul.heuristic import SHARE_B_MIN_ROWS, heuristic_matmul_params
from stagegraph.stages.x86.matmul.params import MatmulParams, pack_k_step

AVX512 = Target(
    isa=frozenset({"avx512f", "avx2", "fma"}),
    cores=2,
    vector_bits=512,
    l1d_bytes=48 * 1024,
    l2_bytes=1024 * 1024,
    l3_bytes=32 * 1024 * 1024,
)
AVX2 = Target(isa=frozenset({"avx2", "fma"}), cores=8, vector_bits=256)
# Zen 1: AVX2 on 128-bit FMA units (one 256-bit FMA per cycle).
ZEN1 = AVX2.model_copy(update={"fma_bits": 128})


def _matmul(m: int, n: int, k: int) -> str:
    t = f"tensor<{m}x{n}xf32>"
    return f"""
func.func @mm(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> {t} {{
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : {t}
  %f = linalg.fill ins(%c0 : f32) outs(%e : {t}) -> {t}
  %r = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%f : {t}) -> {t}
  return %r : {t}
}}
func.func @bench(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> {t} {{
  %r = func.call @mm(%a, %b) : (tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) -> {t}
  return %r : {t}
}}
"""


def _mlp(batch: int, widths: list[int]) -> str:
    args = [f"%x: tensor<{batch}x{widths[0]}xf32>"]
    body = ["  %c0 = arith.constant 0.0 : f32"]
    cur = "%x"
    for i, (k, n) in enumerate(itertools.pairwise(widths)):
        args += [f"%w{i}: tensor<{k}x{n}xf32>", f"%b{i}: tensor<{n}xf32>"]
        t = f"tensor<{batch}x{n}xf32>"
        body += [
            f"  %e{i} = tensor.empty() : {t}",
            f"  %f{i} = linalg.fill ins(%c0 : f32) outs(%e{i} : {t}) -> {t}",
            f"  %m{i} = linalg.matmul ins({cur}, %w{i} : tensor<{batch}x{k}xf32>, "
            f"tensor<{k}x{n}xf32>) outs(%f{i} : {t}) -> {t}",
            f"  %y{i} = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, "
            "affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], "
            '  iterator_types = ["parallel", "parallel"]} '
            f"ins(%m{i}, %b{i} : {t}, tensor<{n}xf32>) outs(%e{i} : {t}) {{",
            "  ^bb0(%in: f32, %bb: f32, %out: f32):",
            "    %s = arith.addf %in, %bb : f32",
            "    %z = arith.maximumf %s, %c0 : f32",
            "    linalg.yield %z : f32",
            f"  }} -> {t}",
        ]
        cur = f"%y{i}"
    t = f"tensor<{batch}x{widths[-1]}xf32>"
    head = f"func.func @mlp({', '.join(args)}) -> {t} {{"
    return "\n".join([head, *body, f"  return {cur} : {t}", "}"])


def _params(m: int, n: int, k: int, **override) -> MatmulParams:
    base = heuristic_matmul_params(m, n, k, "f32", AVX512, override.get("threads", 1))
    return MatmulParams(**{**base.model_dump(), **override})


def _schedule(payload, override: dict) -> None:
    """Apply the matmul schedule to every matmul of ``payload``, with the AVX-512
    heuristic's params updated by ``override``."""
    from stagegraph.stages.x86.matmul.canonical import find_matmuls
    from stagegraph.stages.x86.matmul.schedule import apply_schedule, build_matmul_schedule

    sites = find_matmuls(payload)
    params = [_params(s.m, s.n, s.k, **override) for s in sites]
    apply_schedule(payload, build_matmul_schedule(params, sites))


def _compile(text: str, entry: str, override: dict):
    from stagegraph.mlir.bindings import execution_engine, ir, new_context
    from stagegraph.stages.common import lowering

    threads = override.get("threads", 1)
    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(text)
        _schedule(payload, override)
        for fn in payload.body.operations:
            fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        libs = _lower(payload, lowering.BUFFERIZE, threads)
        return execution_engine.ExecutionEngine(payload, opt_level=3, shared_libs=libs)


def _lower(payload, prefix: str, threads: int) -> list[str]:
    """Bufferize and lower like ``x86.lower`` (dynamic OpenMP loops when threads > 1);
    returns the shared libraries the JIT needs."""
    from stagegraph.mlir.bindings import passmanager
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.rewrites import (
        copies_to_linalg,
        define_bf16_builtins,
        expand_bf16_truncation,
    )

    def run(pipeline: str) -> None:
        passmanager.PassManager.parse(f"builtin.module({pipeline})").run(payload.operation)

    expand_bf16_truncation(payload)  # as x86.lower does for hosts without AVX-512 BF16
    define_bf16_builtins(payload)
    run(prefix)
    if copies_to_linalg(payload):  # as x86.lower does (else a memrefCopy runtime call)
        run(lowering.LINALG_TO_LOOPS)
    if threads <= 1:
        run(lowering.LOWER_TO_LLVM)
        return []
    from stagegraph.runtime import openmp

    run(lowering.TO_OPENMP)
    lowering.schedule_guided(payload)  # a one-block loop has no omp.wsloop left
    run(lowering.OPENMP_TO_LLVM)
    return [openmp.library_path()]


def _call(engine, entry: str, arrays: list[np.ndarray]) -> None:
    from stagegraph.mlir.bindings import runtime

    engine.invoke(
        entry,
        *[ctypes.pointer(ctypes.pointer(runtime.get_ranked_memref_descriptor(a))) for a in arrays],
    )


def _run_matmul(m: int, n: int, k: int, entry: str = "mm", **override) -> None:
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    c = np.full((m, n), np.nan, np.float32)
    _call(_compile(_matmul(m, n, k), entry, override), entry, [a, b, c])
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


# --- params model -------------------------------------------------------------------------


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (100, 37, 53), (1000, 1000, 1000), (384, 1536, 768)])
@pytest.mark.parametrize("threads", [1, 2, 8])
def test_heuristic_respects_constraints(target, shape, threads):
    m, n, k = shape
    p = heuristic_matmul_params(m, n, k, "f32", target, threads)
    lanes = target.vector_bits // 32
    assert p.vector_width == lanes
    assert p.reg_n % p.vector_width == 0
    assert p.tile_m % p.reg_m == 0 and p.tile_n % p.reg_n == 0
    assert k % p.k_unroll == 0
    assert p.accumulator_registers + p.reg_n // lanes + 1 <= p.vector_registers
    assert p.threads == threads


def test_heuristic_uses_the_register_file():
    assert heuristic_matmul_params(1024, 1024, 1024, "f32", AVX512).accumulator_registers == 16
    avx2 = heuristic_matmul_params(768, 1024, 1024, "f32", AVX2)
    assert (avx2.reg_m, avx2.reg_n, avx2.vector_registers) == (6, 16, 16)


@pytest.mark.parametrize(
    ("m", "reg_m"), [(1024, 6), (1000, 5), (1005, 5), (768, 6), (1021, 6), (3, 3), (13, 6)]
)
def test_heuristic_register_rows_divide_m_when_enough_chains_remain(m, reg_m):
    """Rows dividing m leave no partial panel (no padding, masked packing or edge tiles);
    below 5 rows (10 accumulators with two 8-lane vectors) the chains fall short of two
    full-width FMA units of latency 5, so 1024 and a prime m keep the full 6 rows (with
    an edge tile). With 8 lanes an even row count comes first, an odd one only when no even
    one divides (1000, 1005)."""
    assert heuristic_matmul_params(m, 1024, 512, "f32", AVX2).reg_m == reg_m
    assert heuristic_matmul_params(m, 1024, 512, "f32", AVX512).reg_m in (reg_m, 8, 7, m)


@pytest.mark.parametrize(("m", "full_rows", "narrow_rows"), [(1024, 6, 4), (1000, 5, 4)])
def test_heuristic_keeps_ten_chains_on_full_width_fma_units(m, full_rows, narrow_rows):
    """Two full-width FMAs issue per cycle (Haswell on, Zen 2-4's AVX2): a 4x16 tile's 8
    chains leave them idle, so m = 1024 and 1000 take 6 and 5 rows. Half-width units (Zen
    1) issue one per cycle, and 4 rows dividing m keep them busy."""
    full = heuristic_matmul_params(m, m, m, "f32", AVX2)
    narrow = heuristic_matmul_params(m, m, m, "f32", ZEN1)
    assert (full.reg_m, narrow.reg_m) == (full_rows, narrow_rows)
    assert full.accumulator_registers >= 10 and narrow.accumulator_registers == 8


@pytest.mark.parametrize(("n", "k"), [(256, 64), (256, 32), (48, 32), (32, 1024), (128, 128)])
def test_heuristic_keeps_four_rows_dividing_m_for_short_loops(n, k):
    """Below 256 K steps or 256 columns the edge tile and the 6-row packing of A cost more
    than two more chains save: rows dividing m (4 of 256 or 1024) stay."""
    for m in (256, 1024):
        assert heuristic_matmul_params(m, n, k, "f32", AVX2).reg_m == 4


@pytest.mark.parametrize(
    ("m", "narrow_rows", "full_rows"),
    [(768, 4, 6), (384, 4, 6), (1200, 4, 6), (1021, 4, 6), (10, 5, 5), (30, 6, 6)],
)
def test_heuristic_prefers_four_rows_when_the_fma_units_are_half_the_vector(
    m, narrow_rows, full_rows
):
    """On 128-bit FMA units (Zen 1) one 256-bit FMA issues per cycle, so a 4x16 tile's 8
    chains keep them busy, and two k steps per iteration fit beside its accumulators
    (8 + 2 x 3 registers): 4 rows whenever they divide m (or nothing does). Rows that divide
    m still come first (an LSTM's batch of 10 keeps 5 rows and stays unpadded). Full-width
    units keep 6 rows (12 chains) where 6 divides m."""
    narrow = heuristic_matmul_params(m, 1536, 768, "f32", ZEN1)
    full = heuristic_matmul_params(m, 1536, 768, "f32", AVX2)
    assert (narrow.reg_m, full.reg_m) == (narrow_rows, full_rows)
    if narrow_rows == 4:
        assert (narrow.reg_n, narrow.k_unroll) == (16, 2) and narrow.tile_m % 4 == 0


def test_heuristic_gives_every_thread_a_block():
    p = heuristic_matmul_params(256, 256, 256, "f32", AVX512, threads=2)
    blocks = -(-256 // p.tile_m) * -(-256 // p.tile_n)
    assert blocks % 2 == 0


@pytest.mark.parametrize("shape", [(2048, 2048, 2048), (1000, 1000, 1000), (384, 1536, 768)])
def test_heuristic_blocks_k_so_the_b_micro_panel_stays_in_l1(shape):
    """AVX2's tiles (and AVX-512's where m fits one row block): the B and A micro-panels of
    a K block fit L1, the A slice of a row block half of L2."""
    m, n, k = shape
    for target in (AVX2, AVX512) if m < 512 else (AVX2,):
        p = heuristic_matmul_params(m, n, k, "f32", target)
        assert 0 < p.tile_k < k and k % p.tile_k == 0 and p.tile_k % p.k_unroll == 0
        assert (p.reg_n + p.reg_m) * p.tile_k * 4 <= target.l1d_bytes
        # Half of L2, rounded up to whole register tiles.
        assert (p.tile_m - p.reg_m) * p.tile_k * 4 < target.l2_bytes // 2


@pytest.mark.parametrize(
    ("shape", "tile_k", "threads_tile_k", "shares_b"),
    [((2048, 2048, 2048), 512, 512, True), ((1024, 1024, 1024), 512, 512, True),
     ((768, 768, 768), 384, 384, False), ((1000, 1000, 1000), 0, 500, False)],
)  # fmt: skip
def test_heuristic_lengthens_k_blocks_for_the_avx512_tile(shape, tile_k, threads_tile_k, shares_b):
    """An 8x32 tile reloads and stores 256 C elements per K block: the block is at least
    twice that many K steps (the divisor of k nearest it; 1000's is all of k), longer than
    L1 alone gives, where m spans two row blocks. The row block shrinks to keep its A slice
    in half of L2. Two threads keep several K blocks: 1000 takes two of 500, packed in
    4-wide steps. They share B's only with SHARE_B_MIN_ROWS rows each."""
    m, n, k = shape
    p = heuristic_matmul_params(m, n, k, "f32", AVX512)
    assert (p.reg_m, p.reg_n, p.tile_k) == (8, 32, tile_k)
    assert (p.reg_n + p.reg_m) * (tile_k or k) * 4 > AVX512.l1d_bytes
    assert p.tile_m * (tile_k or k) * 4 <= AVX512.l2_bytes // 2 and m >= 2 * p.tile_m
    two = heuristic_matmul_params(m, n, k, "f32", AVX512, threads=2)
    assert (two.share_b, two.tile_k) == (shares_b, threads_tile_k)
    assert shares_b == (m >= 2 * SHARE_B_MIN_ROWS)
    assert two.tile_m * threads_tile_k * 4 <= AVX512.l2_bytes // 2


@pytest.mark.parametrize("threads", [1, 2])
def test_heuristic_makes_two_k_blocks_one_when_tiles_write_c_directly(threads):
    """512 = two K blocks of 256 on Zen 1's AVX2 (4x16 tiles): with whole register tiles
    they become one (the tiles then write C directly); three blocks (768), a partial tile
    (n = 500, or m = 512 in 6-row tiles) or bf16 keep their K blocks. The one K block's A
    slice still takes at most half of L2."""
    p = heuristic_matmul_params(512, 512, 512, "f32", ZEN1, threads)
    assert p.tile_k == 0 and p.whole_register_tiles(512, 512)
    assert p.tile_m * 512 * 4 <= ZEN1.l2_bytes // 2
    assert heuristic_matmul_params(512, 512, 768, "f32", ZEN1, threads).tile_k == 256
    assert heuristic_matmul_params(512, 500, 512, "f32", ZEN1, threads).tile_k == 256
    assert heuristic_matmul_params(512, 512, 512, "bf16", ZEN1, threads).tile_k > 0
    assert heuristic_matmul_params(512, 512, 512, "f32", AVX2, threads).tile_k == 256


def test_heuristic_leaves_a_short_k_whole():
    assert heuristic_matmul_params(256, 256, 256, "f32", AVX512).tile_k == 0
    assert heuristic_matmul_params(100, 37, 53, "f32", AVX512).tile_k == 0


@pytest.mark.parametrize(
    "shape, per_thread",
    [
        ((256, 256, 256), 1),
        ((512, 512, 512), 1),
        ((1000, 1000, 1000), 1),
        ((256, 1024, 1024), 1),
        ((2048, 512, 128), 2),
        ((4096, 256, 64), 2),
    ],
)
def test_heuristic_gives_each_thread_a_second_block_when_its_packing_is_cheap(shape, per_thread):
    """One block per thread, and a second (for balance) only while the pass over A or B
    it adds costs under BALANCE_PACKING of the work: with K = 64 or 128 a pass over B is
    a fraction of a percent; at 256^3 it is several percent."""
    m, n, k = shape
    one = heuristic_matmul_params(m, n, k, "f32", AVX512, threads=1)
    two = heuristic_matmul_params(m, n, k, "f32", AVX512, threads=2)
    if two.share_b:  # the threads take the row blocks of every K block
        rows = -(-m // two.tile_m)
        assert rows >= 2 and rows % 2 == 0 and two.block_rows >= m and two.tile_n >= n
    else:
        assert -(-m // two.block_rows) * -(-n // two.tile_n) == 2 * per_thread
    assert min(two.tile_m, two.tile_n) >= min(128, m, n)  # blocks stay big enough to pack
    assert (two.reg_m, two.reg_n) == (one.reg_m, one.reg_n)
    # The same K block, unless one thread's is all of k: threads keep several K blocks.
    assert two.tile_k == one.tile_k or (one.tile_k == 0 and 0 < two.tile_k < k)


@pytest.mark.parametrize(
    "shape, threads", [((2048, 2048, 2048), 2), ((4096, 1024, 1024), 2), ((4096, 1024, 1024), 8)]
)
def test_heuristic_shares_b_when_row_blocks_would_each_pack_it(shape, threads):
    """Several K blocks and a split into row blocks only (each of which would pack every K
    block of B): the threads share B instead, taking a multiple of ``threads`` row blocks
    of one block spanning C. One thread, one K block, or a split of N (B packed once
    anyway) keep the blocked split."""
    m, n, k = shape
    p = heuristic_matmul_params(m, n, k, "f32", AVX512, threads)
    rows = -(-m // p.tile_m)
    assert p.share_b and p.tile_k and rows % threads == 0
    assert p.block_rows >= m and p.tile_n >= n
    assert p.tile_m * p.tile_k * 4 <= AVX512.l2_bytes // 2  # the A slice in L2
    assert not heuristic_matmul_params(m, n, k, "f32", AVX512, 1).share_b
    assert not heuristic_matmul_params(256, 1024, 1024, "f32", AVX512, threads).share_b
    assert not heuristic_matmul_params(512, 512, 256, "f32", AVX512, threads).share_b


def test_heuristic_keeps_the_k_loop_within_the_register_file():
    # 6x16 on 16 ymm: 12 accumulators + 2 B vectors + 1 broadcast leave no room for a
    # second k step (LLVM would load ahead and spill accumulators); 8x32 on 32 zmm does.
    assert heuristic_matmul_params(768, 1024, 1024, "f32", AVX2).k_unroll == 1
    assert heuristic_matmul_params(1024, 1024, 1024, "f32", AVX512).k_unroll == 4


def test_threads_pack_their_own_b_when_it_fits_l2_or_they_have_few_rows():
    """Two threads, several K blocks: a K block of B that fits in L2 is packed by each thread
    for its own rows, not shared; so is a larger one when each thread has fewer than
    SHARE_B_MIN_ROWS rows. Otherwise B is shared."""
    small = heuristic_matmul_params(1024, 256, 1024, "f32", AVX512, 2)
    assert small.tile_k and small.tile_k * 256 * 4 <= AVX512.l2_bytes // 2
    assert not small.share_b
    assert 0 < small.block_m < 1024  # the threads take row blocks of their own
    # 512^3 on AVX2: a 256 x 512 K block of B is all of a 512 KiB L2 (more than half of it).
    zen3 = AVX2.model_copy(update={"l2_bytes": 512 * 1024, "l3_bytes": 16 * 1024 * 1024})
    whole_l2 = heuristic_matmul_params(512, 512, 512, "f32", zen3, 2)
    assert whole_l2.tile_k * 512 * 4 == zen3.l2_bytes
    assert not whole_l2.share_b
    assert whole_l2.block_rows < 512 and whole_l2.tile_n == 512  # a row block per thread
    wide = heuristic_matmul_params(1024, 1024, 1024, "f32", AVX512, 2)
    assert wide.share_b and wide.tile_k * 1024 * 4 > AVX512.l2_bytes
    assert 2 * SHARE_B_MIN_ROWS == 1024
    few_rows = heuristic_matmul_params(512, 1024, 1024, "f32", AVX512, 2)
    assert few_rows.tile_k * 1024 * 4 > AVX512.l2_bytes
    assert not few_rows.share_b and few_rows.block_rows < 512  # a row block per thread


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (2048, 2048, 2048), (1000, 1000, 1000)])
def test_heuristic_packs_b_once_per_k_block(target, shape):
    m, n, k = shape
    p = heuristic_matmul_params(m, n, k, "f32", target)
    assert p.block_rows >= m  # one block of all rows: B packed once per K block
    # The A slice in half of L2 (rounded up to whole register tiles).
    assert (p.tile_m - p.reg_m) * (p.tile_k or k) * 4 < target.l2_bytes // 2
    blocks = -(-m // p.tile_m)
    assert m - (blocks - 1) * p.tile_m > p.tile_m // 2  # balanced: no sliver of a block


def test_row_block_budget_rounds_up_to_whole_register_tiles():
    """Half of a 512 KiB L2 is 256 rows of a 256-long K block: 6-row tiles make it one block
    of 258, not two of 132 that would walk B's micro-panels twice (256^3 1.03x, Zen 4)."""
    p = heuristic_matmul_params(
        256, 256, 256, "f32", AVX2.model_copy(update={"l2_bytes": 512 * 1024})
    )
    assert (p.reg_m, p.tile_m, p.block_rows) == (6, 258, 258)


@pytest.mark.parametrize(
    ("target", "shape"), [(ZEN1, (2048, 768, 1000)), (AVX2, (1536, 1024, 512))]
)
def test_threads_sharing_b_take_only_row_blocks_that_exist(target, shape):
    """Sharing B, the threads split all rows into a multiple of the threads' row blocks;
    the parallel block is those blocks, with no empty block past m for a thread to take."""
    m, n, k = shape
    target = target.model_copy(update={"l2_bytes": 512 * 1024, "l3_bytes": 16 * 1024 * 1024})
    p = heuristic_matmul_params(m, n, k, "f32", target, threads=2)
    assert p.share_b
    assert p.block_rows == -(-m // p.tile_m) * p.tile_m
    assert (p.block_rows // p.tile_m) % 2 == 0


def test_heuristic_k_block_is_whole_packing_steps():
    p = heuristic_matmul_params(1000, 1000, 1000, "f32", AVX2)
    assert p.tile_k and 1000 % p.tile_k == 0 and p.tile_k % pack_k_step(1000) == 0


def test_block_rows_are_whole_row_blocks():
    assert _params(64, 64, 64, tile_m=16, block_m=40).block_rows == 32
    assert _params(64, 64, 64, tile_m=16, block_m=0).block_rows == 16
    assert _params(64, 64, 64, tile_m=16, block_m=8).block_rows == 16


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_row_blocks_inside_a_block(threads):
    """block_m: B packed once per K block for several A row blocks, with partial edge
    tiles (peeled) in both dimensions."""
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _run_matmul(
        100,
        70,
        60,
        threads=threads,
        reg_m=8,
        tile_m=16,
        block_m=48,
        tile_n=32,
        tile_k=20,
        k_unroll=1,
    )


@pytest.mark.parametrize("shape", [(128, 128, 512), (100, 37, 53), (37, 45, 600)])
def test_heuristic_splits_a_small_problem_for_every_thread(shape):
    m, n, k = shape
    p = heuristic_matmul_params(m, n, k, "f32", AVX512, threads=2)
    assert -(-m // p.tile_m) * -(-n // p.tile_n) >= 2


@pytest.mark.parametrize(
    "bad",
    [{"reg_n": 24}, {"tile_m": 60}, {"reg_m": 16}, {"threads": 0}, {"unknown": 1}],
)
def test_bad_overrides_are_rejected(bad):
    with pytest.raises(ValidationError):
        MatmulParams(**{**MatmulParams().model_dump(), **bad})


def test_register_tiles_are_a_power_of_two_vectors_wide():
    """Three 8-lane vectors (reg_n=24) lower to vectors that split into no whole registers
    (10x slower, measured): rejected by the params and absent from the tuner's space."""
    import z3

    from stagegraph.stages.x86.matmul.params import tuning_constraints

    base = {**MatmulParams().model_dump(), "vector_width": 8, "vector_registers": 16}
    with pytest.raises(ValidationError, match="power-of-two number of vectors"):
        MatmulParams(**{**base, "reg_m": 4, "reg_n": 24, "tile_m": 96, "tile_n": 96})
    assert MatmulParams(**{**base, "reg_m": 2, "reg_n": 32, "tile_m": 96, "tile_n": 96})

    class Fields:
        reg_n, vector_width, vector_registers = z3.Int("reg_n"), 8, 16
        reg_m, tile_m, tile_n, tile_k, k_unroll = 4, 96, 96, 0, 1

    rule = tuning_constraints(Fields, z3)["reg_n_power_of_two_vectors"]
    allowed = [n for n in range(8, 136, 8) if z3.is_true(z3.simplify(z3.substitute(
        rule, (Fields.reg_n, z3.IntVal(n))
    )))]  # fmt: skip
    assert allowed == [8, 16, 32, 64, 128]


# --- schedule structure ---------------------------------------------------------------------


def test_find_matmuls_sees_fill_and_fusable_consumers():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.x86.matmul.canonical import find_matmuls

    with new_context():
        sites = find_matmuls(ir.Module.parse(_mlp(8, [16, 32, 24])))
    assert [(s.m, s.n, s.k, s.has_fill, s.consumers) for s in sites] == [
        (8, 32, 16, True, 1),
        (8, 24, 32, True, 1),
    ]


def test_schedule_is_a_named_sequence_and_leaves_other_functions_alone():
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.x86.matmul.canonical import find_matmuls
    from stagegraph.stages.x86.matmul.schedule import apply_schedule, build_matmul_schedule

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(_matmul(100, 37, 53))
        sites = find_matmuls(payload)
        schedule = build_matmul_schedule(_params(100, 37, 53), sites)
        sequences = [op.attributes["sym_name"].value for op in schedule.body.operations]
        assert sequences == ["__transform_main", "lower_vectors"]
        bench_before = str(payload.body.operations[1])
        apply_schedule(payload, schedule)
        mm, bench = payload.body.operations
        assert str(bench) == bench_before
        ops = [op.name for op in _walk(mm.operation)]
        assert "linalg.matmul" not in ops
        assert "vector.fma" in ops
        assert "linalg.pack" not in ops and "linalg.unpack" not in ops
        assert all(name not in mm.attributes for name in ("stagegraph.lower_vectors",))


def _walk(op):
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from _walk(child.operation)


# --- results --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(100, 37, 53), (1, 1, 1), (128, 96, 64), (17, 64, 3)])
@pytest.mark.parametrize("pack", [True, False], ids=["pack", "nopack"])
def test_matmul_is_correct(shape, pack):
    _run_matmul(*shape, pack=pack)


def test_matmul_with_several_blocks_and_k_blocking():
    _run_matmul(72, 100, 45, tile_m=16, tile_n=64, tile_k=9, k_unroll=1)


def test_benchmark_wrapper_calls_the_scheduled_function():
    _run_matmul(33, 40, 21, entry="bench")


@pytest.mark.parametrize("pack", [True, False], ids=["pack", "nopack"])
def test_matmul_two_threads(pack):
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _run_matmul(100, 70, 53, threads=2, reg_m=8, tile_m=32, tile_n=32, pack=pack)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(37, 45, 600), (100, 70, 60), (8, 33, 256), (131, 17, 40)])
def test_heuristic_params_odd_shapes(shape, threads):
    """The heuristic's own params (k blocks, thread split) on odd shapes."""
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _run_matmul(*shape, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_k_blocks_with_threads(threads):
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _run_matmul(100, 70, 60, threads=threads, reg_m=8, tile_m=32, tile_n=32, tile_k=20, k_unroll=4)


def test_parallel_block_loop_is_dynamic():
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    from stagegraph.mlir.bindings import ir, new_context, passmanager
    from stagegraph.stages.common import lowering

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(_matmul(64, 96, 32))
        _schedule(payload, {"threads": 2, "tile_m": 32, "tile_n": 32})
        passmanager.PassManager.parse(
            f"builtin.module({lowering.BUFFERIZE},{lowering.TO_OPENMP})"
        ).run(payload.operation)
        assert lowering.schedule_guided(payload) == 1
        loops = [op for fn in payload.body.operations for op in _walk(fn.operation)]
        (wsloop,) = [op for op in loops if op.name == "omp.wsloop"]
        kind = ir.Attribute.parse("#omp<schedulekind guided>")
        assert wsloop.attributes["schedule_kind"] == kind
        assert lowering.schedule_guided(payload) == 0  # already set: left alone


@pytest.mark.parametrize("pack", [True, False], ids=["pack", "nopack"])
@pytest.mark.parametrize("dims", [(37, [19, 45, 23]), (16, [32, 64, 32, 64])])
def test_mlp_layers_fused(dims, pack):
    batch, widths = dims
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, widths[0]), np.float32)
    ws = [rng.standard_normal((k, n), np.float32) for k, n in itertools.pairwise(widths)]
    bs = [rng.standard_normal((n,), np.float32) for n in widths[1:]]
    out = np.full((batch, widths[-1]), np.nan, np.float32)
    engine = _compile(_mlp(batch, widths), "mlp", {"pack": pack})
    _call(engine, "mlp", [x, *[a for pair in zip(ws, bs, strict=True) for a in pair], out])
    ref = x
    for w, b in zip(ws, bs, strict=True):
        ref = np.maximum(ref @ w + b, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_k_blocked_two_threads(threads):
    """Bias + ReLU fused into k-blocked (k=480), thread-split blocks."""
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    batch, widths = 40, [480, 200, 36]
    assert heuristic_matmul_params(batch, 200, 480, "f32", AVX512).tile_k == 240
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, widths[0]), np.float32)
    ws = [rng.standard_normal((k, n), np.float32) for k, n in itertools.pairwise(widths)]
    bs = [rng.standard_normal((n,), np.float32) for n in widths[1:]]
    out = np.full((batch, widths[-1]), np.nan, np.float32)
    engine = _compile(_mlp(batch, widths), "mlp", {"threads": threads})
    _call(engine, "mlp", [x, *[a for pair in zip(ws, bs, strict=True) for a in pair], out])
    ref = x
    for w, b in zip(ws, bs, strict=True):
        ref = np.maximum(ref @ w + b, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("n", [256, 1000])
def test_matmul_large(n):
    _run_matmul(n, n, n)


# --- matmul-like ops: batch matmuls, transposed operands, contraction generics --------------


def _contraction(maps: tuple[str, str, str], a: tuple, b: tuple, c: tuple, iterators: str) -> str:
    """A contraction ``linalg.generic`` (zero fill, mul-add body) in function ``@mm``."""
    ta, tb, tc = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in (a, b, c))
    its = ", ".join(f'"{it}"' for it in iterators.split())
    return f"""
func.func @mm(%a: {ta}, %b: {tb}) -> {tc} {{
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : {tc}
  %f = linalg.fill ins(%c0 : f32) outs(%e : {tc}) -> {tc}
  %r = linalg.generic {{indexing_maps = [affine_map<{maps[0]}>, affine_map<{maps[1]}>,
      affine_map<{maps[2]}>], iterator_types = [{its}]}}
      ins(%a, %b : {ta}, {tb}) outs(%f : {tc}) {{
  ^bb0(%x: f32, %y: f32, %z: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %z, %p : f32
    linalg.yield %s : f32
  }} -> {tc}
  return %r : {tc}
}}
"""


def _named(op: str, a: tuple, b: tuple, c: tuple, dtype: str = "f32") -> str:
    ta, tb, tc = (
        f"tensor<{'x'.join(map(str, s))}x{t}>" for s, t in ((a, dtype), (b, dtype), (c, "f32"))
    )
    return f"""
func.func @mm(%a: {ta}, %b: {tb}) -> {tc} {{
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : {tc}
  %f = linalg.fill ins(%c0 : f32) outs(%e : {tc}) -> {tc}
  %r = {op} ins(%a, %b : {ta}, {tb}) outs(%f : {tc}) -> {tc}
  return %r : {tc}
}}
"""


def _schedule_stage(text: str, threads: int = 1, overrides: dict | None = None):
    """The x86 params + schedule stages on ``text``, then bufferize + LLVM + JIT; returns
    (engine, sites scheduled, ops left in the scheduled IR)."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import execution_engine, ir, new_context
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.x86.ir_stages import schedule
    from stagegraph.stages.x86.params_stage import heuristic, matmul_ops

    context = new_context()
    with context, ir.Location.unknown():
        payload = ir.Module.parse(text)
        facts = analyze(payload)
        config = CostModelConfig(threads=threads, overrides=overrides or {})
        params = heuristic.fn(facts, AVX512, config)
        schedule.fn(Module["tensor"](payload), facts, params)
        names = [op.name for fn in payload.body.operations for op in _walk(fn.operation)]
        for fn in payload.body.operations:
            fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        libs = _lower(payload, f"{lowering.BUFFERIZE},{X86_FINISH}", threads)
        engine = execution_engine.ExecutionEngine(payload, opt_level=3, shared_libs=libs)
        return engine, len(matmul_ops(facts)), names


X86_FINISH = "func.func(lower-vector-multi-reduction),convert-linalg-to-loops"


def _check(
    text: str, a_shape: tuple, b_shape: tuple, expected, threads: int = 1, sites: int = 1
) -> list[str]:
    rng = np.random.default_rng(sum(a_shape) * 7 + sum(b_shape))
    a = rng.standard_normal(a_shape, np.float32)
    b = rng.standard_normal(b_shape, np.float32)
    ref = expected(a, b)
    out = np.full(ref.shape, np.nan, np.float32)
    engine, n_sites, names = _schedule_stage(text, threads)
    assert n_sites == sites
    _call(engine, "mm", [a, b, out])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.sqrt(a.size))
    return names


@pytest.mark.parametrize("shape", [(4, 32, 32, 32), (3, 17, 20, 9), (1, 100, 24, 16), (5, 2, 7, 3)])
def test_batch_matmul_is_scheduled_and_correct(shape):
    bsz, m, n, k = shape
    text = _named("linalg.batch_matmul", (bsz, m, k), (bsz, k, n), (bsz, m, n))
    names = _check(text, (bsz, m, k), (bsz, k, n), np.matmul)
    assert "linalg.batch_matmul" not in names and "vector.fma" in names


def test_batch_matmul_with_a_unit_dim_runs_as_a_reduction_and_is_correct():
    text = _named("linalg.batch_matmul", (5, 1, 3), (5, 3, 7), (5, 1, 7))
    names = _check(text, (5, 1, 3), (5, 3, 7), np.matmul, sites=0)
    assert "linalg.batch_matmul" not in names and "vector.reduction" in names


def test_batch_matmul_two_threads():
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    text = _named("linalg.batch_matmul", (6, 40, 12), (6, 12, 33), (6, 40, 33))
    _check(text, (6, 40, 12), (6, 12, 33), np.matmul, threads=2)


_TRANSPOSED = {
    # name: (maps, a shape, b shape, c shape, iterators, reference)
    "a_t": (
        ("(m, n, k) -> (k, m)", "(m, n, k) -> (k, n)", "(m, n, k) -> (m, n)"),
        (19, 37),
        (19, 45),
        (37, 45),
        "parallel parallel reduction",
        lambda a, b: a.T @ b,
    ),
    "b_t": (
        ("(m, n, k) -> (m, k)", "(m, n, k) -> (n, k)", "(m, n, k) -> (m, n)"),
        (37, 19),
        (45, 19),
        (37, 45),
        "parallel parallel reduction",
        lambda a, b: a @ b.T,
    ),
    "both_t_k_outer": (
        ("(k, n, m) -> (k, m)", "(k, n, m) -> (n, k)", "(k, n, m) -> (m, n)"),
        (12, 21),
        (50, 12),
        (21, 50),
        "reduction parallel parallel",
        lambda a, b: a.T @ b.T,
    ),
    "batch_b_t_batch_inner": (
        ("(m, b, n, k) -> (b, m, k)", "(m, b, n, k) -> (b, n, k)", "(m, b, n, k) -> (b, m, n)"),
        (3, 10, 8),
        (3, 35, 8),
        (3, 10, 35),
        "parallel parallel parallel reduction",
        lambda a, b: a @ b.transpose(0, 2, 1),
    ),
}


@pytest.mark.parametrize("case", sorted(_TRANSPOSED))
def test_transposed_contraction_is_scheduled_and_correct(case):
    maps, a, b, c, iterators, ref = _TRANSPOSED[case]
    names = _check(_contraction(maps, a, b, c, iterators), a, b, ref)
    assert "linalg.generic" not in names and "vector.fma" in names


@pytest.mark.parametrize("pack", [True, False], ids=["pack", "nopack"])
@pytest.mark.parametrize("layout", [(True, False), (False, True), (True, True)])
def test_transposed_matmul_sites(layout, pack):
    """``linalg.matmul`` with transposing ``indexing_maps`` through find_matmuls directly."""
    ta, tb = layout
    m, n, k = 23, 40, 13
    a_map = "(m, n, k) -> (k, m)" if ta else "(m, n, k) -> (m, k)"
    b_map = "(m, n, k) -> (n, k)" if tb else "(m, n, k) -> (k, n)"
    a_shape, b_shape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    ts = [f"tensor<{x}x{y}xf32>" for x, y in (a_shape, b_shape, (m, n))]
    text = f"""
func.func @mm(%a: {ts[0]}, %b: {ts[1]}) -> {ts[2]} {{
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : {ts[2]}
  %f = linalg.fill ins(%c0 : f32) outs(%e : {ts[2]}) -> {ts[2]}
  %r = linalg.matmul indexing_maps = [affine_map<{a_map}>, affine_map<{b_map}>,
      affine_map<(m, n, k) -> (m, n)>] ins(%a, %b : {ts[0]}, {ts[1]}) outs(%f : {ts[2]}) -> {ts[2]}
  return %r : {ts[2]}
}}
"""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.x86.matmul.canonical import find_matmuls

    with new_context():
        (site,) = find_matmuls(ir.Module.parse(text))
    assert (site.m, site.n, site.k, site.transpose_a, site.transpose_b) == (m, n, k, ta, tb)
    rng = np.random.default_rng(5)
    a = rng.standard_normal(a_shape, np.float32)
    b = rng.standard_normal(b_shape, np.float32)
    out = np.full((m, n), np.nan, np.float32)
    _call(_compile(text, "mm", {"pack": pack}), "mm", [a, b, out])
    ref = (a.T if ta else a) @ (b.T if tb else b)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


def test_broadcast_contraction_is_left_alone_and_correct():
    """A batch matmul whose B is shared by the batch (broadcast) is no matmul site."""
    maps = ("(b, m, n, k) -> (b, m, k)", "(b, m, n, k) -> (k, n)", "(b, m, n, k) -> (b, m, n)")
    text = _contraction(maps, (2, 9, 5), (5, 7), (2, 9, 7), "parallel parallel parallel reduction")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 9, 5), np.float32)
    b = rng.standard_normal((5, 7), np.float32)
    out = np.full((2, 9, 7), np.nan, np.float32)
    engine, n_sites, _ = _schedule_stage(text)
    assert n_sites == 0
    _call(engine, "mm", [a, b, out])
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


_MATMUL_B_T = (
    "linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, "
    "affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>]"
)


def _bf16(x: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns of ``x`` (truncated), as numpy has no bf16 type."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pack", [True, False], ids=["pack", "nopack"])
@pytest.mark.parametrize(
    ("op", "a_shape", "b_shape", "ref"),
    [
        ("linalg.matmul", (37, 19), (19, 45), np.matmul),
        ("linalg.matmul", (130, 64), (64, 70), np.matmul),
        (_MATMUL_B_T, (20, 9), (33, 9), lambda a, b: a @ b.T),
        ("linalg.batch_matmul", (3, 17, 8), (3, 8, 20), np.matmul),
    ],
    ids=["odd", "blocks", "b_t", "batch"],
)
def test_bf16_matmul_is_widened_into_the_f32_kernel(op, a_shape, b_shape, ref, pack, threads):
    """bf16 x bf16 -> f32: the widening is fused into the packing (no whole-matrix copy) and
    the f32 FMA kernel computes exactly what f32 math on the bf16 values gives."""
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    c_shape = ref(np.zeros(a_shape), np.zeros(b_shape)).shape
    text = _named(op, a_shape, b_shape, c_shape, dtype="bf16")
    rng = np.random.default_rng(sum(a_shape) + sum(b_shape))
    a, b = _bf16(rng.standard_normal(a_shape)), _bf16(rng.standard_normal(b_shape))
    out = np.full(c_shape, np.nan, np.float32)
    engine, sites, names = _schedule_stage(text, threads, {"pack": pack})
    assert sites == 1
    if pack:  # (unpacked, the edge tiles are masked contractions, as for f32)
        assert "vector.fma" in names and "linalg.matmul" not in names
    _call(engine, "mm", [a, b, out])
    expected = ref(_from_bf16(a).astype(np.float64), _from_bf16(b).astype(np.float64))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * np.sqrt(a_shape[-1]))


def test_bf16_widening_is_fused_into_the_blocks():
    """No widened copy of a whole matrix: each block (or packing step) converts its slice."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.x86.ir_stages import schedule
    from stagegraph.stages.x86.params_stage import heuristic

    text = _named("linalg.matmul", (256, 64), (64, 256), (256, 256), dtype="bf16")
    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(text)
        facts = analyze(payload)
        params = heuristic.fn(facts, AVX512, CostModelConfig(threads=2))
        schedule.fn(Module["tensor"](payload), facts, params)
        fn = payload.body.operations[0]
        top = [op.operation.name for op in fn.regions[0].blocks[0].operations]
        assert "scf.forall" in top
        assert "linalg.copy" not in top and "arith.extf" not in top
        inside = [op.name for op in _walk(fn.operation)]
        assert "arith.extf" in inside or "linalg.copy" in inside


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((37, 300), (300, 1)), ((1, 64), (64, 1))])
def test_matvec_runs_as_a_vectorized_reduction(a_shape, b_shape, threads):
    """n = 1: no matmul micro-kernel (it would pad the unit dim to a register tile); the
    generic schedule reduces contiguous chunks of each row instead."""
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    c_shape = (a_shape[0], b_shape[1])
    text = _named("linalg.matmul", a_shape, b_shape, c_shape)
    names = _check(text, a_shape, b_shape, np.matmul, threads=threads, sites=0)
    assert "linalg.matmul" not in names and "vector.reduction" in names


@pytest.mark.parametrize("threads", [1, 2])
def test_one_row_against_b_k_n_runs_on_the_kernel(threads):
    """m = 1 against B[k, n]: the kernel's one-row register tile reads B's rows along n
    (as a reduction along k it read B's columns: ``sites.runs_as_matvec``)."""
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    text = _named("linalg.matmul", (1, 300), (300, 45), (1, 45))
    names = _check(text, (1, 300), (300, 45), np.matmul, threads=threads, sites=1)
    assert "linalg.matmul" not in names and "vector.fma" in names


def _rnn_step(m: int, k: int, n: int) -> str:
    """A recurrent step as PyTorch exports an RNN cell: x @ w1 + b1, tanh, then @ w2."""
    t, row = f"tensor<{m}x{n}xf32>", "affine_map<(d0, d1) -> (d1)>"
    ident = "affine_map<(d0, d1) -> (d0, d1)>"
    both = '["parallel", "parallel"]'
    return f"""
func.func @main(%x: tensor<{m}x{k}xf32>, %w1: tensor<{k}x{n}xf32>, %b1: tensor<{n}xf32>,
                %w2: tensor<{n}x{n}xf32>) -> ({t}, {t}) {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {t}
  %f = linalg.fill ins(%zero : f32) outs(%e : {t}) -> {t}
  %m1 = linalg.matmul ins(%x, %w1 : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>)
                      outs(%f : {t}) -> {t}
  %biased = linalg.generic {{indexing_maps = [{ident}, {row}, {ident}], iterator_types = {both}}}
      ins(%m1, %b1 : {t}, tensor<{n}xf32>) outs(%e : {t}) {{
    ^bb0(%a: f32, %b: f32, %o: f32):
      %s = arith.addf %a, %b : f32
      linalg.yield %s : f32
  }} -> {t}
  %h = linalg.generic {{indexing_maps = [{ident}, {ident}], iterator_types = {both}}}
      ins(%biased : {t}) outs(%e : {t}) {{
    ^bb0(%a: f32, %o: f32):
      %r = math.tanh %a : f32
      linalg.yield %r : f32
  }} -> {t}
  %m2 = linalg.matmul ins(%h, %w2 : {t}, tensor<{n}x{n}xf32>) outs(%f : {t}) -> {t}
  return %h, %m2 : {t}, {t}
}}
"""


@pytest.mark.parametrize(("m", "k", "n"), [(20, 24, 40), (128, 64, 256)])
def test_two_layers_sharing_a_fill_with_a_returned_epilogue_and_partial_tiles(m, k, n):
    """A recurrent step (as PyTorch exports an RNN cell): the first layer's epilogue result
    is both returned and fed to the second matmul; partial row and column tiles are peeled."""
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine

    rng = np.random.default_rng(5)
    x, w1 = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    b1, w2 = rng.standard_normal(n, np.float32), rng.standard_normal((n, n), np.float32)
    result = Engine().run(load_graph("x86"), {"payload": _rnn_step(m, k, n)})
    h, out = result.binary.call("main", [x, w1, b1, w2])
    want_h = np.tanh(x.astype(np.float64) @ w1 + b1)
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, want_h @ w2, rtol=1e-4, atol=1e-3)


# --- nn.Linear: x @ W.T + bias, activation ------------------------------------------------


def _linear(m: int, n: int, k: int) -> str:
    """PyTorch's ``relu(x @ W.T + b)`` as torch-mlir lowers it: a ``linalg.transpose`` of
    the weights feeds a plain ``linalg.matmul``, a broadcast bias add and a ReLU follow."""
    x, w, c = f"tensor<{m}x{k}xf32>", f"tensor<{n}x{k}xf32>", f"tensor<{m}x{n}xf32>"
    wt, bias = f"tensor<{k}x{n}xf32>", f"tensor<{n}xf32>"
    ident = "affine_map<(i, j) -> (i, j)>"
    return f"""
func.func @mm(%x: {x}, %w: {w}, %b: {bias}) -> {c} {{
  %c0 = arith.constant 0.0 : f32
  %et = tensor.empty() : {wt}
  %t = linalg.transpose ins(%w : {w}) outs(%et : {wt}) permutation = [1, 0]
  %e = tensor.empty() : {c}
  %f = linalg.fill ins(%c0 : f32) outs(%e : {c}) -> {c}
  %mm = linalg.matmul ins(%x, %t : {x}, {wt}) outs(%f : {c}) -> {c}
  %r = linalg.generic {{indexing_maps = [{ident}, affine_map<(i, j) -> (j)>, {ident}],
      iterator_types = ["parallel", "parallel"]}} ins(%mm, %b : {c}, {bias}) outs(%e : {c}) {{
  ^bb0(%v: f32, %bv: f32, %o: f32):
    %s = arith.addf %v, %bv : f32
    %y = arith.maximumf %s, %c0 : f32
    linalg.yield %y : f32
  }} -> {c}
  return %r : {c}
}}
"""


def test_fold_transposed_operands_reads_the_weights_through_the_maps():
    """The transpose becomes the matmul's B map: the site is ``transpose_b`` on W itself
    and no transposed copy is left to materialise."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.stages.x86.matmul.canonical import SOURCE_ATTR, find_matmuls
    from stagegraph.stages.x86.matmul.operands import fold_transposed_operands

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(_linear(23, 40, 13))
        (mm,) = [op for op in _walk(payload.body.operations[0].operation)
                 if op.name == "linalg.matmul"]  # fmt: skip
        mm.attributes[SOURCE_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
        assert fold_transposed_operands(payload) == 1
        names = [op.name for op in _walk(payload.body.operations[0].operation)]
        assert "linalg.transpose" not in names
        (site,) = find_matmuls(payload)
    assert (site.m, site.n, site.k, site.transpose_a, site.transpose_b) == (23, 40, 13, False, True)
    assert site.consumers == 1  # the bias + ReLU epilogue is still fused into the blocks


@pytest.mark.parametrize("shape", [(37, 45, 19), (128, 64, 32)])
def test_linear_epilogue_is_fused_and_correct(shape):
    """``relu(x @ W.T + b)``: no transpose materialised, the epilogue vectorized with the
    matmul's register tiles (no linalg op left), results as numpy's."""
    m, n, k = shape
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((n, k), np.float32)
    b = rng.standard_normal(n, np.float32)
    out = np.full((m, n), np.nan, np.float32)
    engine, sites, names = _schedule_stage(_linear(m, n, k))
    assert sites == 1
    assert not [name for name in names if name.startswith("linalg.")]
    assert "vector.fma" in names and "arith.maximumf" in names
    _call(engine, "mm", [x, w, b, out])
    ref = np.maximum(x @ w.T + b, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def _chain_of_matmuls(steps: int, m: int, n: int) -> str:
    """``steps`` dependent ``m x n x n`` matmuls, as an unrolled recurrent layer has."""
    t = f"tensor<{m}x{n}xf32>"
    lines = [f"func.func @main(%h: {t}, %w: tensor<{n}x{n}xf32>) -> {t} {{",
             "  %zero = arith.constant 0.0 : f32", f"  %e = tensor.empty() : {t}",
             f"  %z = linalg.fill ins(%zero : f32) outs(%e : {t}) -> {t}"]  # fmt: skip
    value = "%h"
    for i in range(steps):
        lines.append(
            f"  %s{i} = linalg.matmul ins({value}, %w : {t}, tensor<{n}x{n}xf32>) "
            f"outs(%z : {t}) -> {t}"
        )
        value = f"%s{i}"
    return "\n".join([*lines, f"  return {value} : {t}", "}"])


def test_threads_follow_the_largest_matmul_not_the_sum():
    """Each matmul forks and joins by itself: 40 small steps (1 MFLOP each, 40 in all) stay
    on one thread, one large matmul uses the cores."""
    from stagegraph.mlir.diagnostics import parse_payload
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.x86.params_stage import heuristic

    small = analyze(parse_payload(_chain_of_matmuls(40, 32, 128)))
    assert sum(op.flops for op in small.ops) > 8 * 2**20  # the old rule gave it 8 threads
    params = heuristic.fn(small, AVX2, CostModelConfig())
    assert {p.threads for p in params.matmul} == {1}
    large = analyze(parse_payload(_chain_of_matmuls(1, 256, 256)))
    assert heuristic.fn(large, AVX2, CostModelConfig()).matmul[0].threads == AVX2.cores


def _one_large_and_small_steps(steps: int, rows: int = 32, width: int = 128) -> str:
    """A 256^3 matmul (an input projection) beside ``steps`` dependent ``rows x width x
    width`` ones."""
    big, t = "tensor<256x256xf32>", f"tensor<{rows}x{width}xf32>"
    u = f"tensor<{width}x{width}xf32>"
    lines = [f"func.func @main(%x: {big}, %w: {big}, %h: {t}, %u: {u}) -> ({big}, {t}) {{",
             "  %zero = arith.constant 0.0 : f32",
             f"  %eb = tensor.empty() : {big}", f"  %e = tensor.empty() : {t}",
             f"  %zb = linalg.fill ins(%zero : f32) outs(%eb : {big}) -> {big}",
             f"  %z = linalg.fill ins(%zero : f32) outs(%e : {t}) -> {t}",
             f"  %p = linalg.matmul ins(%x, %w : {big}, {big})",
             f"      outs(%zb : {big}) -> {big}"]  # fmt: skip
    value = "%h"
    for i in range(steps):
        lines.append(f"  %s{i} = linalg.matmul ins({value}, %u : {t}, {u}) outs(%z : {t}) -> {t}")
        value = f"%s{i}"
    return "\n".join([*lines, f"  return %p, {value} : {big}, {t}", "}"])


@pytest.mark.parametrize(("steps", "threaded"), [(150, False), (20, True)])
def test_threads_pay_only_when_the_split_work_outweighs_the_forks(steps, threaded):
    """A recurrent layer's input projection (one large matmul) beside its small steps: with
    many steps, the forks and joins of every loop (once threaded, each one forks) cost more
    than splitting the large matmul saves, so the payload stays on one thread; with a few,
    it is threaded."""
    from stagegraph.mlir.diagnostics import parse_payload
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.x86.params_stage import heuristic

    facts = analyze(parse_payload(_one_large_and_small_steps(steps)))
    threads = {p.threads for p in heuristic.fn(facts, AVX2, CostModelConfig()).matmul}
    assert threads == ({AVX2.cores} if threaded else {1})


@pytest.mark.parametrize(
    ("shape", "pack"),
    [((10, 256, 64), False), ((12, 128, 128), False), ((10, 256, 256), False),
     ((10, 1024, 256), True), ((10, 200, 100), True), ((64, 256, 64), True)],
)  # fmt: skip
def test_a_few_rows_against_a_cached_b_are_not_packed(shape, pack):
    """Packing pays back over many row panels, or when B is too big to read in place; a
    few rows against a B within a quarter of L2 that tiles evenly run unpacked."""
    m, n, k = shape
    assert heuristic_matmul_params(m, n, k, "f32", AVX2).pack is pack


def _conv_payload(n: int, c: int, f: int, hw: int) -> str:
    """A 3x3 NCHW convolution of ``n`` images of ``c`` channels into ``f`` channels."""
    o = hw - 2
    tx, tw, to = (f"tensor<{'x'.join(map(str, s))}xf32>"
                  for s in ((n, c, hw, hw), (f, c, 3, 3), (n, f, o, o)))  # fmt: skip
    return f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_2d_nchw_fchw ins(%x, %w : {tx}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""


@pytest.mark.parametrize(("shape", "threaded"), [((8, 32, 32, 58), True), ((1, 4, 4, 10), False)])
def test_threads_follow_the_largest_convolution(shape, threaded):
    """Convolutions count like matmuls: a payload of one large convolution (240 MFLOP)
    uses the cores, a small one stays on one thread (no matmul either way)."""
    from stagegraph.mlir.diagnostics import parse_payload
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.x86.params_stage import heuristic

    facts = analyze(parse_payload(_conv_payload(*shape)))
    params = heuristic.fn(facts, AVX2, CostModelConfig())
    assert params.matmul == ()
    assert params.payload_threads() == (AVX2.cores if threaded else 1)
    forced = heuristic.fn(facts, AVX2, CostModelConfig(overrides={"threads": 3}))
    assert forced.payload_threads() == 3  # --param threads=N still forces a count


def test_convolution_runs_on_two_threads(tmp_path):
    """End to end on two threads: the convolution's output tiles are an OpenMP loop, and
    the result matches numpy's."""
    import stagegraph as sg
    from stagegraph.mlir.walk import collect

    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    n, c, f, hw = 2, 16, 32, 30
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((f, c, 3, 3), dtype=np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    expected = np.einsum("nchwij,fcij->nfhw", windows, w, dtype=np.float64)
    (tmp_path / "p.mlir").write_text(_conv_payload(n, c, f, hw))
    np.savez(tmp_path / "p.npz", in0=x, in1=w, out0=expected.astype(np.float32))
    payload = str(tmp_path / "p.mlir")
    lowered = sg.run("x86", payload, threads=2, until="lower").module.ir
    assert collect(lowered, "omp.wsloop")
    assert sg.run("x86", payload, threads=2).verified is True


def test_steps_too_small_to_fork_leave_the_projection_its_threads():
    """Steps whose loops run serially anyway (4x64x64: 32 KFLOP each) cost no forks, so
    300 of them do not keep the large input projection off the cores; their own sites keep
    one thread (whole blocks)."""
    from stagegraph.mlir.diagnostics import parse_payload
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.x86.params_stage import heuristic

    facts = analyze(parse_payload(_one_large_and_small_steps(300, rows=4, width=64)))
    params = heuristic.fn(facts, AVX2, CostModelConfig())
    assert params.payload_threads() == AVX2.cores
    assert params.matmul[0].threads == AVX2.cores
    assert {p.threads for p in params.matmul[1:]} == {1}


def _scheduled_ops(text: str, override: dict) -> list[tuple[str, tuple[int, ...] | None]]:
    """(name, shape of the first result if a vector or tensor) of every op the matmul
    schedule leaves."""
    from stagegraph.mlir.bindings import ir, new_context

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(text)
        _schedule(payload, override)
        return [
            (
                op.name,
                tuple(ir.ShapedType(op.results[0].type).shape)
                if op.results
                and isinstance(op.results[0].type, ir.VectorType | ir.RankedTensorType)
                else None,
            )
            for op in _walk(payload.operation)
        ]


def _shuffle_widths(text: str, override: dict) -> set[int]:
    return {shape[0] for name, shape in _scheduled_ops(text, override) if name == "vector.shuffle"}


def test_a_packing_transposes_with_the_avx2_sequence_on_eight_lanes():
    """A 4x8 block of A becomes eight 4-wide columns through 8-element in-lane shuffles
    with 8 f32 lanes; one flat 32-element shuffle otherwise (16 lanes)."""
    avx2 = {"reg_m": 4, "reg_n": 16, "vector_width": 8, "vector_registers": 16, "k_unroll": 1}
    avx2 |= {"tile_m": 32, "tile_n": 32, "tile_k": 0, "block_m": 0, "pack": True}
    assert _shuffle_widths(_matmul(32, 32, 64), avx2) == {8}
    wide = avx2 | {"vector_width": 16, "vector_registers": 32}
    assert 32 in _shuffle_widths(_matmul(32, 32, 64), wide)
    _run_matmul(32, 32, 64, **avx2)


@pytest.mark.parametrize(("reg_m", "reg_n"), [(5, 16), (6, 16), (7, 8)])
def test_a_packing_pads_five_to_seven_rows_to_the_eight_by_eight_sequence(reg_m, reg_n):
    """A reg_m x 8 block of A (5-7 rows: no AVX2 sequence of its own) is transposed as an
    8x8 block padded with zero rows: 8-element shuffles only, not one flat reg_m*8-element
    shuffle. M is not whole panels (a partial panel reads through a mask) and spans two row
    blocks."""
    rows = {"reg_m": reg_m, "reg_n": reg_n, "vector_width": 8, "vector_registers": 16}
    rows |= {"k_unroll": 1, "tile_m": 2 * reg_m, "tile_n": 32, "tile_k": 0, "block_m": 0}
    assert _shuffle_widths(_matmul(3 * reg_m + 2, 32, 64), rows | {"pack": True}) == {8}
    _run_matmul(3 * reg_m + 2, 32, 64, **rows, pack=True)
    _run_matmul(4 * reg_m, 40, 24, **rows | {"tile_m": 8 * reg_m}, pack=True)


# 8 f32 lanes, 4x16 register tiles, one 48-column block: the last of 3 B panels is partial.
_AVX2_PANELS = {"reg_m": 4, "reg_n": 16, "vector_width": 8, "vector_registers": 16}
_AVX2_PANELS |= {"k_unroll": 1, "tile_m": 32, "tile_n": 48, "tile_k": 0, "block_m": 0, "pack": True}


def test_b_packing_masks_only_the_partial_panel():
    """With N = 40 (two whole 16-column panels and 8 columns), B's whole panels pack with
    plain loads: no mask is computed at run time (the partial panel's mask is constant)."""
    names = [name for name, _ in _scheduled_ops(_matmul(32, 40, 64), _AVX2_PANELS)]
    assert "vector.create_mask" not in names
    assert "vector.transfer_read" in names
    _run_matmul(32, 40, 64, **_AVX2_PANELS)


def test_a_packing_masks_only_the_partial_panel():
    """With M = 30 in one row block (seven whole 4-row panels and 2 rows), A's whole
    panels pack with plain loads, as B's do: no step computes the rows left (an
    ``affine.min`` that lowering turns into a mask)."""
    override = _AVX2_PANELS | {"tile_n": 32}
    names = [name for name, _ in _scheduled_ops(_matmul(30, 32, 64), override)]
    assert "affine.min" not in names and "vector.create_mask" not in names
    _run_matmul(30, 32, 64, **override)


@pytest.mark.parametrize("transposed", [False, True], ids=["a", "a-transposed"])
@pytest.mark.parametrize("shape", [(30, 40, 24), (9, 16, 8), (62, 33, 20)])
def test_a_packing_split_is_correct(shape, transposed):
    """Both panels' splits at once (M and N not whole panels), A stored [m, k] or [k, m]."""
    m, n, k = shape
    override = _AVX2_PANELS | {"tile_m": 64, "tile_n": 48}
    if not transposed:
        _run_matmul(m, n, k, **override)
        return
    text = _named(
        "linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d2, d0)>, "
        "affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>]",
        (k, m),
        (k, n),
        (m, n),
    )
    rng = np.random.default_rng(5)
    a = rng.standard_normal((k, m), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    c = np.full((m, n), np.nan, np.float32)
    _call(_compile(text, "mm", override), "mm", [a, b, c])
    np.testing.assert_allclose(c, a.T @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("shape", [(12, 47, 30), (32, 33, 8)])
def test_b_packing_split_is_correct(shape):
    _run_matmul(*shape, **_AVX2_PANELS)


def test_b_packing_split_in_parallel_row_blocks_with_k_blocks_is_correct():
    """Every parallel row block packs B per K block: each splits off the partial panel."""
    _run_matmul(64, 40, 64, **(_AVX2_PANELS | {"tile_m": 16, "tile_k": 16, "threads": 2}))


def test_b_packing_split_with_transposed_b_is_correct():
    """B stored [n, k]: its panels are rows of B; the partial one still packs last."""
    text = _named(
        "linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, "
        "affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>]",
        (24, 64),
        (70, 64),
        (24, 70),
    )
    _check(text, (24, 64), (70, 64), lambda a, b: a @ b.T)


def _packed_c_buffers(text: str, override: dict) -> int:
    """The 4-D tensors the schedule creates: packed C ([N/reg_n, M/reg_m, reg_m, reg_n])."""
    ops = _scheduled_ops(text, override)
    return sum(1 for name, shape in ops if name == "tensor.empty" and len(shape) == 4)


def test_one_k_block_tiles_write_c_directly():
    """With one K block the register tiles run inside the pass over C: no packed C (and so
    no zeroing pass and no pass reading it back), and the values are right."""
    one_block = _AVX2_PANELS | {"tile_m": 32, "tile_n": 32}
    assert _packed_c_buffers(_matmul(32, 64, 64), one_block) == 0
    _run_matmul(32, 64, 64, **one_block)
    assert _packed_c_buffers(_matmul(32, 64, 64), one_block | {"tile_k": 32}) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_one_k_block_row_blocks_write_c_directly(threads):
    """Several row blocks per parallel block: A is packed per row block, each block's
    register tiles still write C directly."""
    rows = _AVX2_PANELS | {"tile_m": 16, "tile_n": 64, "block_m": 64 // threads}
    rows |= {"threads": threads}
    assert _packed_c_buffers(_matmul(64, 64, 64), rows) == 0
    _run_matmul(64, 64, 64, **rows)


def test_one_k_block_tiles_with_consumers_write_c_directly():
    """Bias + ReLU run on the register tile before it is stored."""
    one_block = _AVX2_PANELS | {"tile_m": 16, "tile_n": 64}
    assert _packed_c_buffers(_mlp(16, [32, 64]), one_block) == 0
    _check_bias_relu(16, 32, 64, one_block, seed=5)


def _check_bias_relu(rows: int, k: int, n: int, override: dict, seed: int) -> None:
    """One MLP layer (matmul + bias + ReLU), scheduled with ``override``, against numpy."""
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((rows, k), np.float32), rng.standard_normal((k, n), np.float32)
    b, out = rng.standard_normal(n, np.float32), np.full((rows, n), np.nan, np.float32)
    _call(_compile(_mlp(rows, [k, n]), "mlp", override), "mlp", [x, w, b, out])
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape", [(30, 40, 64), (28, 40, 64), (30, 48, 64), (3, 9, 16)])
def test_edge_tiles_write_c_directly_in_peeled_pieces(shape):
    """With one K block, partial register tiles (rows, columns or both left over) are
    peeled into pieces that each compute their tiles inside the pass over C: no packed C,
    every piece's kernel vectorized (no linalg op left), and the values are right."""
    edges = _AVX2_PANELS | {"tile_m": 32, "tile_n": 48}
    assert _packed_c_buffers(_matmul(*shape), edges) == 0
    names = [name for name, _ in _scheduled_ops(_matmul(*shape), edges)]
    assert not [name for name in names if name.startswith("linalg.")]
    _run_matmul(*shape, **edges)


@pytest.mark.parametrize("threads", [1, 2])
def test_edge_tiles_with_consumers_keep_packed_c(threads):
    """An MLP layer (bias + ReLU) whose rows and columns leave partial tiles keeps packed
    C (its pieces would slice a whole packed C anyway); whole tiles write C directly."""
    override = _AVX2_PANELS | {"tile_m": 16, "tile_n": 48, "threads": threads}
    assert _packed_c_buffers(_mlp(30, [64, 40]), override) == 1
    assert _packed_c_buffers(_mlp(32, [64, 48]), override) == 0
    _check_bias_relu(30, 64, 40, override, seed=3)


# Two threads sharing B: K blocks of 16, row blocks of 16 in one block spanning C (N = 40:
# two whole 16-column panels and a partial one).
_SHARED_B = _AVX2_PANELS | {"tile_m": 16, "tile_k": 16, "block_m": 64, "threads": 2}
_SHARED_B |= {"share_b": True}


def _parallel_loops(text: str, override: dict) -> list[str]:
    """For each ``scf.forall`` the schedule leaves, the name of its closest enclosing loop
    (``scf.for`` / ``scf.forall``) or ``func.func``."""
    from stagegraph.mlir.bindings import ir, new_context

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(text)
        _schedule(payload, override)
        parents = []
        for op in _walk(payload.operation):
            if op.name != "scf.forall":
                continue
            parent = op.parent
            while parent.name not in ("scf.for", "scf.forall", "func.func"):
                parent = parent.parent
            parents.append(parent.name)
        return parents


def test_shared_b_is_packed_once_per_k_block_by_all_threads():
    """share_b: the K-block loop is serial and outermost; inside it the threads pack B's
    panels (one parallel loop) and then take the row blocks (another). The pass writing C
    back is a parallel loop of its own (packed C needs no zeroing pass: first_k_block); no
    parallel loop nests in another. Without share_b, one parallel loop of blocks holds the
    K-block loop."""
    assert sorted(_parallel_loops(_matmul(64, 40, 64), _SHARED_B)) == [
        "func.func",
        "scf.for",
        "scf.for",
    ]
    blocked = _SHARED_B | {"share_b": False, "block_m": 32}
    assert _parallel_loops(_matmul(64, 40, 64), blocked) == ["func.func"]


def test_shared_b_pass_over_c_writes_c_in_place():
    """The parallel pass over C takes blocks of whole panels (N = 40: 32 columns, then 8),
    so no block unpacks into a padded temporary that is then copied into C."""
    from stagegraph.mlir.bindings import ir, new_context, passmanager
    from stagegraph.stages.common import lowering

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(_matmul(64, 40, 64))
        _schedule(payload, _SHARED_B)
        passmanager.PassManager.parse(f"builtin.module({lowering.BUFFERIZE})").run(
            payload.operation
        )
        names = [op.name for op in _walk(payload.body.operations[0])]  # @mm
    assert "memref.copy" not in names and names.count("scf.forall") == 3


@pytest.mark.parametrize("shape", [(64, 40, 64), (62, 48, 48), (64, 33, 32)])
def test_shared_b_is_correct(shape):
    """Partial B panels, partial row tiles (62 = 15 x 4 + 2) and an aligned N, on two
    threads."""
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _run_matmul(*shape, **_SHARED_B)


def test_shared_b_with_consumers_is_correct():
    """Bias + ReLU run in the parallel pass over C."""
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _check_bias_relu(64, 32, 40, _SHARED_B, seed=7)


def test_k_blocked_matmuls_start_from_the_fill_and_are_right():
    """The x86 schedule marks its K-block loops: after scheduling, a K-blocked matmul has
    no fill pass over packed C, and its values are right on one and two threads."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect

    blocked = _AVX2_PANELS | {"tile_k": 16, "tile_m": 16, "block_m": 32}
    for override in (blocked, _SHARED_B):
        with new_context(), ir.Location.unknown():
            payload = ir.Module.parse(_matmul(64, 40, 64))
            _schedule(payload, override)
            # No pass writes the fill value (a constant) into the 4-D packed C's tiles.
            fills = [
                op
                for op in collect(payload, "vector.transfer_write")
                if op.operands[0].owner.name == "arith.constant"
                and ir.ShapedType(op.operands[1].type).rank == 4
            ]
            assert not fills and collect(payload, "scf.if")
    _run_matmul(64, 40, 64, **blocked)
    pytest.importorskip("stagegraph.runtime.openmp").library_path()
    _run_matmul(62, 40, 48, **_SHARED_B)


def test_accumulating_into_c_keeps_its_init():
    """C += A B (no fill): the first K block loads the packed init of C as before."""
    text = """
func.func @acc(%a: tensor<32x64xf32>, %b: tensor<64x40xf32>, %c: tensor<32x40xf32>)
    -> tensor<32x40xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<32x64xf32>, tensor<64x40xf32>)
                     outs(%c : tensor<32x40xf32>) -> tensor<32x40xf32>
  return %r : tensor<32x40xf32>
}
"""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((32, 64), np.float32), rng.standard_normal((64, 40), np.float32)
    c, out = rng.standard_normal((32, 40), np.float32), np.full((32, 40), np.nan, np.float32)
    engine = _compile(text, "acc", _AVX2_PANELS | {"tile_k": 16})
    _call(engine, "acc", [a, b, c.copy(), out])  # (the function updates its C argument)
    np.testing.assert_allclose(out, c + a @ b, rtol=1e-4, atol=1e-3)
