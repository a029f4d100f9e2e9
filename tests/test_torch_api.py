"""PyTorch from Python: ``sg.from_torch``, ``sg.compile`` (values against eager, structure,
zero-copy inputs, ``check=True``) and the ``torch.compile`` backend (its eager fallback)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stagegraph as sg  # noqa: E402
from stagegraph.errors import (  # noqa: E402
    SignatureError,
    StagegraphWarning,
    VerificationError,
)


class TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x, y):
        hidden = torch.relu(self.linear(x))
        return hidden, hidden.sum(dim=1) + y


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.special.i0(x) + 1


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TwoOutputs()


@pytest.fixture(scope="module")
def compiled(model):
    return sg.compile(model, (torch.rand(4, 16), torch.rand(4)), threads=1)


def test_from_torch_is_a_workload_checked_against_eager(model):
    workload = sg.from_torch(model, (torch.rand(2, 16), torch.rand(2)))
    assert isinstance(workload, sg.Workload)
    assert workload.spec == "torch:TwoOutputs"
    assert [s.shape for s in workload.input_specs()] == [(2, 16), (2,)]
    with workload.session():
        result = sg.Engine().run(sg.load_graph("x86"), workload)
        outputs = result.binary.call(workload.entry, workload.inputs())
        assert workload.verify(outputs).ok


def test_compiled_model_returns_the_models_structure_and_values(model, compiled):
    x, y = torch.rand(4, 16), torch.rand(4)
    hidden, total = compiled(x, y)
    expected_hidden, expected_total = model(x, y)
    assert isinstance(hidden, torch.Tensor) and hidden.dtype == torch.float32
    torch.testing.assert_close(hidden, expected_hidden.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total, expected_total.detach(), rtol=1e-5, atol=1e-5)
    from_numpy = compiled(x.numpy(), y.numpy())  # numpy arrays in, tensors out
    torch.testing.assert_close(from_numpy[0], hidden)


def test_contiguous_inputs_cross_without_a_copy(compiled):
    x, y = torch.rand(4, 16), torch.rand(4)
    arrays = compiled._arrays((x, y))
    assert np.shares_memory(arrays[0], x.numpy()) and np.shares_memory(arrays[1], y.numpy())
    strided = torch.rand(16, 4).t()  # a transposed view: the one case that copies
    assert not np.shares_memory(compiled._arrays((strided, y))[0], strided.numpy())


def test_wrong_inputs_are_named(compiled):
    with pytest.raises(SignatureError, match=r"input #0 is float32\[3, 16\].*f32\[4, 16\]"):
        compiled(torch.rand(3, 16), torch.rand(4))
    with pytest.raises(SignatureError, match="compiled for 2 inputs, called with 1"):
        compiled(torch.rand(4, 16))


def test_check_compares_the_first_call_with_eager(model):
    x, y = torch.rand(4, 16), torch.rand(4)
    checked = sg.compile(model, (x, y), threads=1, check=True)
    checked(x, y)
    assert checked.check is False  # only the first call is compared
    disagreeing = sg.compile(model, (x, y), threads=1, check=True)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.linear.bias += 1.0
    disagreeing.workload.torch_model = lambda: other  # eager now computes something else
    with pytest.raises(VerificationError, match="check=True"):
        disagreeing(x, y)


def test_torch_compile_backend_matches_eager(model):
    x, y = torch.rand(4, 16), torch.rand(4)
    fast = torch.compile(model, backend=sg.torch_backend("x86", threads=1), dynamic=False)
    for got, expected in zip(fast(x, y), model(x, y), strict=True):
        torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)


def test_backend_runs_what_it_cannot_take_eagerly_with_one_warning():
    torch._dynamo.reset()
    x = torch.rand(4, 4)
    fast = torch.compile(Unsupported(), backend=sg.torch_backend(), dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = fast(x)
        fast(x)
    torch.testing.assert_close(first, torch.special.i0(x) + 1)
    ours = [str(w.message) for w in caught if "stagegraph backend" in str(w.message)]
    assert len(ours) == 1
    assert "running this graph eagerly" in ours[0] and "torch.aten.i0" in ours[0]


def test_backend_keeps_batchnorm_running_statistics_like_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    eager = copy.deepcopy(model)
    fast = torch.compile(model, backend=sg.torch_backend(threads=1), dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StagegraphWarning)
        for _ in range(2):  # compiled, not the eager fallback (that would warn: an error here)
            x = torch.rand(2, 3, 8, 8)
            torch.testing.assert_close(fast(x), eager(x).detach(), rtol=1e-5, atol=1e-5)
    bn, expected = model[1], eager[1]
    assert int(bn.num_batches_tracked) == 2
    torch.testing.assert_close(bn.running_mean, expected.running_mean)
    torch.testing.assert_close(bn.running_var, expected.running_var)


def test_bf16_models_take_and_return_bfloat16_tensors():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16).to(torch.bfloat16)
    x = torch.rand(8, 32, dtype=torch.bfloat16)
    compiled = sg.compile(model, (x,), threads=1, check=True)
    result = compiled(x)
    assert result.dtype == torch.bfloat16 and result.shape == (8, 16)
    torch.testing.assert_close(result.float(), model(x).detach().float(), rtol=2e-2, atol=2e-2)


class ConcatParameter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rows = torch.nn.Parameter(torch.rand(2, 3))

    def forward(self, x):
        return torch.relu(torch.cat((x, self.rows), dim=0) - 0.5)


def test_a_parameter_inside_an_ops_list_is_imported():
    model, x = ConcatParameter(), torch.rand(4, 3)
    result = sg.compile(model, (x,), threads=1, check=True)(x)
    torch.testing.assert_close(result, model(x).detach())
