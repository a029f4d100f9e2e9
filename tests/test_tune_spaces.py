"""Search spaces declared by params models: any params model and payload tunable, tuned
values found again by op signature, the learned ranking, measurement as graph stages."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import pytest

from stagegraph.app.session import SessionRequest
from stagegraph.cli.main import main
from stagegraph.stages.common.tuning_db import CandidateResult, TuneDB, TunedSite
from tests.conftest import kernelbench_or_skip

CLI = [sys.executable, "-m", "stagegraph.cli.main"]
SMALL = "matmul:m=64,n=64,k=64"

# A user's own params model, cost model, emit stage, measurement stage and graph, declared
# outside the package: the tuner must handle them without knowing any of their names.
USER_PLUGIN = '''
import time
from typing import NamedTuple

from pydantic import Field

import stagegraph as sg
from stagegraph.stages.common.costmodel import CostModelConfig
from stagegraph.stages.common.emit import JitConfig, jit
from stagegraph.stages.common.measure import Timing, Verdict
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify


class OptParams(sg.Params):
    opt_level: int = Field(2, ge=0, le=3)
    unused: int = 7


sg.declare_space(
    OptParams, "*", {"opt_level": sg.Choice((0, 1, 2, 3))},
    lambda p, op, target, logic: {"optimize_at_all": p.opt_level >= 1},
)


@sg.stage("params", name="user.select")
def select(config: CostModelConfig) -> OptParams:
    return OptParams()


@sg.stage("emit", name="user.jit")
def user_jit(module: sg.Module["llvm"], params: OptParams) -> sg.Binary:
    return jit.fn(module, JitConfig(opt_level=params.opt_level))


class Measured(NamedTuple):
    timing: Timing


@sg.stage("measure", name="user.wallclock", cacheable=False)
def wallclock(binary: sg.Binary, verdict: Verdict, workload: sg.WorkloadRef) -> Measured:
    """Five calls timed with perf_counter, no baseline (the tuner times it the same way)."""
    work = workload.workload
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        binary.call(work.entry, work.inputs())
        samples.append(time.perf_counter() - start)
    return Measured(Timing(samples=tuple(samples)))


@sg.register_graph("user_opt")
def build():
    return sg.Graph(
        "user_opt",
        [verify("load"), select("select"), bufferize(tags={"bufferized"}),
         linalg_to_loops("loops"), lower_to_llvm("lower"), user_jit("emit")],
        ["payload -> load.module", "load.module -> bufferize.module",
         "bufferize.module -> loops.module", "loops.module -> lower.module",
         "lower.module -> emit.module", "select.params -> emit.params"],
        [sg.GraphInput("payload", sg.Module["tensor"], frozenset({"input"}))],
        default_splice="bufferized",
    )
'''


@pytest.fixture
def user_plugin(tmp_path: Path) -> Path:
    path = tmp_path / "user_tuning.py"
    path.write_text(USER_PLUGIN)
    return path


def _problem(workload: str, graph: str = "x86", per_op: bool = False):
    from stagegraph.tune.runner import Problem, TuneOptions

    session = SessionRequest(graph=graph, workload=workload, threads=1)
    return Problem(TuneOptions(session=session, per_op=per_op))


# -- a user's params model ----------------------------------------------------------------


def test_user_params_model_is_tunable_without_editing_stagegraph(user_plugin, tmp_path, capsys):
    args = ["--plugin", str(user_plugin), "tune", "user_opt", "matmul:m=16,n=16,k=16"]
    assert main([*args, "--explain", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fields"] == {"params.opt_level": {"choices": [0, 1, 2, 3]}}
    assert info["constraints"] == ["params.optimize_at_all"] and info["size"] == 3
    assert info["fixed"]["params.unused"] == 7
    db = tmp_path / "u.db"
    code = main([*args, "--budget", "3", "--db", str(db), "--json", "--measure", "user.wallclock"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["measured"] == 3 and report["failed"] == 0, report["failures"]
    assert report["exhausted"] is False
    assert "--measure user.wallclock" in report["commands"]["resume"]
    resume = report["commands"]["resume"]
    assert resume.startswith("stagegraph --plugin") and f"--plugin {user_plugin} " in resume
    rows = TuneDB(db).conn.execute("SELECT params, samples, baseline_samples FROM candidates")
    seen = set()
    for params, samples, baseline in rows.fetchall():
        seen.add(json.loads(params)["opt_level"])
        assert len(json.loads(samples)) == 5 and len(json.loads(baseline)) == 5  # its timer
    assert seen == {1, 2, 3}  # the constraint kept opt_level 0 out


# -- any payload --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "kinds", "fields"),
    [
        # its direct-or-GEMM path is a site on any host (the cost model sends it to the
        # GEMM on an AVX-512 one, then it has no convolution op left)
        ("l1_050_conv_standard_2D_square_input_square_kernel", {"conv_path"}, {"conv0.gemm"}),
        ("l1_023_Softmax", {"reduction", "elementwise"},
         {"generic.reduction_rows", "generic.reduction_chunk", "generic.inner_tile"}),
        ("l1_042_Max_Pooling_2D", {"pooling"}, {"generic.conv_width_tile"}),
    ],
)  # fmt: skip
def test_non_matmul_payloads_have_spaces_from_their_op_kinds(payload, kinds, fields):
    problem = _problem(str(kernelbench_or_skip() / f"{payload}.mlir"))
    space = problem.space
    assert kinds <= {site.op_kind(op) for site in space.sites for op in site.ops}
    assert fields <= set(space.variables)
    assert space.violated(space.values_of(problem.base)) == []  # the baseline is inside
    for values in islice(space.stream(1), 5):
        assert space.to_params(values).generic.lanes == problem.base.generic.lanes


def test_per_op_sites_are_one_per_distinct_op():
    problem = _problem(str(kernelbench_or_skip() / "l1_023_Softmax.mlir"), per_op=True)
    op_sites = [site for site in problem.space.sites if site.label != "payload"]  # (threads)
    labels = [site.label for site in op_sites]
    signatures = [site.path[1] for site in op_sites]
    assert len(set(signatures)) == len(signatures) >= 2 and "generic" not in labels
    values = next(problem.space.stream(2))
    params = problem.space.to_params(values)
    assert set(params.op_params) == set(signatures)  # every op gets its own entry


@pytest.mark.parametrize(
    "workload",
    ["matmul:m=37,n=45,k=19", "mlp:batch=8,widths=40-24-16", "l1_034_InstanceNorm",
     "l1_065_conv_transposed_2D_square_input_asymmetric_kernel"],
)  # fmt: skip
def test_heuristic_baseline_breaks_no_declared_constraint(workload):
    if workload.startswith("l1_"):
        workload = str(kernelbench_or_skip() / f"{workload}.mlir")
    for per_op in (False, True):
        problem = _problem(workload, per_op=per_op)
        assert problem.space.violated(problem.space.values_of(problem.base)) == []


@pytest.mark.parametrize(
    "payload", ["l1_023_Softmax", "l1_050_conv_standard_2D_square_input_square_kernel"]
)
def test_tuning_a_softmax_and_a_convolution_measures_candidates(payload, tmp_path, capsys):
    path = str(kernelbench_or_skip() / f"{payload}.mlir")
    db = tmp_path / "s.db"
    code = main(["tune", "x86", path, "--budget", "2", "--threads", "1", "--samples", "4",
                 "--db", str(db), "--json", "--strategy", "model"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["measured"] == 2, report["failures"]
    assert report["commands"]["use"].endswith(f"--cost-model tuned --db {db}")


# -- results reused by op signature -------------------------------------------------------


def _store(db: Path, problem, signature: str, values: dict, model: str) -> None:
    store = TuneDB(db)
    store.record_site(TunedSite(target=problem.key.target, graph="x86", model=model,
                                signature=signature, site_values=values, speedup=1.3,
                                speedup_low=1.2, speedup_high=1.4, workload="elsewhere",
                                params_hash="abc"))  # fmt: skip
    store.close()


def test_tuned_cost_model_finds_ops_by_signature_and_names_the_rest(tmp_path):
    from stagegraph.api import run

    problem = _problem(SMALL)
    matmul_site = problem.space.sites[0]
    db = tmp_path / "t.db"
    model = "stagegraph.stages.x86.matmul.params:MatmulParams"
    _store(db, problem, matmul_site.ops[0].signature(), {"tile_m": 16, "reg_m": 4}, model)
    with pytest.warns(UserWarning, match="the heuristic's for: elementwise linalg.fill"):
        report = run("x86", SMALL, cost_model="tuned", db=str(db), threads=1)
    assert report.verified and report.params["matmul"][0]["tile_m"] == 16
    assert report.params["matmul"][0]["reg_m"] == 4
    assert report.params["matmul"][0]["tile_n"] == problem.base.matmul[0].tile_n  # untouched
    assert any("tuned values for 1 ops" in w for w in report.warnings)
    # Another payload with the same layer gets it; a new shape falls back, said so.
    other = run("x86", "matmul:m=64,n=64,k=64,dtype=f32", cost_model="tuned", db=str(db))
    assert other.params["matmul"][0]["tile_m"] == 16
    with pytest.warns(UserWarning, match="tuned values for 0 ops"):
        new = run("x86", "matmul:m=48,n=64,k=64", cost_model="tuned", db=str(db), threads=1)
    assert new.params["matmul"][0]["tile_m"] != 16


def test_a_winner_is_stored_per_op_signature(tmp_path):
    from stagegraph.tune.runner import _record_tuned_sites

    problem = _problem(SMALL)
    values = next(problem.space.stream(0))
    winner = problem.space.to_params(values)
    history = {
        "w": CandidateResult(params_hash="w", params=winner.model_dump(mode="json"),
                             status="ok", samples=[1.0, 1.01, 0.99, 1.0] * 3,
                             baseline_samples=[2.0, 2.02, 1.98, 2.0] * 3, median_s=1.0)
    }  # fmt: skip
    db = TuneDB(tmp_path / "w.db")
    stored = _record_tuned_sites(db, problem, history)
    site = problem.space.sites[0]
    assert site.ops[0].signature() in stored
    row = db.tuned_site(problem.key.target, "x86",
                        "stagegraph.stages.x86.matmul.params:MatmulParams",
                        site.ops[0].signature())  # fmt: skip
    assert row is not None and row.speedup_low > 1.0
    assert row.site_values["tile_m"] == winner.matmul[0].tile_m
    assert "threads" not in row.site_values  # only what the tuner varied


# -- the learned ranking ------------------------------------------------------------------


def test_learned_ranking_puts_the_measured_trend_first():
    from stagegraph.tune.search import LearnedRanking

    problem = _problem(SMALL)
    space = problem.space
    solutions = list(islice(space.stream(5), 40))
    name = "matmul0.tile_k"
    truth = {i: -abs(v[name] - 32) / 32 for i, v in enumerate(solutions)}  # best near 32
    ranking = LearnedRanking(space)
    assert ranking.fit([(solutions[i], truth[i]) for i in range(30)])
    held_out = range(30, 40)
    predicted = sorted(held_out, key=lambda i: -ranking.predict(solutions[i]))
    actual = sorted(held_out, key=lambda i: -truth[i])
    assert predicted[0] in actual[:3]


# -- Ctrl-C ---------------------------------------------------------------------------------


def test_ctrl_c_reports_the_best_so_far_and_how_to_resume(tmp_path):
    db = tmp_path / "c.db"
    # A budget the run cannot finish before the signal, even on a loaded machine.
    args = [*CLI, "tune", "x86", SMALL, "--budget", "120", "--batch-size", "1", "--samples", "4",
            "--db", str(db)]  # fmt: skip
    # A shell's background job ignores SIGINT, and children inherit that: restore it.
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if db.exists():
            rows = TuneDB(db).conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
            if rows >= 1:
                break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in out and "best candidate is" in out
    assert f"resume:  stagegraph tune x86 {SMALL}" in out and "--budget 120" in out


def test_declarations_apply_per_target_and_name_unknown_fields():
    from stagegraph.core.ports import Params
    from stagegraph.core.search_space import build_space
    from stagegraph.core.tunable import Choice, declare_space
    from stagegraph.errors import EmptySearchSpaceError
    from stagegraph.stages.target import resolve_target

    class WideParams(Params):
        width: int = 8

    declare_space(WideParams, "*", {"width": Choice((8, 16))},
                  applies_to=lambda target: target.has("avx512f"))  # fmt: skip
    base = WideParams()
    on_v4 = build_space(base, None, resolve_target("x86-64-v4"))
    assert list(on_v4.variables) == ["params.width"]
    with pytest.raises(EmptySearchSpaceError, match="declares search spaces for \\*"):
        build_space(base, None, resolve_target("x86-64-v3"))
    with pytest.raises(ValueError, match="unknown fields hieght"):
        declare_space(WideParams, "*", {"hieght": Choice((1,))})
