"""Cost-model swap, search spaces, the tuning DB and the isolated, resumable tuner."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import pytest

from stagegraph.app.graph_options import with_cost_model
from stagegraph.app.session import SessionRequest
from stagegraph.cli.main import main
from stagegraph.core.catalog import load_graph
from stagegraph.core.engine import Engine
from stagegraph.errors import ConfigError, EmptySearchSpaceError, UnknownCostModelError
from stagegraph.workload import parse_workload

SMALL = "matmul:m=64,n=64,k=64"
CLI = [sys.executable, "-m", "stagegraph.cli.main"]


@pytest.fixture(scope="module")
def problem():
    from stagegraph.tune.runner import Problem, TuneOptions

    return Problem(TuneOptions(session=SessionRequest(graph="x86", workload=SMALL)))


def _rows(db: Path) -> dict[str, tuple]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT params_hash, status, reason, samples FROM candidates")
        return {r[0]: r[1:] for r in rows.fetchall()}


def _cli_json(args: list[str], capsys) -> tuple[int, dict]:
    code = main(args)
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {}


# -- cost models -------------------------------------------------------------------------


def test_cost_models_swap_with_same_output_type(tmp_path):
    graph = load_graph("x86")
    work = parse_workload(SMALL)
    base = Engine().run(graph, work, until="select").params
    params_file = tmp_path / "p.json"
    params_file.write_text(json.dumps({"tile_m": 16, "reg_m": 4}))
    fixed = with_cost_model(graph, "fixed", params_file=str(params_file))
    got = Engine().run(fixed, work, until="select").params
    assert got.matmul[0].tile_m == 16 and got.matmul[0].reg_m == 4
    analytical = with_cost_model(graph, "analytical")
    assert analytical.stages["select"].factory.name == "x86.analytical"
    chosen = Engine().run(analytical, work, until="select").params
    assert len(chosen.matmul) == len(base.matmul)
    with pytest.raises(ConfigError, match="tuning database does not exist"):
        with_cost_model(graph, "tuned", workload=work.spec, db=str(tmp_path / "none.db"))
    from stagegraph.stages.common.tuning_db import TuneDB

    TuneDB(tmp_path / "empty.db").close()
    tuned = with_cost_model(graph, "tuned", workload=work.spec, db=str(tmp_path / "empty.db"))
    assert Engine().run(tuned, work, until="select").params == base  # nothing tuned: heuristic


def test_unknown_cost_model_did_you_mean(capsys):
    with pytest.raises(UnknownCostModelError, match="did you mean 'analytical'"):
        with_cost_model(load_graph("x86"), "analytic")
    assert main(["run", "x86", SMALL, "--cost-model", "tunde"]) == 2
    assert "did you mean 'tuned'" in capsys.readouterr().err


# -- search spaces -----------------------------------------------------------------------


def test_space_streams_distinct_valid_solutions(problem):
    space = problem.space
    assert space.contains(space.values_of(problem.base))
    solutions = list(islice(space.stream(seed=3), 25))
    keys = {tuple(sorted(s.items())) for s in solutions}
    assert len(keys) == 25
    for values in solutions:
        space.to_params(values)  # the model's validator accepts every solution
    assert list(islice(space.stream(seed=3), 5)) == solutions[:5]  # seeded: reproducible
    assert list(islice(space.stream(seed=4), 5)) != solutions[:5]


def test_empty_space_names_conflicts(problem):
    from stagegraph.core.search_space import build_space

    # 20 lanes lies inside reg_n's domain on every tier (8..128 on AVX2, 16..256 on
    # AVX-512) but is a multiple of no vector width from AVX2 (8 f32 lanes) up: any host.
    space = build_space(problem.base, problem.facts, problem.target, {"reg_n": 20})
    with pytest.raises(EmptySearchSpaceError) as info:
        space.require_nonempty()
    assert "fixed matmul0.reg_n=20" in info.value.conflicts
    # Either rule on reg_n's vectors excludes 12 (the solver names a minimal core).
    assert {
        "matmul0.reg_n_multiple_of_vector_width",
        "matmul0.reg_n_power_of_two_vectors",
    } & set(info.value.conflicts)


def test_explain_prints_space_without_measuring(tmp_path, capsys):
    db = tmp_path / "x.db"
    code, info = _cli_json(["tune", "x86", SMALL, "--explain", "--json", "--db", str(db)], capsys)
    assert code == 0 and not db.exists()
    assert "matmul0.tile_m" in info["fields"] and "matmul0.register_budget" in info["constraints"]
    assert info["size"] > 0


# -- the worker: engine reuse ------------------------------------------------------------


def test_worker_recompiles_only_downstream_of_params(problem, tmp_path):
    from stagegraph.tune.worker import BatchTask, run_batch

    candidates = [
        problem.space.to_params(v).model_dump(mode="json")
        for v in islice(problem.space.stream(1), 2)
    ]
    task = BatchTask(session=SessionRequest(graph="x86", workload=SMALL),
                     params_model=problem.params_model, key=problem.key,
                     baseline=problem.base.model_dump(mode="json"), candidates=candidates,
                     samples=4)  # fmt: skip
    assert run_batch(task, str(tmp_path)) == 2
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    for line in lines:
        executed = json.loads(line)["executed"]
        assert executed, line
        assert not {"load", "analyze", "target"} & set(executed)
        assert {"select", "schedule", "emit"} <= set(executed)


# -- the tuner ---------------------------------------------------------------------------


def test_tune_reuse_and_tuned_cost_model(tmp_path, capsys):
    db = tmp_path / "tune.db"
    args = ["tune", "x86", SMALL, "--budget", "4", "--jobs", "2", "--db", str(db), "--json",
            "--samples", "8"]  # fmt: skip
    code, first = _cli_json(args, capsys)
    assert code == 0
    for key in ("baseline", "best", "measured", "failed", "reused"):
        assert key in first
    assert first["measured"] + first["failed"] == 4 and first["reused"] == 0
    assert first["best"] is not None and "speedup_low" in first["best"]
    assert len(_rows(db)) == 4
    code, again = _cli_json(args, capsys)
    assert code == 0 and again["reused"] == 4 and again["measured"] == again["failed"] == 0
    code, bench = _cli_json(["bench", "x86", SMALL, "--cost-model", "tuned", "--db", str(db),
                             "--json", "--budget", "0.5"], capsys)  # fmt: skip
    assert code == 0
    info = bench["cost_model"]
    if first["winner"]:
        assert info["source"] == "db" and info["params"] == first["best"]["params"]
    else:
        assert info["source"] == "heuristic (fallback)"
        assert info["params"] == first["baseline"]["params"]


def test_tuned_lookup_uses_a_winning_db_entry(problem, tmp_path):
    from stagegraph.stages.common.tuning_db import CandidateResult, TuneDB
    from stagegraph.stages.x86.costmodels import TunedConfig, lookup_tuned

    params = problem.space.to_params(next(problem.space.stream(0)))
    db = TuneDB(tmp_path / "w.db")
    db.record(problem.key, CandidateResult(
        params_hash=params.content_hash()[:16], params=params.model_dump(mode="json"),
        status="ok", samples=[1.0, 1.1, 0.9, 1.0], baseline_samples=[2.0, 2.1, 1.9, 2.0],
        median_s=1.0))  # fmt: skip
    db.close()
    config = TunedConfig(db=str(tmp_path / "w.db"), workload=problem.key.workload, graph="x86")
    found, why = lookup_tuned(config, problem.target)
    assert found == params, why


def test_faults_are_survived_and_recorded(problem, tmp_path):
    from stagegraph.tune.runner import TuneOptions, tune
    from stagegraph.tune.search import make_strategy

    first = make_strategy("random", problem.space, 0, 4).propose(4, set(), {})
    hashes = [p.content_hash()[:16] for p in first]
    faults = {hashes[0]: "segfault", hashes[1]: "hang", hashes[2]: "oom"}
    options = TuneOptions(
        session=SessionRequest(graph="x86", workload=SMALL),
        budget=4,
        jobs=1,
        db=str(tmp_path / "f.db"),
        run_timeout_s=6,
        memory_bytes=3 * 2**30,
        samples=4,
        faults=faults,
        strategy="random",
    )
    report = tune(options)
    reasons = {f.params_hash: f.reason for f in report.failures}
    assert reasons[hashes[0]] == "signal"
    assert reasons[hashes[1]] == "run timeout"
    assert reasons[hashes[2]] == "memory"
    assert report.failed == 3 and report.measured == 1
    assert set(_rows(tmp_path / "f.db")) == set(hashes)


def _rows_so_far(db: Path) -> dict:
    """The database's rows, or none while the child is still creating its tables."""
    try:
        return _rows(db)
    except sqlite3.OperationalError:
        return {}


