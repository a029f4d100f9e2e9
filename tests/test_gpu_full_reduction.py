"""Reductions to a scalar on the GPU graph (``gpu.full_reduction``), without a GPU.

A loss (``mean((a - b)^2)``) has no parallel loop: it used to run in one thread. Now B
blocks each reduce a contiguous part cooperatively into a partial, and one thread
combines the B partials: the plan (B from the target's SMs), the launches, ptxas, and the
numbers through ``gpu_cpu``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from tests.test_gpu_graph import needs_llvmlite

#: The sum of squared differences of two (rows x cols) matrices, into a scalar.
SQUARED = """#x = affine_map<(r, c) -> (r, c)>
#s = affine_map<(r, c) -> ()>
func.func @main(%a: tensor<{r}x{c}xf32>, %b: tensor<{r}x{c}xf32>) -> tensor<f32> {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %s = linalg.generic {{indexing_maps = [#x, #x, #s], iterator_types = ["reduction", "reduction"]}}
      ins(%a, %b : tensor<{r}x{c}xf32>, tensor<{r}x{c}xf32>) outs(%z : tensor<f32>) {{
  ^bb0(%x: f32, %y: f32, %out: f32):
    %d = arith.subf %x, %y : f32
    %q = arith.mulf %d, %d : f32
    %t = arith.addf %q, %out : f32
    linalg.yield %t : f32
  }} -> tensor<f32>
  return %s : tensor<f32>
}}
"""


def squared(tmp_path: Path, rows: int, cols: int) -> Path:
    path = tmp_path / f"squared_{rows}x{cols}.mlir"
    path.write_text(SQUARED.format(r=rows, c=cols))
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
    want = ((a.astype(np.float64) - b) ** 2).sum()
    np.savez(path.with_suffix(".npz"), in0=a, in1=b, out0=np.float32(want))
    return path


def test_a_scalar_reduction_spreads_over_blocks(tmp_path):
    kernels = sg.run("gpu", str(squared(tmp_path, 512, 1024)), target="sm_90a",
                     until="select").value("select").kernels  # fmt: skip
    plan = kernels[1]
    # 512K floats: 256 lanes of 4-float vectors, 512 steps of a block's worth: B = 256
    # blocks (the largest divisor within 2 per SM of 132), 2 steps each
    assert (plan.lanes, plan.vector, plan.split) == (256, 4, 256)
    assert plan.block_tile == (0, 1, 0, 0, 0)


@pytest.mark.parametrize(("rows", "cols"), [(512, 1024), (64, 256)])
def test_scalar_reductions_verify_on_the_cpu(tmp_path, rows, cols):
    report = sg.run("gpu_cpu", str(squared(tmp_path, rows, cols)))
    assert report.verified is True, report.message


@needs_llvmlite
def test_blocks_then_one_thread_combining_their_partials(tmp_path):
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", str(squared(tmp_path, 64, 256)), target="sm_90a",
                    until="emit").value("emit")  # fmt: skip
    launches = [(k["launch"]["grid"], k["launch"]["block"]) for k in binary.manifest["kernels"]]
    # 16K floats: 16 blocks of 256 threads; the scalar's fill, the partials' fill and the
    # combination of the 16 partials are small kernels around it
    assert ([16, 1, 1], [256, 1, 1]) in launches
    assert launches[-1] == ([1, 1, 1], [1, 1, 1])  # one thread adds the 16 partials
    for text in binary.ptx.values():
        for report in assemble(text, "sm_90a"):
            assert report.spill_stores == report.spill_loads == 0
