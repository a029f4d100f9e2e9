"""Options are declared once (on SessionRequest, BenchOptions, Launch and TuneOptions) and
the command line and the Python API behave the same for every one of them, refusals
included: each case runs ``stagegraph run|bench ... --json`` and ``sg.run|bench(...)`` and
compares what they report (or the error they give)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

import stagegraph as sg
from stagegraph.app.commands import BENCH, RUN, bench_options, run_options
from stagegraph.cli.main import main
from stagegraph.errors import StagegraphError
from stagegraph.tune.command import TUNE, tune_options

W = "matmul:m=8,n=8,k=8"
FAST = {"warmup": 0, "repeat": 2, "budget": 0.05}


# -- declared once ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "specs", "api_only"),
    [
        (sg.run, run_options, set()),
        (sg.bench, bench_options, set()),
        (sg.tune, tune_options, {"explain", "progress"}),
    ],
)
def test_api_signatures_are_the_models_options(function, specs, api_only):
    """Every keyword of the API is an option of the models, with the models' default."""
    declared = specs()
    params = dict(inspect.signature(function).parameters)
    params.pop("graph"), params.pop("workload")
    assert set(params) - api_only == set(declared)
    for keyword, spec in declared.items():
        default = params[keyword].default
        if default is None and spec.default in ({}, ()):  # "none given" for a mapping
            continue
        assert default == spec.default, keyword


@pytest.mark.parametrize("command", ["run", "bench", "tune"])
def test_click_options_are_generated_from_the_models(command):
    from stagegraph.cli.main import _register_extensions, cli

    _register_extensions()
    declared = {"run": run_options, "bench": bench_options, "tune": tune_options}[command]()
    params = {p.name: p for p in cli.commands[command].params}
    cli_only = {"graph", "workload", "as_json", "explain"}
    assert set(params) - cli_only == set(declared)
    for keyword, spec in declared.items():
        option = params[keyword]
        assert spec.flag in option.opts and option.help == spec.help
        if not spec.multiple and spec.annotation is not bool and spec.cli_default is not None:
            assert option.default == spec.cli_default, keyword


def test_defaults_the_issue_found_repeated_are_written_once():
    """bench's 3/10/10, the tuning DB's name and the tuner's 20 samples have one home."""
    root = Path(sg.__file__).parent
    sources = {p: p.read_text() for p in root.rglob("*.py")}
    holders = [p.relative_to(root).as_posix() for p, s in sources.items()
               if '"stagegraph-tune.db"' in s]  # fmt: skip
    assert holders == ["tune/options.py"]
    assert bench_options()["warmup"].default == 3 and bench_options()["budget"].default == 10
    assert tune_options()["samples"].default == 20
    assert tune_options()["memory"].default == 4.0


# -- the same behaviour through both doors ------------------------------------------------


