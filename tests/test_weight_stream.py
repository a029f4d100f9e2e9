"""A constant weight past L2 is read as one prefetched stream (``matmul.stream_params``,
``matmul.stream_prefetch``): the heuristic's choice on pinned targets, the prefetches in
the IR (one per cache line a read of the packed constant covers, clamped inside it, into
L2), and results that verify with and without K blocks."""

from __future__ import annotations

import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul.heuristic import heuristic_matmul_params
from stagegraph.stages.x86.matmul.stream_params import STREAM_PREFETCH_BYTES
from stagegraph.stages.x86.matmul.stream_prefetch import (
    L2_HINT,
    STREAM_PREFETCH_ATTR,
    prefetch_streams,
)
from tests.test_linear_layers import _linear

KIB, MIB = 1024, 1024 * 1024
TARGET = "x86-64-v4"  # 16 f32 lanes: 32-column panels (reg_n)
AVX512 = Target(isa=frozenset({"avx512f", "avx2", "fma"}), cores=1, vector_bits=512,
                l1d_bytes=48 * KIB, l2_bytes=2 * MIB, l3_bytes=32 * MIB)  # fmt: skip
AVX2 = Target(isa=frozenset({"avx2", "fma"}), cores=1, vector_bits=256,
              l1d_bytes=32 * KIB, l2_bytes=512 * KIB, l3_bytes=16 * MIB)  # fmt: skip


def test_few_rows_against_a_weight_past_l2_stream_it_in_one_k_block():
    """Batch 16 against 4096x4096 (64 MiB): one K block (the packed constant is then read
    in its memory order) and a prefetch distance; A (256 KiB) fits a quarter of L2."""
    chosen = heuristic_matmul_params(16, 4096, 4096, "f32", AVX512, constant_b=True)
    assert chosen.pack is True and chosen.tile_k == 0
    assert chosen.prefetch_b == STREAM_PREFETCH_BYTES


def test_many_rows_keep_k_blocks_and_prefetch_one_panel_ahead():
    """Batch 128 (A: 2 MiB, past a quarter of L2): K blocks stay; the prefetch runs one
    panel (k x reg_n elements) ahead, the micro-panel the next column of tiles reads."""
    chosen = heuristic_matmul_params(128, 4096, 4096, "f32", AVX512, constant_b=True)
    assert 0 < chosen.tile_k < 4096
    assert chosen.prefetch_b == 4096 * chosen.reg_n * 4
    on_avx2 = heuristic_matmul_params(16, 4096, 4096, "f32", AVX2, constant_b=True)
    assert on_avx2.reg_n == 16 and on_avx2.prefetch_b in (
        STREAM_PREFETCH_BYTES,
        4096 * 16 * 4,
    )


@pytest.mark.parametrize(
    ("m", "n", "k", "constant"),
    [
        (16, 512, 512, True),  # 1 MiB: inside L2, nothing to stream
        (16, 4096, 4096, False),  # an argument weight: packed per call, no stream
        (16, 1000, 4096, True),  # no whole panels: not packed at compile time
    ],
)
def test_no_stream_where_the_weight_is_cached_or_not_prepacked(m, n, k, constant):
    chosen = heuristic_matmul_params(m, n, k, "f32", AVX512, constant_b=constant)
    assert chosen.prefetch_b == 0


def _prefetches(tmp_path, m, k, n, param, transposed=True, target=TARGET):
    """The bufferized module of a Linear layer with ``param``, before and after
    :func:`prefetch_streams`: (its return value, the prefetch ops, the module)."""
    path = _linear(tmp_path, m, k, n, transposed)
    bufferized = sg.run("x86", path, threads=1, target=target, param=param, until="bufferized")
    module = bufferized.module.ir
    marked = collect(module, lambda op: STREAM_PREFETCH_ATTR in op.attributes)
    assert len(marked) >= 1 and all(op.name == "scf.for" for op in marked)
    inserted = prefetch_streams(module)
    assert collect(module, lambda op: STREAM_PREFETCH_ATTR in op.attributes) == []
    return inserted, collect(module, "memref.prefetch"), module


def test_every_line_of_a_packed_weight_read_is_prefetched_ahead_into_l2(tmp_path):
    """16 x 256 -> 256, one K block: the kernel reads [4, 32] f32 of the packed constant
    per step (k_unroll 4, 512 B): 8 prefetches, each of a flat view of the constant,
    clamped to its last element, with L2's locality hint."""
    inserted, prefetches, module = _prefetches(
        tmp_path, 16, 256, 256, {"prefetch_b": 4096, "tile_k": 0}
    )
    assert inserted == len(prefetches) == 8
    views = collect(module, "memref.collapse_shape")
    assert len(views) == 1
    flat = views[0]
    assert ir.MemRefType(flat.results[0].type).shape == [256 * 256]
    assert flat.operands[0].owner.operation.name == "memref.get_global"
    for prefetch in prefetches:
        assert prefetch.operands[0] == flat.results[0]
        assert ir.IntegerAttr(prefetch.attributes["localityHint"]).value == L2_HINT
        clamp = prefetch.operands[1].owner.operation
        assert clamp.name == "arith.minui"
        last = clamp.operands[1].owner.operation
        assert ir.IntegerAttr(last.attributes["value"]).value == 256 * 256 - 1


