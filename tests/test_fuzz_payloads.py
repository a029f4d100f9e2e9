"""Fuzzing end to end: hypothesis draws small linalg payloads (elementwise chains,
reductions, pools, convolutions with random static shapes), workload specs and graph files,
and the CLI runs them. Nothing may crash, hang (time limits are set) or print a traceback:
each run verifies against numpy, or ends with exit 2 and a one-paragraph error; a wrong
result is reported as one (exit 1, WRONG RESULT).

The default suite runs a fixed, derandomized handful of each (a fast seed); ``-m slow``
runs hundreds.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stagegraph.cli.main import main
from tests.fuzz_payloads import LARGE_PAYLOADS, PAYLOADS, Case

LIMITS = ["--compile-timeout", "120", "--run-timeout", "60"]
FAST = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
LONG = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def cli(*argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of one in-process CLI call."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # a wrong result exits 1 from the report printer
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    if code == 2:
        assert err.startswith("error: "), err


def run_case(case: Case, graph: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = case.write(Path(folder), "fuzz")
        code, out, err = cli("run", graph, str(path), "--json", *LIMITS)
    assert_clean(code, err)
    assert code == 0, f"{graph}: exit {code}\n{err}\n{out[-2000:]}\n{case.text}"
    report = json.loads(out)
    assert report["verified"] is True and report["reference"] == "npz", report["message"]


def check_wrong_result_reported(case: Case) -> None:
    wrong = Case(case.text, case.inputs, [o.copy() for o in case.outputs])
    flat = wrong.outputs[0].reshape(-1)
    flat[len(flat) // 2] += 1.0 + abs(flat).max()  # far beyond any rounding
    with tempfile.TemporaryDirectory() as folder:
        path = wrong.write(Path(folder), "wrong")
        code, out, err = cli("run", "x86", str(path), *LIMITS)
    assert_clean(code, err)
    assert code == 1 and "WRONG RESULT" in out, (code, out, err)


@FAST
@given(PAYLOADS, st.sampled_from(["x86", "naive"]))
def test_random_payloads_verify(case, graph):
    run_case(case, graph)


@FAST
@given(PAYLOADS)
def test_wrong_results_are_reported_as_wrong(case):
    check_wrong_result_reported(case)


SPEC = st.one_of(
    st.builds(
        lambda m, n, k, extra: f"matmul:m={m},n={n},k={k}{extra}",
        st.one_of(st.integers(1, 9), st.just(0)), st.integers(1, 9),
        st.one_of(st.integers(1, 9), st.just("x")),
        st.sampled_from(["", "", "", ",dtype=f16", ",dtype=bf16", ",dtype=f64", ",dtype=i8",
                         ",q=1"]),
    ),
    st.builds(lambda b, w: f"mlp:batch={b},widths={w}", st.integers(0, 5),
              st.sampled_from(["4-8-4", "4-8-4", "4", "", "3-x", "2-2-2-2"])),
    st.text(alphabet="matmulp:=,-0123456789", max_size=16),
)  # fmt: skip


@FAST
@given(SPEC, st.sampled_from(["x86", "naive"]))
def test_workload_specs_run_or_fail_cleanly(spec, graph):
    code, out, err = cli("run", graph, spec, "--json", *LIMITS)
    assert_clean(code, err)
    assert code in (0, 2), (spec, code, out, err)
    if code == 0:
        assert json.loads(out)["verified"] is True


STAGES = [
    ("verify", {}),
    ("pipeline", {"pipeline": "canonicalize,cse"}),
    ("pipeline", {"pipeline": "func.func(csee)"}),
    ("pipeline", {"pipeline": "builtin.module(one-shot-bufferize{bufferize-function-boundaries "
                              "function-boundary-type-conversion=identity-layout-map})"}),
    ("bufferize", {}),
    ("linalg_to_loops", {}),
    ("lower_to_llvm", {}),
    ("jit", {}),
    ("transform", {"file": "missing.mlir"}),
]  # fmt: skip
GRAPHS = st.lists(st.sampled_from(range(len(STAGES))), min_size=1, max_size=6)


@FAST
@given(GRAPHS)
def test_graph_files_validate_and_run_or_fail_cleanly(indices):
    stages = [
        {"name": f"s{i}", "factory": STAGES[k][0], "config": STAGES[k][1]}
        for i, k in enumerate(indices)
    ]
    edges = ["payload -> s0.module"] + [f"s{i}.module -> s{i + 1}.module"
                                        for i in range(len(stages) - 1)]  # fmt: skip
    graph = {"name": "fuzzed", "stages": stages, "edges": edges}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "g.yaml"
        path.write_text(yaml.safe_dump(graph))
        valid, _, err = cli("validate", str(path))
        assert_clean(valid, err)
        code, out, err = cli("run", str(path), "matmul:m=4,n=5,k=3", *LIMITS)
    assert_clean(code, err)
    assert valid in (0, 2) and code in (0, 2), (valid, code, out, err)
    if valid == 2:
        assert code == 2  # what validate refuses cannot run either
    if code == 0 and "RAN" not in out and "NOT RUN" not in out:
        assert "VERIFIED" in out


@pytest.mark.slow
@LONG
@given(st.one_of(PAYLOADS, LARGE_PAYLOADS), st.sampled_from(["x86", "naive"]))
def test_random_payloads_verify_long(case, graph):
    run_case(case, graph)


@pytest.mark.slow
@LONG
@given(PAYLOADS)
def test_wrong_results_are_reported_as_wrong_long(case):
    check_wrong_result_reported(case)


def test_case_writer_round_trips(tmp_path):
    case = Case("x", [np.ones(2, np.float32)], [np.zeros(3, np.float32)])
    path = case.write(tmp_path, "s")
    with np.load(path.with_suffix(".npz")) as data:
        assert sorted(data.files) == ["in0", "out0"]
