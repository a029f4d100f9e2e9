"""PyTorch as a peer: ``bench --vs torch`` (eager) and ``--vs torch-compile`` (inductor)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from stagegraph.cli.main import main  # noqa: E402

PROBLEM = """
import torch

rows = 16
cols = 32

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(torch.tanh(x) * 2.0, dim=1)

def get_inputs():
    return [torch.rand(rows, cols)]

def get_init_inputs():
    return []
"""


@pytest.fixture
def problem(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(PROBLEM)
    return path


def bench_json(capsys, *args: str) -> tuple[int, dict, str]:
    code = main(["bench", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_vs_torch_is_verified_interleaved_and_pinned(capsys, problem):
    code, result, _ = bench_json(
        capsys, "x86", str(problem), "--vs", "torch", "--threads", "1", "--budget", "0.5",
        "--repeat", "4",
    )  # fmt: skip
    assert code == 0
    assert result["a"]["graph"] == "x86" and result["b"]["graph"] == "torch"
    assert result["b"]["verified"] is True and result["b"]["threads"] == 1
    assert "PyTorch 2." in result["b"]["message"]
    assert result["ratio_low"] <= result["ratio"] <= result["ratio_high"]
    assert result["a"]["samples"] >= 2 and result["b"]["samples"] >= 2


def test_peer_threads_are_pinned_while_measuring_and_restored(problem):
    from stagegraph.app.torch_peer import TorchMeasurement
    from stagegraph.workload import parse_workload

    before = torch.get_num_threads()
    measurement = TorchMeasurement(parse_workload(str(problem)), threads=1, peer="torch")
    seen = []
    measurement.fn = lambda *args: seen.append(torch.get_num_threads())
    measurement.measure(3, warmup=1)
    assert seen == [1, 1, 1, 1] and torch.get_num_threads() == before


def test_a_payload_without_a_pytorch_module_is_refused(capsys):
    code, _, err = bench_json(capsys, "x86", "matmul:m=8,n=8,k=8", "--vs", "torch")
    assert code == 2
    assert "--vs torch" in err and "has no PyTorch module" in err


@pytest.mark.slow  # inductor compiles C++ (minutes on a loaded machine)
def test_vs_torch_compile(capsys, problem):
    code, result, _ = bench_json(
        capsys, "x86", str(problem), "--vs", "torch-compile", "--threads", "1", "--budget", "0.5"
    )
    assert code == 0
    assert result["b"]["graph"] == "torch-compile" and result["b"]["verified"] is True