def test_a_payload_without_the_mark_gets_no_stream_prefetch(tmp_path):
    path = _linear(tmp_path, 16, 256, 256)
    bufferized = sg.run("x86", path, threads=1, target=TARGET, until="bufferized")
    assert prefetch_streams(bufferized.module.ir) == 0


@pytest.mark.parametrize(
    ("m", "k", "n", "transposed", "param", "target"),
    [
        (16, 256, 256, True, {"prefetch_b": 16384, "tile_k": 0}, TARGET),
        (4, 256, 128, False, {"prefetch_b": 1024, "tile_k": 0}, TARGET),
        (37, 96, 128, True, {"prefetch_b": 2048, "tile_k": 0}, TARGET),  # partial row tiles
        (64, 256, 256, True, {"prefetch_b": 256 * 32 * 4, "tile_k": 64}, TARGET),  # K blocks
        (12, 128, 64, True, {"prefetch_b": 4096, "tile_k": 0}, "x86-64-v3"),
    ],
)  # fmt: skip
def test_streamed_linear_layers_verify(tmp_path, m, k, n, transposed, param, target):
    path = _linear(tmp_path, m, k, n, transposed)
    report = sg.run("x86", path, threads=1, target=target, param=param)
    assert report.verified is True


def test_the_prefetch_distance_is_validated():
    from stagegraph.stages.x86.matmul.params import MatmulParams

    with pytest.raises(ValueError, match="prefetch_b"):
        MatmulParams(prefetch_b=-1)
    assert MatmulParams(prefetch_b=4096).prefetch_b == 4096


def test_the_heuristic_streams_a_weight_past_zen4s_l2_end_to_end(tmp_path):
    """16 x 512 -> 1024 for Zen 4 (1 MiB L2): the 2 MiB weight streams with the default
    params (one K block, 16 KiB ahead), the kernel's k loop carries the mark into
    bufferization; a 256 KiB weight (inside L2) does not. (IR only: the host may lack
    AVX-512.)"""
    path = _linear(tmp_path, 16, 512, 1024)
    scheduled = sg.run("x86", path, threads=1, target="znver4", until="bufferized")
    (chosen,) = scheduled.params.matmul
    assert chosen.tile_k == 0 and chosen.prefetch_b == STREAM_PREFETCH_BYTES
    module = scheduled.module.ir
    marked = collect(module, lambda op: STREAM_PREFETCH_ATTR in op.attributes)
    assert marked and all(
        ir.IntegerAttr(op.attributes[STREAM_PREFETCH_ATTR]).value == STREAM_PREFETCH_BYTES
        for op in marked
    )
    assert prefetch_streams(module) == 8 * len(marked)  # 4 x 32 f32 per read: 8 lines
    small = sg.run("x86", _linear(tmp_path, 16, 256, 256), threads=1, target="znver4",
                   until="bufferized")  # fmt: skip
    assert small.params.matmul[0].prefetch_b == 0
    assert collect(small.module.ir, lambda op: STREAM_PREFETCH_ATTR in op.attributes) == []


def test_a_weight_read_as_it_lies_streams_few_rows_at_once():
    """Batch 4 against 4096 -> 4100 (no whole panels: not packed at compile time, read as
    it lies): past L2, K blocks of UNPACKED_STREAM_ROWS rows (as many concurrent streams);
    inside L2 the blocks stay as they were."""
    from stagegraph.stages.x86.matmul.stream_params import UNPACKED_STREAM_ROWS

    past = heuristic_matmul_params(4, 4100, 4096, "f32", AVX512, constant_b=True)
    assert past.pack is False and past.tile_k == UNPACKED_STREAM_ROWS
    on_avx2 = heuristic_matmul_params(4, 4100, 4096, "f32", AVX2, constant_b=True)
    assert on_avx2.pack is False and on_avx2.tile_k == UNPACKED_STREAM_ROWS
    cached = heuristic_matmul_params(4, 100, 1024, "f32", AVX512, constant_b=True)
    assert cached.pack is False and cached.tile_k != UNPACKED_STREAM_ROWS


@pytest.mark.parametrize("target", [None, "x86-64-v3"])
def test_unpacked_k_blocks_of_few_rows_verify(tmp_path, target):
    path = _linear(tmp_path, 4, 256, 100)  # 100 columns: no whole panels
    param = {"pack": False, "tile_k": 16}
    assert sg.run("x86", path, threads=1, target=target, param=param).verified is True
    assert sg.run("x86", _linear(tmp_path, 3, 96, 40), threads=1, target=target,
                  param={"pack": False, "tile_k": 16}).verified is True  # fmt: skip
