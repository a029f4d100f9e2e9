"""The GPU schedule's tiling and vectorization are semantics-preserving: the module the
``gpu.schedule`` stage produces (block and thread foralls, vector transfers) is bufferized,
run serially on the CPU (the foralls become loops) and checked against the references.
What only a GPU can check (the block/thread mapping itself) is checked by
``benchmarks/gpu_check.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.stages.analysis import analyze_stage
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify
from stagegraph.stages.gpu.normalize import gpu_normalize
from stagegraph.stages.gpu.params import gpu_heuristic
from stagegraph.stages.gpu.schedule import gpu_schedule
from stagegraph.stages.gpu.target import gpu_target
from tests.conftest import kernelbench_or_skip

PAYLOAD = Path(__file__).parent / "data" / "gpu_relu_sum.mlir"


def scheduled_on_cpu() -> sg.Graph:
    return sg.Graph(
        "gpu_schedule_on_cpu",
        [verify("load"), gpu_normalize("normalize"), analyze_stage("analyze"),
         gpu_target("target"), gpu_heuristic("select"), gpu_schedule("schedule"),
         bufferize(), linalg_to_loops("loops"), lower_to_llvm("lower"), jit("emit")],
        ["payload -> load.module", "load.module -> normalize.module",
         "normalize.module -> analyze.module", "analyze.facts -> select.facts",
         "target.facts -> select.target", "normalize.module -> schedule.module",
         "select.params -> schedule.params", "schedule.module -> bufferize.module",
         "bufferize.module -> loops.module", "loops.module -> lower.module",
         "lower.module -> emit.module"],
        [sg.GraphInput("payload", sg.Module["tensor"], frozenset({"input"}))],
    )  # fmt: skip


def test_scheduled_relu_and_row_sums_match_numpy(tmp_path):
    payload = tmp_path / "relu_sum.mlir"
    payload.write_text(PAYLOAD.read_text())
    x = np.random.default_rng(1).standard_normal((64, 512), np.float32)
    np.savez(tmp_path / "relu_sum.npz", in0=x, out0=np.maximum(x, 0), out1=np.exp(x).sum(1))
    report = sg.run(scheduled_on_cpu(), str(payload))
    assert report.verified is True, report.message


@pytest.mark.parametrize(
    "stem",
    ["l1_023_Softmax", "l1_040_LayerNorm", "l1_042_Max_Pooling_2D", "l1_020_LeakyReLU",
     "l1_050_conv_standard_2D_square_input_square_kernel", "l1_003_Batched_matrix_multiplication"],
)  # fmt: skip
def test_scheduled_kernelbench_payloads_verify(stem):
    folder = kernelbench_or_skip("level1")
    report = sg.run(scheduled_on_cpu(), str(folder / f"{stem}.mlir"))
    assert report.verified is True, report.message
