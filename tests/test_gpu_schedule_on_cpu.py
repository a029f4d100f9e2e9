"""The GPU schedule's tiling and vectorization are semantics-preserving: the ``gpu_cpu``
graph runs the module the ``gpu.schedule`` stage produces (block and thread foralls, vector
transfers) serially on the CPU and checks it against the references.
What only a GPU can check (the block/thread mapping itself) is checked by
``benchmarks/gpu_check.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from tests.conftest import kernelbench_or_skip

PAYLOAD = Path(__file__).parent / "data" / "gpu_relu_sum.mlir"


def test_scheduled_relu_and_row_sums_match_numpy(tmp_path):
    payload = tmp_path / "relu_sum.mlir"
    payload.write_text(PAYLOAD.read_text())
    x = np.random.default_rng(1).standard_normal((64, 512), np.float32)
    np.savez(tmp_path / "relu_sum.npz", in0=x, out0=np.maximum(x, 0), out1=np.exp(x).sum(1))
    report = sg.run("gpu_cpu", str(payload))
    assert report.verified is True, report.message


@pytest.mark.parametrize(
    "stem",
    ["l1_023_Softmax", "l1_040_LayerNorm", "l1_042_Max_Pooling_2D", "l1_020_LeakyReLU",
     "l1_050_conv_standard_2D_square_input_square_kernel", "l1_003_Batched_matrix_multiplication"],
)  # fmt: skip
def test_scheduled_kernelbench_payloads_verify(stem):
    folder = kernelbench_or_skip("level1")
    report = sg.run("gpu_cpu", str(folder / f"{stem}.mlir"))
    assert report.verified is True, report.message
