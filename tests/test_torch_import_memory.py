"""torch-mlir's FX importer without its copies of the weights: the same imported text."""

from __future__ import annotations

import contextlib

import pytest

pytest.importorskip("torch")  # the FX importer runs on torch.export programs


def _program():
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.norm = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8 * 6 * 6, 16)
            self.register_buffer("offsets", torch.arange(16, dtype=torch.int64))
            self.register_buffer("scale", torch.full((1,), 0.5))  # one element: a splat

        def forward(self, x):
            y = self.norm(self.conv(x)).relu().flatten(1)
            return self.fc(y) * self.scale + self.offsets

    torch.manual_seed(0)
    model = Model().eval()
    return torch.export.export(model, (torch.rand(2, 3, 8, 8),), strict=False)


def test_weights_read_as_arrays_import_the_same_text(monkeypatch):
    import torch

    from stagegraph.mlir import torch_import_memory
    from stagegraph.mlir.torch_import import import_program

    program = _program()
    tolist = torch.Tensor.tolist
    listed: list[int] = []

    def counting(self):
        listed.append(self.numel())
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    fast, _ = import_program(program, "test:Model")
    assert all(n <= 1 for n in listed)  # no weight went through a Python list
    monkeypatch.setattr(torch_import_memory, "lean_import", contextlib.nullcontext)
    listed.clear()
    plain, _ = import_program(program, "test:Model")
    assert any(n > 1 for n in listed)  # the importer's own path
    assert fast == plain
    assert "dense_resource" in fast


def test_torch_mlir_is_as_it_was_after_the_import():
    from torch_mlir import compiler_utils, fx
    from torch_mlir.extras import fx_importer

    from stagegraph.mlir.torch_import import import_program

    before = (fx_importer._make_vtensor_literal_op, fx.run_pipeline_with_repro_report,
              compiler_utils.run_pipeline_with_repro_report)  # fmt: skip
    import_program(_program(), "test:Model")
    after = (fx_importer._make_vtensor_literal_op, fx.run_pipeline_with_repro_report,
             compiler_utils.run_pipeline_with_repro_report)  # fmt: skip
    assert after == before


def test_the_imported_model_stays_as_it_was_without_a_pristine_copy(tmp_path):
    """The workload never runs ``problem.model`` (export traces it; the eager reference
    runs a copy), so copies for the peers come from it and none is kept beside it."""
    import torch

    from stagegraph.workload.torch_model import from_torch

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.BatchNorm2d(4)  # training mode: updates its statistics
            self.register_buffer("calls", torch.zeros(1))

        def forward(self, x):
            self.calls.add_(1)
            return self.norm(x)

    workload = from_torch(Counting().train(), (torch.rand(2, 4, 3, 3),))
    model = workload.problem.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    workload.prepare()  # export, import and the eager reference run
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    copy = workload.torch_model()
    assert copy is not model
    copy(torch.rand(2, 4, 3, 3))
    assert model.calls.item() == 0 and copy.calls.item() == 1
    assert not any("pristine" in name for name in vars(workload))


PROBLEM_WITH_A_SCAN = """
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


batch = 4


def get_inputs():
    return [torch.rand(batch, 16)]


def get_init_inputs():
    return []
"""


def test_a_model_whose_import_has_scans_loads_and_verifies(tmp_path):
    """torch-mlir imports ``cumsum`` as ``tm_tensor.scan``, an op stagegraph's context does
    not register: the payload is written as text (not bytecode), whose generic form the
    parser rewrites into loops; written as bytecode it did not load."""
    import stagegraph as sg

    problem = tmp_path / "scan.py"
    problem.write_text(PROBLEM_WITH_A_SCAN)
    report = sg.run("x86", str(problem), threads=1)
    assert report.verified is True, report