def _args(specs: dict[str, Any], options: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for keyword, value in options.items():
        flag = specs[keyword].flag
        if value is True:
            args.append(flag)
        elif isinstance(value, dict):
            for key, item in value.items():
                args += [flag, f"{key}={item}"]
        elif isinstance(value, list):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return args


def _fill(options: dict[str, Any], tmp: Path) -> dict[str, Any]:
    return {k: v.replace("{tmp}", str(tmp)) if isinstance(v, str) else v
            for k, v in options.items()}  # fmt: skip


def via_cli(capsys, command, graph, options, tmp) -> tuple[str, Any]:
    specs = run_options() if command == "run" else bench_options()
    argv = [command, graph, W, *_args(specs, _fill(options, tmp)), "--json"]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    if code == 2:
        return "error", err.split("error: ", 1)[1].strip().replace(str(tmp), "{tmp}")
    docs = [json.loads(doc) for doc in _documents(out)]
    return "ok", docs[0] if len(docs) == 1 else docs


def _documents(out: str) -> list[str]:
    decoder, docs, at = json.JSONDecoder(), [], 0
    while at < len(out.rstrip()):
        while out[at].isspace():
            at += 1
        doc, at = decoder.raw_decode(out, at)
        docs.append(json.dumps(doc))
    return docs


def via_api(command, graph, options, tmp) -> tuple[str, Any]:
    function = sg.run if command == "run" else sg.bench
    try:
        result = function(graph, W, **_fill(options, tmp))
    except StagegraphError as error:
        return "error", str(error).replace(str(tmp), "{tmp}")
    if hasattr(result, "model_dump"):
        return "ok", result.model_dump(mode="json")
    return "ok", {"ir": result.module.text()}  # until: the engine's result


def _seen(result: Any) -> dict[str, Any]:
    """What must agree: verdicts, names, threads, params, emitted file names, the IR."""
    if isinstance(result, list):
        return {"reports": [_seen(r) for r in result]}
    if "a" in result:  # a comparison
        return {"a": _seen(result["a"]), "b": _seen(result["b"]), "ratio": "ratio" in result}
    if "ir" in result:  # until: the IR after the tag
        return {"ir": result["ir"]}
    keys = ("graph", "workload", "verified", "threads", "params", "splice_at")
    seen = {k: result[k] for k in keys if k in result}
    if result.get("emitted"):
        seen["emitted"] = Path(result["emitted"]).name
    if "samples" in result:
        seen["timed"] = result["samples"] > 0
    return seen


# fmt: off
RUN_CASES = [
    ("naive", {}, "ok"),
    ("x86", {"param": {"threads": 1}, "threads": 1, "target": "x86-64-v2"}, "ok"),
    ("x86", {"cost_model": "tuned", "db": "{tmp}/none.db"}, "tuning database does not exist"),
    ("x86", {"reference": "naive"}, "ok"),
    ("naive", {"reference": "nave"}, "did you mean 'naive'"),
    ("naive", {"save_payload": "{tmp}/payload"}, "is already an MLIR payload"),
    ("x86", {"cost_model": "fixed", "params_file": "{params}"}, "ok"),
    ("x86", {"cost_model": "heuristc"}, "did you mean 'heuristic'"),
    ("naive", {"until": "bufferized"}, "ok"),
    ("naive", {"emit": "object", "output": "{tmp}/m.o"}, "ok"),
    ("naive", {"dump_ir": "{tmp}/ir", "print_ir_after": ["all"], "verify_each": True,
               "repro_dir": "{tmp}/repro"}, "ok"),
    ("naive", {"isolate": True, "timeout": 120, "memory": 4}, "ok"),
    ("naive", {"compile_timeout": 100, "run_timeout": 100, "cache": "{tmp}/cache",
               "trace": "{tmp}/t.json"}, "ok"),
    ("naive", {"threads": 1}, "no cost-model stage"),
    ("naive", {"ranks": 2, "param": {"tile_m": 8}, "threads": 1, "target": "x86-64-v2"},
     "--ranks cannot be combined with --param, --threads, --target"),
    ("naive", {"ranks": 2, "until": "bufferized", "emit": "object"},
     "--ranks cannot be combined with --until, --emit"),
    ("naive", {"isolate": True, "until": "bufferized"}, "run --isolate cannot be combined "
     "with --until"),
]
BENCH_CASES = [
    ("naive", {**FAST}, "ok"),
    ("naive", {**FAST, "splice_at": "bufferized", "min_time": 0.01, "csv": "{tmp}/b.csv"}, "ok"),
    ("naive", {**FAST, "vs": "numpy"}, "ok"),
    ("x86", {**FAST, "param": {"threads": 1}, "threads": 1, "target": "x86-64-v2",
             "cost_model": "heuristic"}, "ok"),
    ("x86", {**FAST, "cost_model": "fixed", "params_file": "{params}"}, "ok"),
    ("naive", {**FAST, "dump_ir": "{tmp}/ir", "print_ir_after": ["all"], "verify_each": True,
               "repro_dir": "{tmp}/repro", "compile_timeout": 100, "run_timeout": 100,
               "cache": "{tmp}/cache", "trace": "{tmp}/t.json"}, "ok"),
    ("naive", {**FAST, "isolate": True, "timeout": 120, "memory": 4}, "ok"),
    ("naive", {**FAST, "isolate": True, "vs": "numpy", "cost_model": "heuristic"},
     "bench --isolate cannot be combined with --vs, --cost-model"),
    ("naive", {**FAST, "ranks": 2, "vs": "numpy", "threads": 1},
     "--ranks cannot be combined with --vs, --threads"),
    ("naive", {**FAST, "vs": "nump"}, "unknown --vs graph or peer 'nump' (did you mean 'numpy'"),
    ("x86", {**FAST, "cost_model": "tuned", "db": "{tmp}/none.db"},
     "tuning database does not exist"),
]
# fmt: on


def test_the_cases_cover_every_option():
    for cases, options in ((RUN_CASES, RUN), (BENCH_CASES, BENCH)):
        assert set(options) <= {k for _, given, _ in cases for k in given}


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> str:
    """The heuristic's params for the workload, for ``--cost-model fixed``."""
    path = tmp_path_factory.mktemp("params") / "params.json"
    path.write_text(json.dumps(sg.run("x86", W).params))
    return str(path)


@pytest.mark.parametrize(("command", "graph", "options", "expect"),
                         [("run", *case) for case in RUN_CASES]
                         + [("bench", *case) for case in BENCH_CASES])  # fmt: skip
def test_cli_and_api_behave_the_same(capsys, tmp_path, params_file, command, graph, options,
                                     expect):  # fmt: skip
    options = {k: params_file if v == "{params}" else v for k, v in options.items()}
    (tmp_path / "cli").mkdir(), (tmp_path / "api").mkdir()
    cli_status, cli_result = via_cli(capsys, command, graph, options, tmp_path / "cli")
    api_status, api_result = via_api(command, graph, options, tmp_path / "api")
    if expect == "ok":
        assert cli_status == api_status == "ok", (cli_result, api_result)
        assert _seen(cli_result) == _seen(api_result)
    else:
        assert cli_status == api_status == "error", (cli_result, api_result)
        assert cli_result == api_result and expect in api_result
    for side in ("cli", "api"):  # files the options name were written on both sides
        root = tmp_path / side
        written = sorted(p.relative_to(root).parts[0] for p in root.iterdir())
        assert written == sorted(p.relative_to(tmp_path / "cli").parts[0]
                                 for p in (tmp_path / "cli").iterdir())  # fmt: skip
        if expect == "ok" and "dump_ir" in options:
            assert any((root / "ir").rglob("*.mlir"))
        if expect == "ok" and "csv" in options:
            assert len((root / "b.csv").read_text().splitlines()) == 2  # header and a row


TUNE_VALUES: dict[str, Any] = {
    "budget": 3, "jobs": 2, "cluster": "local:2", "db": "t.db", "strategy": "random",
    "seed": 7, "threads": 1, "cost_model": "analytical", "fix": {"tile_m": 8}, "per_op": True,
    "measure": "common.check", "batch_size": 2, "samples": 8, "compile_timeout": 30,
    "run_timeout": 30, "memory": 2, "dump_ir": "d", "print_ir_after": ["all"],
    "verify_each": True, "repro_dir": "r", "target": "x86-64-v2", "cache": "c",
    "trace": "t.json",
}  # fmt: skip


@pytest.mark.parametrize("keyword", TUNE)
def test_tune_options_reach_the_tuner_alike(monkeypatch, capsys, tmp_path, keyword):
    """Each tune option, through CLI and API, builds the same TuneOptions, and not the
    default one (explaining is intercepted: nothing compiles)."""
    import importlib

    runner = importlib.import_module("stagegraph.tune.runner")

    monkeypatch.chdir(tmp_path)
    seen: list[Any] = []
    monkeypatch.setattr(runner, "explain", lambda options: seen.append(options) or {})
    options = {keyword: TUNE_VALUES[keyword]}
    if keyword == "print_ir_after":
        options["dump_ir"] = "d"
    specs = tune_options()
    assert main(["tune", "x86", W, "--explain", "--json", *_args(specs, options)]) == 0
    capsys.readouterr()
    sg.tune("x86", W, explain=True, **options)
    sg.tune("x86", W, explain=True)
    cli_options, api_options, default = (o.model_dump() for o in seen)
    assert cli_options == api_options != default


def test_tune_refuses_alike(capsys):
    code = main(["tune", "x86", W, "--print-ir-after", "all"])
    err = capsys.readouterr().err
    with pytest.raises(StagegraphError) as raised:
        sg.tune("x86", W, print_ir_after=["all"])
    assert code == 2 and f"error: {raised.value}" in err and "give --dump-ir" in err


def test_a_new_command_takes_session_options_from_the_same_declarations():
    import click
    from click.testing import CliRunner

    from stagegraph.cli.options import session_options, session_request

    requests = []

    @click.command()
    @click.argument("graph")
    @click.argument("workload")
    @session_options("param", "threads", "compile_timeout")
    def command(**options):
        requests.append(session_request(options))

    done = CliRunner().invoke(command, ["x86", W, "--param", "tile_m=8", "--threads", "2"])
    assert done.exit_code == 0, done.output
    assert requests[0].params == {"tile_m": 8} and requests[0].threads == 2
    assert requests[0].compile_timeout_s == 600.0  # the command line's default
    assert CliRunner().invoke(command, ["x86", W, "--threads", "0"]).exit_code == 2
