"""Cooperative reductions on the GPU graph (``gpu.reduction``), without a GPU.

A reduction over contiguous rows runs one block per row whose threads read the row
together: planned by the cost model (lanes, vector width, from the target's warp size),
checked in the schedule's IR (one thread forall over the row's lanes, the accumulator in
registers, partial results in shared memory once lowered), in the PTX (16-byte vector
loads, shared memory, barriers, grid = rows), assembled by ptxas without spills, and run
by numbers through ``gpu_cpu``. Softmax's ``exp(x - max)`` is recomputed in both its
consumers (``gpu.recompute``): three kernels, not four."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.stages.gpu.reduction import row_loops, row_split
from tests.test_gpu_graph import needs_llvmlite

#: Softmax over the rows of a rows x cols matrix, as PyTorch's import gives it.
SOFTMAX = """#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @main(%x: tensor<{r}x{c}xf32>) -> tensor<{r}x{c}xf32> {{
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{r}xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%e : tensor<{r}xf32>) -> tensor<{r}xf32>
  %m = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
      ins(%x : tensor<{r}x{c}xf32>) outs(%m0 : tensor<{r}xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %y = arith.maximumf %in, %out : f32
    linalg.yield %y : f32
  }} -> tensor<{r}xf32>
  %full = tensor.empty() : tensor<{r}x{c}xf32>
  %ex = linalg.generic {{indexing_maps = [#id, #row, #id],
                         iterator_types = ["parallel", "parallel"]}}
      ins(%x, %m : tensor<{r}x{c}xf32>, tensor<{r}xf32>) outs(%full : tensor<{r}x{c}xf32>) {{
  ^bb0(%in: f32, %mx: f32, %out: f32):
    %d = arith.subf %in, %mx : f32
    %y = math.exp %d : f32
    linalg.yield %y : f32
  }} -> tensor<{r}x{c}xf32>
  %s0 = linalg.fill ins(%zero : f32) outs(%e : tensor<{r}xf32>) -> tensor<{r}xf32>
  %s = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
      ins(%ex : tensor<{r}x{c}xf32>) outs(%s0 : tensor<{r}xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %y = arith.addf %in, %out : f32
    linalg.yield %y : f32
  }} -> tensor<{r}xf32>
  %o = linalg.generic {{indexing_maps = [#id, #row, #id],
                        iterator_types = ["parallel", "parallel"]}}
      ins(%ex, %s : tensor<{r}x{c}xf32>, tensor<{r}xf32>) outs(%full : tensor<{r}x{c}xf32>) {{
  ^bb0(%in: f32, %sum: f32, %out: f32):
    %y = arith.divf %in, %sum : f32
    linalg.yield %y : f32
  }} -> tensor<{r}x{c}xf32>
  return %o : tensor<{r}x{c}xf32>
}}
"""

#: Per-channel statistics of an NCHW tensor (training-mode BatchNorm): the sum of
#: squares and the maximum of each channel, reducing over N, H and W.
CHANNELS = """#x = affine_map<(n, c, h, w) -> (n, c, h, w)>
#c = affine_map<(n, c, h, w) -> (c)>
func.func @main(%x: tensor<{n}x{c}x{h}x{w}xf32>) -> (tensor<{c}xf32>, tensor<{c}xf32>) {{
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e = tensor.empty() : tensor<{c}xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<{c}xf32>) -> tensor<{c}xf32>
  %sq = linalg.generic {{indexing_maps = [#x, #c],
                        iterator_types = ["reduction", "parallel", "reduction", "reduction"]}}
      ins(%x : tensor<{n}x{c}x{h}x{w}xf32>) outs(%z : tensor<{c}xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %m = arith.mulf %in, %in : f32
    %s = arith.addf %m, %out : f32
    linalg.yield %s : f32
  }} -> tensor<{c}xf32>
  %f = linalg.fill ins(%ninf : f32) outs(%e : tensor<{c}xf32>) -> tensor<{c}xf32>
  %mx = linalg.generic {{indexing_maps = [#x, #c],
                        iterator_types = ["reduction", "parallel", "reduction", "reduction"]}}
      ins(%x : tensor<{n}x{c}x{h}x{w}xf32>) outs(%f : tensor<{c}xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %s = arith.maximumf %in, %out : f32
    linalg.yield %s : f32
  }} -> tensor<{c}xf32>
  return %sq, %mx : tensor<{c}xf32>, tensor<{c}xf32>
}}
"""


def softmax(tmp_path: Path, rows: int, cols: int) -> Path:
    path = tmp_path / f"softmax_{rows}x{cols}.mlir"
    path.write_text(SOFTMAX.format(r=rows, c=cols))
    x = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32) * 4
    e = np.exp(x - x.max(1, keepdims=True))
    np.savez(path.with_suffix(".npz"), in0=x, out0=(e / e.sum(1, keepdims=True)))
    return path


def channels(tmp_path: Path, n: int, c: int, h: int, w: int) -> Path:
    path = tmp_path / f"channels_{n}x{c}x{h}x{w}.mlir"
    path.write_text(CHANNELS.format(n=n, c=c, h=h, w=w))
    x = np.random.default_rng(4).standard_normal((n, c, h, w)).astype(np.float32)
    squares = (x.astype(np.float64) ** 2).sum((0, 2, 3)).astype(np.float32)
    np.savez(path.with_suffix(".npz"), in0=x, out0=squares, out1=x.max((0, 2, 3)))
    return path


def plans(path: Path, **kwargs) -> tuple:
    return sg.run("gpu", str(path), until="select", **kwargs).value("select").kernels


# -- the cost model ---------------------------------------------------------------------


def test_row_split_prefers_wide_vectors_and_whole_warps():
    assert row_split(16384, 4, 32, 256) == (256, 4)  # 4096 vectors: 256 lanes, 16 steps
    assert row_split(192, 4, 32, 256) == (96, 2)  # 48 vectors are no whole warps; 96 pairs are
    assert row_split(4096, 2, 32, 256) == (256, 8)  # half precision: 8 to a 16-byte vector
    assert row_split(255, 4, 32, 256) is None  # odd: no whole warps at all
    assert row_split(1024, 4, 64, 128) == (128, 4)  # the target's warp and block limits


def test_row_loops_are_the_trailing_contiguous_reductions():
    nchw = ((0, 1, 2, 3), (1,))  # x[n, c, h, w] -> out[c]
    assert row_loops(("reduction", "parallel", "reduction", "reduction"), nchw) == 2
    rows = ((0, 1), (0,))
    assert row_loops(("parallel", "reduction"), rows) == 1
    columns = ((0, 2, 1), (0, 1))  # x[b, k, j] -> out[b, j]: k is not innermost
    assert row_loops(("parallel", "parallel", "reduction"), columns) is None
    transposed = ((0, 2, 1), (0,))  # x[b, w, h] reduced over h, w: w is not innermost
    assert row_loops(("parallel", "reduction", "reduction"), transposed) is None
    split = ((1, 0, 2), (0,))  # x[h, b, w] reduced over h, w: only w is contiguous
    assert row_loops(("parallel", "reduction", "reduction"), split) == 2


def test_softmax_reductions_get_a_block_per_row(tmp_path):
    kernels = plans(softmax(tmp_path, 64, 4096), target="sm_90a", param={"row_kernels": False})
    rows = [k for k in kernels if k.lanes]
    assert [k.op for k in rows] == [1, 3]  # the max and the sum (exp fused into it)
    for plan in rows:
        assert (plan.lanes, plan.vector, plan.threads, plan.merge) == (256, 4, (256,), 32)
        assert plan.block_tile == (1, 0, 0, 0)  # the row, then its J, L, V loops
    assert len(kernels) == 5  # two fills, two reductions, one division: exp is recomputed


def test_softmax_is_one_row_kernel(tmp_path):
    kernels = plans(softmax(tmp_path, 64, 4096), target="sm_90a")
    division = kernels[4]
    # the division's rows to blocks, with both fills and both reductions inside
    assert division.group == (0, 1, 2, 3) and division.lanes == 256 and division.vector == 4
    assert division.block_tile == (1, 0, 0, 0)
    assert not kernels[0].mapped and not kernels[2].mapped  # the fills: no launch of their own


def test_channel_statistics_get_a_block_per_channel(tmp_path):
    kernels = plans(channels(tmp_path, 4, 8, 16, 64), target="sm_80")
    for plan in (kernels[1], kernels[3]):
        # H x W = 1024 contiguous floats per (n, c): 256 lanes of 4-float vectors, N a loop
        assert (plan.lanes, plan.vector) == (256, 4)
        assert plan.block_tile == (0, 1, 0, 0, 0)


def test_uneven_rows_split_into_contiguous_pieces(tmp_path):
    (_fill, row, *_) = plans(softmax(tmp_path, 16, 255), target="sm_90a")
    assert (row.lanes, row.vector, row.block_tile) == (64, 1, (1, 0))


def test_short_rows_stay_one_thread_per_row(tmp_path):
    kernels = plans(softmax(tmp_path, 64, 40), target="sm_90a")
    assert not any(k.lanes or k.group for k in kernels)  # 40 < two warps' worth
    assert kernels[1].threads == (64,) and kernels[1].block_tile == (64, 0)
    assert kernels[1].accumulate == (1, 40)  # each thread's 40 steps, in a register


def test_one_thread_per_row_accumulates_in_a_register(tmp_path):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    path = softmax(tmp_path, 64, 40)
    module = sg.run("gpu", str(path), target="sm_90a", until="scheduled").module.ir
    loops = [loop for loop in collect(module, "scf.for") if loop.parent.name == "scf.forall"]
    assert len(loops) == 2  # the max's and the sum's 40 steps (10 trips of 4)
    for loop in loops:
        carried = [a.type for a in loop.regions[0].blocks[0].arguments[1:]]
        assert any(isinstance(t, ir.VectorType) for t in carried)
    report = sg.run("gpu_cpu", str(path))
    assert report.verified is True, report.message


# -- numbers through gpu_cpu (the schedule run serially on the CPU) ----------------------


@pytest.mark.parametrize(("rows", "cols"), [(8, 4096), (16, 255), (32, 192)])
def test_softmax_verifies_on_the_cpu(tmp_path, rows, cols):
    report = sg.run("gpu_cpu", str(softmax(tmp_path, rows, cols)))
    assert report.verified is True, report.message


@pytest.mark.parametrize("shape", [(4, 8, 16, 64), (3, 5, 7, 15)])
def test_channel_statistics_verify_on_the_cpu(tmp_path, shape):
    report = sg.run("gpu_cpu", str(channels(tmp_path, *shape)))
    assert report.verified is True, report.message


# -- the lowered kernels ------------------------------------------------------------------


def test_row_steps_accumulate_in_registers_and_partials_in_shared_memory(tmp_path):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    path = softmax(tmp_path, 8, 16384)
    unfused = {"row_kernels": False}
    module = sg.run("gpu", str(path), target="sm_90a", until="scheduled", param=unfused).module.ir
    stepping = [
        f
        for f in collect(module, "scf.forall")
        if f.parent.name == "scf.forall" and collect(f, "scf.for")
    ]  # thread foralls
    assert len(stepping) == 2  # the max's and the sum's lanes, each stepping its row
    for forall in stepping:
        (loop,) = collect(forall, "scf.for")  # J = 16 steps, unrolled by 4
        assert len(collect(loop, "vector.transfer_read")) == 4
        carried = [a.type for a in loop.regions[0].blocks[0].arguments[1:]]
        # the accumulator is a loop-carried vector (a register), not a tensor in memory
        assert [isinstance(t, ir.VectorType) for t in carried] == [True]
    lowered = sg.run("gpu", str(path), target="sm_90a", until="lower", param=unfused).module.ir
    spaces = [
        ir.IntegerAttr(op.attributes["addr_space"]).value
        for op in collect(lowered, "llvm.mlir.global")
        if "addr_space" in op.attributes
    ]
    assert spaces.count(3) == 4  # each reduction's lanes' and warp's partials: shared memory


@needs_llvmlite
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_row_reduction_kernels_load_vectors_and_assemble_without_spills(tmp_path, arch):
    from stagegraph.stages.gpu.ptx import assemble

    path = softmax(tmp_path, 64, 4096)
    unfused = {"row_kernels": False}
    binary = sg.run("gpu", str(path), target=arch, until="emit", param=unfused).value("emit")
    launches = [k["launch"] for k in binary.manifest["kernels"]]
    rows = [launch for launch in launches if launch["grid"][0] * launch["grid"][1] == 64
            and launch["block"] == [256, 1, 1]]  # fmt: skip
    assert len(rows) >= 2  # the max and the sum: one block of 256 threads per row
    reductions = [text for text in binary.ptx.values() if ".shared" in text]
    assert len(reductions) == 2  # the max and the sum; fills and the division need none
    for text in reductions:
        assert "ld.global.v4" in text  # coalesced 16-byte steps along the row
        assert "st.shared" in text and "ld.shared" in text
        # lanes write partials, a barrier, a warp combines them, a barrier, one thread
        assert text.count("bar.sync") >= 2
        for report in assemble(text, arch):
            assert report.spill_stores == report.spill_loads == 0


@needs_llvmlite
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_softmax_row_kernel_reads_rows_and_writes_once(tmp_path, arch):
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", str(softmax(tmp_path, 64, 4096)), target=arch,
                    until="emit").value("emit")  # fmt: skip
    (kernel,) = binary.manifest["kernels"]
    assert kernel["launch"]["grid"] == [64, 1, 1] and kernel["launch"]["block"] == [256, 1, 1]
    (text,) = binary.ptx.values()
    # the row read three times (max, sum, division), 4 vectors per thread each; y written once
    assert text.count("ld.global.v4") == 12 and text.count("st.global.v4") == 4
    # max: lanes, warp, one thread; sum: the same; the division: a barrier after each
    assert text.count("bar.sync") >= 6
    (report,) = assemble(text, arch)
    assert report.spill_stores == report.spill_loads == 0
