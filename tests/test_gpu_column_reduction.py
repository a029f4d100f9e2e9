"""Split column reductions on the GPU graph (``gpu.column_reduction``), without a GPU.

A reduction over a non-innermost dim (``x.sum(dim=1)`` of a (B, K, J) tensor) whose outputs
are too few to fill the GPU splits K S ways: the cost model's S (from the target's SMs and
threads per SM), the split op's threads walking their rows with the accumulator in a
register (unrolled loads in the PTX), ptxas without spills, numbers through ``gpu_cpu``
(including PyTorch's import form, with a kept unit dim)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.stages.gpu.column_reduction import column_split
from tests.test_gpu_graph import needs_llvmlite

#: ``op`` over dim 1 of a (b, k, j) tensor, keeping the dim (b, 1, j) as PyTorch's import
#: gives ``x.sum(dim=1, keepdim=True)``, or not.
COLUMNS = """#x = affine_map<(b, u, k, j) -> (b, k, j)>
#o = affine_map<(b, u, k, j) -> (b, u, j)>
func.func @main(%x: tensor<{b}x{k}x{j}xf32>) -> tensor<{b}x1x{j}xf32> {{
  %init = arith.constant {init} : f32
  %e = tensor.empty() : tensor<{b}x1x{j}xf32>
  %z = linalg.fill ins(%init : f32) outs(%e : tensor<{b}x1x{j}xf32>) -> tensor<{b}x1x{j}xf32>
  %r = linalg.generic {{indexing_maps = [#x, #o],
                        iterator_types = ["parallel", "parallel", "reduction", "parallel"]}}
      ins(%x : tensor<{b}x{k}x{j}xf32>) outs(%z : tensor<{b}x1x{j}xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %y = {op} %in, %out : f32
    linalg.yield %y : f32
  }} -> tensor<{b}x1x{j}xf32>
  return %r : tensor<{b}x1x{j}xf32>
}}
"""


def columns(tmp_path: Path, b: int, k: int, j: int, op: str = "sum") -> Path:
    body, init = {"sum": ("arith.addf", "0.0"), "max": ("arith.maximumf", "0xFF800000")}[op]
    path = tmp_path / f"columns_{op}_{b}x{k}x{j}.mlir"
    path.write_text(COLUMNS.format(b=b, k=k, j=j, op=body, init=init))
    x = np.random.default_rng(5).standard_normal((b, k, j)).astype(np.float32)
    want = x.astype(np.float64).sum(1) if op == "sum" else x.max(1)
    np.savez(path.with_suffix(".npz"), in0=x, out0=want.astype(np.float32)[:, None, :])
    return path


def plans(path: Path, **kwargs) -> tuple:
    return sg.run("gpu", str(path), until="select", **kwargs).value("select").kernels


def test_split_fills_the_gpu_with_the_fewest_partials():
    h100 = 132 * 2048
    assert column_split(32 * 1024, 4096, h100) == 16  # 8 would leave 262144 < 270336 threads
    assert column_split(32 * 4096, 1024, h100) == 4
    assert column_split(128, 4096, h100) == 256  # never enough: as many as 16-row pieces allow
    assert column_split(h100, 4096, h100) == 1  # the outputs alone fill it
    assert column_split(128, 24, h100) == 1  # too short to split into 16-row pieces


def test_column_sum_plans_a_split(tmp_path):
    (_fill, plan) = plans(columns(tmp_path, 2, 4096, 64), target="sm_90a")
    assert plan.split == 256
    # the split op's loops: (b, 1, S, K/S, j); S at 2, K/S = 16 rows at 3
    assert plan.split_loops == (2, 3, 16)
    assert plan.thread_tile[-1] == 1 and plan.threads[0] == 64  # thread x along j


@pytest.mark.parametrize("op", ["sum", "max"])
def test_column_reductions_verify_on_the_cpu(tmp_path, op):
    report = sg.run("gpu_cpu", str(columns(tmp_path, 2, 4096, 64, op)))
    assert report.verified is True, report.message


@needs_llvmlite
def test_split_kernel_walks_rows_in_registers_without_spills(tmp_path):
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", str(columns(tmp_path, 2, 4096, 64)), target="sm_90a",
                    until="emit").value("emit")  # fmt: skip
    grids = [k["launch"]["grid"] for k in binary.manifest["kernels"]]
    assert len(grids) == 4  # the output's fill, the partials' fill, the split, the combine
    split = [t for t in binary.ptx.values() if t.count("ld.global") >= 4 and "st.global" in t]
    walking = [t for t in split if "+256]" in t]  # consecutive rows: 64 floats apart
    assert walking, "the split kernel must load several rows per loop trip (unrolled)"
    for text in binary.ptx.values():
        for report in assemble(text, "sm_90a"):
            assert report.spill_stores == report.spill_loads == 0
