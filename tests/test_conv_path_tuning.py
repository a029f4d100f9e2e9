"""The direct-vs-GEMM choice of each convolution in the tuner's space: one site per
convolution with the cost model's choice as default, candidates that compile the other
path, and ``--cost-model tuned`` replaying the winner's path."""

from __future__ import annotations

import json

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.app.session import SessionRequest
from stagegraph.cli.main import main
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.stages.x86.conv.choice import stamped_choices

# two images of 8 channels, 16 filters, 3x3 on 9x10: small, and the cost model keeps it
# direct on x86-64-v3 (tests/test_conv_choice.py runs both paths through the graph)
_KEY = "conv2d.n2.c8.f16.k3x3.o7x8.s1x1.d1x1"
_TARGET = "x86-64-v3"


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    """The convolution's payload file, with its inputs and a float64 reference beside it."""
    from tests.test_conv_choice import _payload

    folder = tmp_path_factory.mktemp("conv")
    n, c, f, image = 2, 8, 16, (9, 10)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, 3, 3), dtype=np.float32)
    out = np.zeros((n, f, image[0] - 2, image[1] - 2))
    for i in range(3):
        for j in range(3):
            window = x[:, :, i : i + image[0] - 2, j : j + image[1] - 2].astype(np.float64)
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, i, j].astype(np.float64))
    path = folder / "conv.mlir"
    path.write_text(_payload(n, c, f, image, (3, 3)))
    np.savez(folder / "conv.npz", in0=x, in1=w, out0=out.astype(np.float32))
    return path


@pytest.fixture(scope="module")
def problem(payload):
    from stagegraph.tune.runner import Problem, TuneOptions

    request = SessionRequest(graph="x86", workload=str(payload), target=_TARGET, threads=1)
    return Problem(TuneOptions(session=request))


def test_the_space_has_a_path_site_per_convolution_defaulting_to_the_cost_model(problem):
    space = problem.space
    [site] = [s for s in space.sites if s.label == "conv0"]
    assert site.path == ("conv_paths", _KEY) and site.op_kind(site.ops[0]) == "conv_path"
    assert space.variables["conv0.gemm"].domain.values == (0, 1)
    # the default is what the cost model decided (and stamped): the direct path here
    [op] = site.ops
    assert op.decided_by == "cost model" and op.gemm_cycles > op.direct_cycles
    assert problem.base.conv_paths[_KEY].gemm is False
    assert space.values_of(problem.base)["conv0.gemm"] == 0


def test_a_path_moves_alone(problem):
    """The exclusive rule: a candidate on the other path keeps every other site's values
    (its tile params would describe ops the other path does not make)."""
    space = problem.space
    base = space.values_of(problem.base)
    assert "conv0.alone" in space.constraints
    moved_tile = next(n for n in base if n.startswith("generic.conv_width"))
    other = next(v for v in space.variables[moved_tile].domain.values if v != base[moved_tile])
    assert space.contains({"conv0.gemm": 1})
    assert not space.contains({"conv0.gemm": 1, moved_tile: other})
    assert space.contains({"conv0.gemm": 0, moved_tile: other})
    assert space.violated({**base, "conv0.gemm": 1, moved_tile: other}) == ["conv0.alone"]