def test_killed_run_resumes_without_loss(tmp_path):
    db = tmp_path / "k.db"
    args = [*CLI, "tune", "x86", SMALL, "--budget", "5", "--jobs", "1", "--batch-size", "1",
            "--db", str(db), "--json", "--samples", "4"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    while time.time() < deadline:
        if db.exists() and len(_rows_so_far(db)) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _rows(db)
    assert 2 <= len(before) < 5
    done = subprocess.run(args, capture_output=True, text=True, timeout=180)
    report = json.loads(done.stdout)
    after = _rows(db)
    assert {h: after.get(h) for h in before} == before  # nothing lost or re-measured
    assert report["reused"] >= len(before) and len(after) == 5
    assert report["measured"] + report["failed"] + report["reused"] == 5


def test_tune_on_local_dask_cluster(tmp_path, capsys):
    db = tmp_path / "d.db"
    code, report = _cli_json(["tune", "x86", SMALL, "--budget", "2", "--cluster", "local:2",
                              "--db", str(db), "--json", "--samples", "4"], capsys)  # fmt: skip
    assert code == 0, report
    assert report["measured"] + report["failed"] == 2 and len(_rows(db)) == 2


# -- bad input ---------------------------------------------------------------------------


def test_empty_space_cli_exit_2(tmp_path, capsys):
    code = main(["tune", "x86", SMALL, "--fix", "reg_n=20", "--db", str(tmp_path / "e.db")])
    err = capsys.readouterr().err
    assert code == 2 and "reg_n_" in err and "vectors" in err and "fixed matmul0.reg_n=20" in err


def test_unreachable_cluster_exit_2_db_intact(tmp_path, capsys):
    db = tmp_path / "u.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE keep (x)")
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    code = main(["tune", "x86", SMALL, "--cluster", "tcp://127.0.0.1:9", "--db", str(db)])
    assert code == 2 and "cannot reach the Dask scheduler" in capsys.readouterr().err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert main(["tune", "x86", SMALL, "--cluster", "bogus", "--db", str(db)]) == 2
    assert os.path.getsize(db) > 0


@pytest.mark.parametrize("workload", ["matmul:m=128,n=128,k=128", "matmul:m=37,n=45,k=19",
                                      "mlp:batch=8,widths=40-24-16"])  # fmt: skip
def test_the_heuristic_baseline_lies_in_its_own_space(workload):
    """The cost model's choice must satisfy the constraints the tuner searches under."""
    from stagegraph.tune.runner import Problem, TuneOptions

    problem = Problem(TuneOptions(session=SessionRequest(graph="x86", workload=workload)))
    assert problem.space.contains(problem.space.values_of(problem.base))


def test_run_limit_follows_the_baseline_not_a_fixed_timeout():
    """A candidate is cut at ~10x the baseline's time for the same calls (plus a floor),
    never later than --run-timeout."""
    from stagegraph.tune.worker import RUN_LIMIT_FLOOR_S, run_limit

    fast = run_limit(1e-4, samples=20, cap_s=60.0)
    assert RUN_LIMIT_FLOOR_S < fast < RUN_LIMIT_FLOOR_S + 0.1
    assert run_limit(1e-2, samples=20, cap_s=60.0) == pytest.approx(2.0 + 10 * 1e-2 * 46)
    assert run_limit(1.0, samples=20, cap_s=60.0) == 60.0
