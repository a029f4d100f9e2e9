"""PyTorch workloads from the command line: problem files (overrides, seeds, buffers a
training-mode model updates), factories, ``--save-payload``, ``--isolate`` and the errors
(exit 2, the op or constant named)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stagegraph.cli.main import main  # noqa: E402
from stagegraph.workload import parse_workload  # noqa: E402

PROBLEM = """
import torch
import torch.nn as nn

batch_size = 4
in_channels = 3
out_channels = 8
height = width = 10
kernel_size = 3
bias_shape = (out_channels, 1, 1)
scale = 2.0


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape, scale):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.bias) * self.scale


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape, scale]
"""

UNSUPPORTED = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.special.i0(x)

def get_inputs():
    return [torch.rand(4, 4)]

def get_init_inputs():
    return []
"""


@pytest.fixture
def problem(tmp_path):
    path = tmp_path / "conv_bn.py"
    path.write_text(PROBLEM)
    return path


def run_json(capsys, *args: str) -> tuple[int, dict, str]:
    code = main(["run", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_problem_file_runs_at_overridden_sizes_and_verifies(capsys, problem):
    code, report, _ = run_json(
        capsys, "x86", f"{problem}:batch_size=2,out_channels=5,height=6", "--threads", "1"
    )
    assert code == 0 and report["verified"] is True
    workload = parse_workload(f"{problem}:batch_size=2,out_channels=5,height=6")
    assert [s.shape for s in workload.input_specs()] == [(2, 3, 6, 6)]  # width follows height
    # updated running mean, running var, batch count, then the output (channels follow)
    shapes = [(s.shape, s.dtype) for s in workload.output_specs()]
    assert shapes == [((5,), "f32"), ((5,), "f32"), ((), "i64"), ((2, 5, 4, 4), "f32")]


def test_updated_buffers_are_the_eager_ones(problem):
    workload = parse_workload(f"{problem}:batch_size=2")
    model = workload.torch_model()
    x = torch.from_numpy(np.array(workload.inputs()[0]))
    with torch.no_grad():
        out = model(x)
    mean, var, count, result = workload.reference()
    np.testing.assert_array_equal(mean, model.bn.running_mean.numpy())
    np.testing.assert_array_equal(var, model.bn.running_var.numpy())
    assert int(count) == 1 and not np.allclose(mean, 0)  # stats moved from their init
    np.testing.assert_array_equal(result, out.numpy())


def test_seed_seeds_the_model_and_the_inputs_like_kernelbench(problem):
    first = parse_workload(f"{problem}:batch_size=1").inputs()[0]
    again = parse_workload(f"{problem}:batch_size=1,seed=0").inputs()[0]
    other = parse_workload(f"{problem}:batch_size=1,seed=7")
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other.inputs()[0])
    torch.manual_seed(7)  # before the model: its first draw is the convolution's weight
    weight = torch.nn.Conv2d(3, 8, 3).weight
    assert torch.equal(other.torch_model().conv.weight, weight)
    torch.manual_seed(7)  # again before get_inputs()
    np.testing.assert_array_equal(other.inputs()[0], torch.rand(1, 3, 10, 10).numpy())


def test_factory_spec(capsys, tmp_path, monkeypatch):
    package = tmp_path / "sg_torch_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "small.py").write_text(
        "import torch\n"
        "def make():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh())\n"
        "    return model, (torch.rand(3, 8),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, report, _ = run_json(capsys, "x86", "sg_torch_models.small:make", "--threads", "1")
    assert code == 0 and report["verified"] is True
    code, _, err = run_json(capsys, "x86", "sg_torch_models.small:absent")
    assert code == 2 and "has no function 'absent'" in err


def test_save_payload_reruns_without_pytorch(capsys, problem, tmp_path):
    saved = tmp_path / "saved"
    code, report, _ = run_json(
        capsys, "x86", f"{problem}:batch_size=2", "--save-payload", str(saved), "--threads", "1"
    )
    assert code == 0 and report["verified"] is True
    with np.load(saved / "conv_bn.npz") as data:
        assert sorted(data.files) == ["in0", "mut0", "mut1", "mut2", "out0"]
        assert data["in0"].shape == (2, 3, 10, 10)
    code, report, _ = run_json(capsys, "x86", str(saved / "conv_bn.mlir"), "--threads", "1")
    assert code == 0 and report["verified"] is True
    code, _, err = run_json(capsys, "x86", "matmul:m=8,n=8,k=8", "--save-payload", str(saved))
    assert code == 2 and "--save-payload" in err and "already an MLIR payload" in err


def test_import_runs_in_the_isolated_child(capsys, problem):
    code, report, _ = run_json(capsys, "x86", f"{problem}:batch_size=1", "--isolate")
    assert code == 0 and report["verified"] is True


def test_an_op_the_importer_cannot_take_is_named(capsys, tmp_path):
    path = tmp_path / "special.py"
    path.write_text(UNSUPPORTED)
    code, _, err = run_json(capsys, "x86", str(path))
    assert code == 2
    assert "special.py:Model" in err and "torch.aten.i0" in err
    assert "Traceback" not in err


def test_a_failing_problem_file_is_named(capsys, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(PROBLEM.replace("return [torch.rand", "return [torch.randd"))
    code, _, err = run_json(capsys, "x86", str(path))
    assert code == 2 and "broken.py: get_inputs() failed: AttributeError" in err


def test_the_import_counts_against_the_compile_time_limit(problem):
    import subprocess
    import sys
    from pathlib import Path

    cli = Path(sys.executable).with_name("stagegraph")
    done = subprocess.run(
        [str(cli), "run", "x86", str(problem), "--compile-timeout", "0.2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"importing the workload {problem} did not finish within the compile time" in (
        done.stderr
    )


STATEFUL = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(12, 4)
        self.hidden = torch.randn(2, 4)  # a plain tensor attribute, reassigned in forward

    def forward(self, x):
        self.hidden = torch.tanh(self.cell(torch.cat((x, self.hidden), dim=1)))
        return self.hidden * 2.0

def get_inputs():
    return [torch.rand(2, 8)]

def get_init_inputs():
    return []
"""


def test_a_reassigned_tensor_attribute_becomes_a_verified_buffer(capsys, tmp_path):
    path = tmp_path / "stateful.py"
    path.write_text(STATEFUL)
    code, report, _ = run_json(capsys, "x86", str(path), "--threads", "1")
    assert code == 0 and report["verified"] is True
    workload = parse_workload(str(path))
    assert [s.shape for s in workload.output_specs()] == [(2, 4), (2, 4)]  # hidden, output
    hidden, output = workload.reference()
    np.testing.assert_allclose(output, hidden * 2.0, rtol=1e-6)


RANDOM = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)  # put in eval mode: verifiable

    def forward(self, x):
        return self.drop(x) + NOISE

def get_inputs():
    return [torch.rand(4, 8)]

def get_init_inputs():
    return []
"""


def test_dropout_is_verified_in_eval_mode_and_other_draws_are_refused(capsys, tmp_path):
    path = tmp_path / "dropout.py"
    path.write_text(RANDOM.replace("NOISE", "1.0"))
    code, report, _ = run_json(capsys, "x86", str(path), "--threads", "1")
    assert code == 0 and report["verified"] is True
    path = tmp_path / "noisy.py"
    path.write_text(RANDOM.replace("NOISE", "torch.randn(4, 8)"))
    code, _, err = run_json(capsys, "x86", str(path))
    assert code == 2
    assert "noisy.py:Model: its forward draws random numbers (aten.randn.default)" in err


def test_a_zero_size_layer_is_a_clean_payload_error(tmp_path, capsys):
    """A Linear with no outputs imports to a module whose bytecode does not parse back:
    exit 2 with a message naming the cause, not a traceback."""
    pytest.importorskip("torch")
    from stagegraph.cli.main import main

    problem = tmp_path / "empty_linear.py"
    problem.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(8, 0)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
        "def get_inputs():\n    return [torch.rand(1, 8)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    assert main(["run", "x86", str(problem)]) == 2
    assert "dimension of 0" in capsys.readouterr().err