def test_explain_lists_the_site_and_its_rule(payload, capsys):
    args = ["tune", "x86", str(payload), "--target", _TARGET, "--threads", "1", "--explain"]
    assert main([*args, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sites"]["conv0"] == ["conv_path"]
    assert info["fields"]["conv0.gemm"] == {"choices": [0, 1]}
    assert "conv0.alone" in info["constraints"]
    assert info["fields"]["conv0.winograd"] == {"choices": [0, 1]}
    assert info["baseline"]["conv_paths"] == {_KEY: {"gemm": False, "winograd": False}}
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "site conv0: ops conv_path" in text and "conv0.alone" in text
    assert "conv0.gemm" in text and "{0,1}" in text


def _stamped(graph, payload, tmp_path, **options):
    """The path decision in the normalized IR of ``payload`` through ``graph``, and
    whether the run verified."""
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target=_TARGET, dump_ir=str(dumped),
                    **options)  # fmt: skip
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        [choice] = stamped_choices(ir.Module.parse(normalized.read_text()))
    return choice, report.verified


def test_a_candidate_compiles_its_path(problem, payload, tmp_path):
    from stagegraph.app.graph_options import with_candidate_params
    from stagegraph.core.catalog import load_graph

    baseline = problem.base.model_dump(mode="json")
    moved = problem.space.to_params({"conv0.gemm": 1}).model_dump(mode="json")
    assert moved["conv_paths"] == {_KEY: {"gemm": True, "winograd": False}}
    graph = with_candidate_params(load_graph("x86"), moved, baseline)
    choice, verified = _stamped(graph, payload, tmp_path)
    assert (choice.key, choice.path, choice.decided_by) == (_KEY, "gemm", "paths")
    assert verified is True


def test_tune_measures_the_other_path_and_tuned_replays_a_winner(payload, tmp_path, capsys):
    from stagegraph.stages.common.tuning_db import TuneDB
    from stagegraph.tune.runner import Problem, TuneOptions

    db = tmp_path / "t.db"
    common = [str(payload), "--target", _TARGET, "--threads", "1", "--db", str(db)]
    code = main(["tune", "x86", *common, "--fix", "gemm=1", "--fix", "winograd=0", "--budget", "2",
                 "--samples", "4", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    # --fix gemm=1 leaves one point: the GEMM path with the rest at the baseline's values;
    # it compiled, verified and was timed beside the (direct) baseline
    assert (report["measured"], report["failed"], report["exhausted"]) == (1, 0, True)
    assert report["best"]["params"]["conv_paths"] == {_KEY: {"gemm": True, "winograd": False}}
    assert report["baseline"]["params"]["conv_paths"] == {_KEY: {"gemm": False, "winograd": False}}
    # make the GEMM candidate a clear winner (the timing is the machine's, not ours) and
    # replay it: the tuned cost model's graph normalizes the convolution to the GEMM
    request = SessionRequest(graph="x86", workload=str(payload), target=_TARGET, threads=1)
    key = Problem(TuneOptions(session=request)).key
    store = TuneDB(db)
    [result] = store.results(key)
    store.close()
    won = TuneDB(tmp_path / "won.db")
    won.record(
        key,
        result.model_copy(
            update={"samples": [1.0] * 6, "baseline_samples": [2.0] * 6, "median_s": 1.0}
        ),
    )
    won.close()  # fmt: skip
    choice, verified = _stamped("x86", payload, tmp_path, cost_model="tuned",
                                db=str(tmp_path / "won.db"))  # fmt: skip
    assert (choice.path, choice.decided_by) == ("gemm", "paths") and verified is True
    # without the DB, the cost model's own choice
    choice, _ = _stamped("x86", payload, tmp_path / "plain")
    assert (choice.path, choice.decided_by) == ("direct", "cost model")


def test_a_result_that_cannot_be_found_leaves_normalize_alone(payload, tmp_path):
    from stagegraph.stages.common.tuning_db import TuneDB

    empty = tmp_path / "empty.db"
    TuneDB(empty).close()
    with pytest.warns(UserWarning, match="cost model 'tuned'"):
        choice, verified = _stamped("x86", payload, tmp_path, cost_model="tuned", db=str(empty))
    assert (choice.path, choice.decided_by, verified) == ("direct", "cost model", True)


def test_per_op_records_leave_paths_to_their_payload(problem, tmp_path):
    """A winner's values are stored per op signature for other payloads, but not a path
    (x86.normalize replays the payload's winner), nor anything of a winner that moved a
    path (its other values were measured on other ops)."""
    from stagegraph.stages.common.tuning_db import CandidateResult, TuneDB
    from stagegraph.tune.runner import _record_tuned_sites

    space = problem.space
    base = space.values_of(problem.base)
    tile = next(n for n in base if n.startswith("generic.conv_width"))
    other = next(v for v in space.variables[tile].domain.values if v != base[tile])

    def winner(values):
        params = space.to_params({**base, **values})
        return CandidateResult(params_hash=params.content_hash()[:16], status="ok",
                               params=params.model_dump(mode="json"), samples=[1.0] * 6,
                               baseline_samples=[2.0] * 6, median_s=1.0)  # fmt: skip

    db = TuneDB(tmp_path / "sites.db")
    moved = winner({"conv0.gemm": 1})
    assert _record_tuned_sites(db, problem, {moved.params_hash: moved}) == []
    tiled = winner({tile: other})
    stored = _record_tuned_sites(db, problem, {tiled.params_hash: tiled})
    db.close()
    assert stored and not any(s.startswith("conv_path") for s in stored)
    # a direct convolution is channels-last from x86.normalize on (conv/chain_layout.py)
    assert any(s.startswith("convolution linalg.conv_2d_nhwc_hwcf") for s in stored)


def test_the_analysis_passes_stamped_decisions_on():
    from stagegraph.stages.analysis import analyze

    text = """
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.copy {stagegraph.conv_path = {key = "k1", path = "gemm", gemm_cycles = 3 : i64},
                    stagegraph.other = 5 : i64, note = {key = "not ours"}}
    ins(%a : tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""
    with new_context():
        facts = analyze(ir.Module.parse(text))
    [decision] = facts.decisions
    assert (decision.attribute, decision.key) == ("stagegraph.conv_path", "k1")
    assert decision.fields == {"path": "gemm", "gemm_cycles": 3}


def test_fixing_a_path_on_a_payload_without_convolutions_is_refused(capsys):
    code = main(["tune", "x86", "matmul:m=16,n=16,k=16", "--explain", "--fix", "gemm=1"])
    assert code == 2
    assert "--fix 'gemm' is not a tunable field of this payload" in capsys.readouterr().err
