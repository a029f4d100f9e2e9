"""PyTorch problem-file specs: override parsing and application (no torch needed: the file
is parsed and its constants evaluated, never its model built)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from stagegraph.errors import UnknownWorkloadError, WorkloadParamError
from stagegraph.workload.torch_source import (
    apply_overrides,
    constant_names,
    is_factory_spec,
    parse_value,
)

SOURCE = """
batch_size = 8
in_channels = 3
out_channels = 16
height = width = 32
depth, frames = (4, 6)
kernel_size = (3, 3)
layer_sizes = [400, 800]
scale: float = 2.0
bias_shape = (out_channels, 1, 1)
total = batch_size * height * width
"""


def constants(overrides: dict) -> dict:
    """The module-level values after ``overrides`` (the source run as the workload runs it)."""
    tree = apply_overrides(ast.parse(SOURCE), overrides, "problem.py")
    namespace: dict = {}
    exec(compile(tree, "problem.py", "exec"), namespace)
    return {k: v for k, v in namespace.items() if not k.startswith("__")}


def test_values_parse_as_int_float_and_tuples():
    assert parse_value("16") == 16 and isinstance(parse_value("16"), int)
    assert parse_value("0.5") == 0.5 and parse_value("1e-5") == 1e-5
    assert parse_value("16x1x1") == (16, 1, 1)
    for bad in ("abc", "1.5x2", "16x", "x"):
        with pytest.raises(ValueError):
            parse_value(bad)


def test_derived_assignments_follow_overrides():
    values = constants({"out_channels": 32, "batch_size": 2})
    assert values["bias_shape"] == (32, 1, 1)
    assert values["total"] == 2 * 32 * 32
    assert values["in_channels"] == 3  # untouched


def test_either_name_of_a_chained_assignment_sets_both():
    assert constants({"height": 12})["width"] == 12
    assert constants({"width": 7})["height"] == 7
    both = constants({"height": 5, "width": 9})
    assert (both["height"], both["width"]) == (5, 9)


def test_a_name_of_an_unpacking_assignment_is_overridden_alone():
    values = constants({"frames": 2})
    assert (values["depth"], values["frames"]) == (4, 2)


def test_overrides_take_the_shape_of_the_literal_they_replace():
    values = constants({"layer_sizes": (64, 128), "kernel_size": 5, "scale": 3})
    assert values["layer_sizes"] == [64, 128]  # a list stays a list
    assert values["kernel_size"] == (5,)  # a scalar given to a tuple
    assert values["scale"] == 3.0 and isinstance(values["scale"], float)
    assert constants({"bias_shape": (4, 1, 1)})["bias_shape"] == (4, 1, 1)


def test_unknown_constant_lists_the_names_that_exist():
    assert constant_names(ast.parse(SOURCE))[:4] == [
        "batch_size", "in_channels", "out_channels", "height",
    ]  # fmt: skip
    with pytest.raises(WorkloadParamError) as error:
        constants({"batch": 4})
    message = str(error.value)
    assert "problem.py" in message and "'batch'" in message
    assert "batch_size, in_channels, out_channels, height, width" in message


LITERALS = """
batch_size = 2
def get_inputs():
    return [(batch_size, 3, 224, 224), 0.5]
"""


def test_a_literal_inside_a_function_is_overridden_by_its_place():
    """KernelBench's manifests name scaled literals ``lit:FUNCTION@LINE:COLUMN``."""
    tree = apply_overrides(
        ast.parse(LITERALS),
        {"lit:get_inputs@4:28": 14, "lit:get_inputs@4:33": 16, "lit:get_inputs@4:39": 1,
         "batch_size": 10},
        "problem.py",
    )  # fmt: skip
    namespace: dict = {}
    exec(compile(tree, "problem.py", "exec"), namespace)
    assert namespace["get_inputs"]() == [(10, 3, 14, 16), 1.0]  # a float literal stays float
    for key, why in (
        ("lit:get_inputs@4:20", "no number literal at line 4, column 20"),  # a name there
        ("lit:forward@4:28", "of a function 'forward'"),
        ("lit:get_inputs", "lit:FUNCTION@LINE:COLUMN"),
    ):
        with pytest.raises(WorkloadParamError) as error:
            apply_overrides(ast.parse(LITERALS), {key: 1}, "problem.py")
        assert "problem.py" in str(error.value) and why in str(error.value)


def test_problem_spec_is_checked_before_torch_runs(tmp_path):
    from stagegraph.workload import parse_workload

    path = tmp_path / "problem.py"
    path.write_text(SOURCE + "\nimport nothing_of_this_name_exists\n")  # never executed here
    workload = parse_workload(f"{path}:height=4,bias_shape=4x1x1,seed=3")
    assert workload.params.seed == 3
    assert workload.spec == f"{path}:height=4,bias_shape=4x1x1,seed=3"
    with pytest.raises(WorkloadParamError, match="'heigth'.*height, width"):
        parse_workload(f"{path}:heigth=4")
    with pytest.raises(WorkloadParamError, match="height='four'"):
        parse_workload(f"{path}:height=four")
    with pytest.raises(WorkloadParamError, match="'height' given twice"):
        parse_workload(f"{path}:height=4,height=5")
    with pytest.raises(UnknownWorkloadError, match="no such file"):
        parse_workload(f"{tmp_path}/missing.py")


def test_factory_specs_are_told_from_named_workloads():
    assert is_factory_spec("mypkg.models:make")
    assert not is_factory_spec("matmul:m=8")
    assert not is_factory_spec("mypkg.models:make,seed=1")
    from stagegraph.workload import parse_workload

    with pytest.raises(UnknownWorkloadError, match="no module 'no_such_pkg.models' to call"):
        parse_workload("no_such_pkg.models:make")  # refused before anything imports torch


def test_without_pytorch_the_extra_is_named(capsys, tmp_path, monkeypatch):
    from stagegraph.cli.main import main

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    path = tmp_path / "problem.py"
    path.write_text(SOURCE)
    assert main(["run", "x86", str(path)]) == 2
    err = capsys.readouterr().err
    assert "needs PyTorch" in err and "pip install 'stagegraph[torch]'" in err
    assert main(["bench", "x86", "matmul:m=8,n=8,k=8", "--vs", "torch"]) == 2


def test_the_core_never_imports_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import stagegraph as sg, stagegraph.api, stagegraph.cli.main\n"
        "from stagegraph.workload import parse_workload\n"
        "assert sg.compile and sg.from_torch and sg.torch_backend\n"
        "parse_workload('matmul:m=8,n=8,k=8').inputs()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
