"""The bad-input catalogue (README, "When input is wrong"): each row exits 2 with a
one-paragraph message naming what is wrong and where, and no traceback."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.cli.main import main

GOOD_GRAPH = """\
name: demo
stages:
  - {name: load, factory: verify}
  - {name: bufferize, factory: bufferize}
edges:
  - payload -> load.module
  - load.module -> bufferize.module
"""

FILES = {
    "negate.mlir": "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %e = tensor.empty() : tensor<4xf32>\n"
    "  %r = linalg.negf ins(%a : tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>\n"
    "  return %r : tensor<4xf32>\n}\n",
    "malformed.mlir": "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  return %b : tensor<4xf32>\n}\n",
    "dynamic.mlir": "func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {\n"
    "  return %a : tensor<?xf32>\n}\n",
    "complex.mlir": "func.func @main(%a: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {\n"
    "  return %a : tensor<4xcomplex<f32>>\n}\n",
    "badyaml.yaml": "name: x\nstages: [\n  {name: a, factory: verify\n",
    "missing.yaml": GOOD_GRAPH.replace("{name: load, factory: verify}", "{name: load}"),
    "unknownkey.yaml": GOOD_GRAPH.replace("factory: verify}", "factory: verify, colour: red}"),
    "unknownstage.yaml": GOOD_GRAPH.replace("factory: verify", "factory: verifi"),
    "cycle.yaml": GOOD_GRAPH + "  - bufferize.module -> load.module\n",
    "unconnected.yaml": GOOD_GRAPH.replace("  - load.module -> bufferize.module\n", ""),
    "doubly.yaml": GOOD_GRAPH + "  - payload -> bufferize.module\n",
    "mismatch.yaml": GOOD_GRAPH.replace(
        "name: demo", "name: demo\ninputs:\n  payload: {type: 'module:llvm'}"
    ),
    "empty.yaml": "name: empty\nstages: []\n",
    "levels.yaml": GOOD_GRAPH.replace("factory: bufferize}", "factory: linalg_to_loops}"),
    "badparam.yaml": "name: demo\nstages:\n  - {name: target, factory: target}\n"
    "  - {name: analyze, factory: analyze}\n"
    "  - {name: select, factory: x86.heuristic, config: {overrides: {tile_mm: 12}}}\n"
    "edges:\n  - payload -> analyze.module\n  - analyze.facts -> select.facts\n"
    "  - target.facts -> select.target\n",
    "external.mlir": "func.func private @no_such_function(f32) -> f32\n"
    "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n"
    "func.func @other(%x: f32) -> f32 {\n"
    "  %y = func.call @no_such_function(%x) : (f32) -> f32\n  return %y : f32\n}\n",
    "badpass.yaml": GOOD_GRAPH.replace(
        "{name: load, factory: verify}",
        "{name: load, factory: verify, config: {pipeline: 'func.func(csee)'}}",
    ),
    "badoption.yaml": GOOD_GRAPH.replace(
        "{name: bufferize, factory: bufferize}",
        "{name: bufferize, factory: bufferize, config: {pipeline: 'canonicalize{nope=1}'}}",
    ),
    "notransform.yaml": GOOD_GRAPH.replace(
        "{name: load, factory: verify}",
        "{name: load, factory: transform, config: {file: gone.mlir}}",
    ),
    "badtransform.yaml": GOOD_GRAPH.replace(
        "{name: load, factory: verify}",
        "{name: load, factory: transform, config: {file: bad.mlir}}",
    ),
    "bad.mlir": "module attributes {transform.with_named_sequence} {\n  transform.bogus\n}\n",
    "notjson.json": "tile_m: 4\n",
    "badfixed.json": '{"matmul": {"tile_m": "x"}}',
    "raises.py": "x = 1\nraise ValueError('top-level boom')\n",
    "buildraises.py": "def build():\n    return {}['missing']\n",
    "plugin_build_raises.py": "import stagegraph as sg\n\n\n@sg.register_graph('broken-build')\n"
    "def build():\n    raise RuntimeError('cannot build')\n",
    "plugin_bad_stage.py": """\
import stagegraph as sg
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify


@sg.stage("passes", name="returns_none")
def returns_none(module: sg.Module["tensor"]) -> sg.Module["tensor"]:
    ...


@sg.stage("passes", name="returns_str")
def returns_str(module: sg.Module["tensor"]) -> sg.Module["tensor"]:
    return "module"


def graph_with(factory):
    return sg.Graph(
        "bad-" + factory.name,
        [verify("load"), factory("clean"), bufferize(), linalg_to_loops("loops"),
         lower_to_llvm("lower"), jit("emit")],
        ["payload -> load.module", "load.module -> clean.module",
         "clean.module -> bufferize.module", "bufferize.module -> loops.module",
         "loops.module -> lower.module", "lower.module -> emit.module"],
        [sg.GraphInput("payload", sg.Module["tensor"], frozenset({"input"}))],
    )


sg.register_graph("stage-returns-none", lambda: graph_with(returns_none))
sg.register_graph("stage-returns-str", lambda: graph_with(returns_str))
""",
}

MATMUL = """\
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>)
                     outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
"""


VOID = "func.func @main(%a: tensor<4xf32>) {\n  return\n}\n"


def _npz_files(folder):
    """A matmul payload beside each kind of broken .npz (STEM.mlir + STEM.npz)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((8, 4)).astype(np.float32)
    arrays = {
        "npz_shape": {"in0": a, "in1": b, "out0": np.zeros((4, 5), np.float32)},
        "npz_dtype": {"in0": a, "in1": b, "out0": (a @ b).astype(np.float64)},
        "npz_no_out": {"in0": a, "in1": b},
        "npz_in_shape": {"in0": a.T.copy(), "in1": b, "out0": a @ b},
        "npz_object": {"in0": np.array([1, "x"], dtype=object), "in1": b, "out0": a @ b},
    }
    for stem, data in arrays.items():
        (folder / f"{stem}.mlir").write_text(MATMUL)
        np.savez(folder / f"{stem}.npz", **data)
    (folder / "plain.mlir").write_text(MATMUL)
    (folder / "void.mlir").write_text(VOID)
    for stem, raw in (("npz_corrupt", b"PK\x03\x04 not a zip archive"), ("npz_empty", b"")):
        (folder / f"{stem}.mlir").write_text(MATMUL)
        (folder / f"{stem}.npz").write_bytes(raw)


# (id, argv with {dir} for the temp folder, expected message fragments)
CATALOGUE = [
    (
        "malformed-mlir",
        ["run", "naive", "{dir}/malformed.mlir"],
        ["malformed.mlir:2:10", "use of undeclared SSA value name"],
    ),
    ("dynamic-shapes", ["run", "naive", "{dir}/dynamic.mlir"], ["argument", "dynamic"]),
    ("unsupported-dtype", ["run", "naive", "{dir}/complex.mlir"], ["complex<f32>"]),
    ("unknown-graph", ["run", "naiv", "matmul"], ["unknown graph 'naiv'", "did you mean 'naive'"]),
    (
        "unknown-workload",
        ["run", "naive", "matmull"],
        ["unknown workload 'matmull'", "did you mean 'matmul'"],
    ),
    (
        "unknown-stage",
        ["validate", "{dir}/unknownstage.yaml"],
        ["stage 'load'", "unknown stage factory 'verifi'", "did you mean 'verify'"],
    ),
    (
        "unknown-tag",
        ["run", "naive", "matmul", "--until", "bufferised"],
        ["no tag 'bufferised'", "did you mean 'bufferized'", "its tags: bufferized, input"],
    ),
    (
        "unknown-workload-parameter",
        ["run", "naive", "matmul:mm=3"],
        ["workload 'matmul'", "'mm'", "did you mean 'm'"],
    ),
    ("parameter-wrong-type", ["run", "naive", "matmul:m=abc"], ["'m'", "'abc'"]),
    ("parameter-out-of-range", ["run", "naive", "matmul:m=0"], ["'m'", "greater than 0"]),
    (
        "unknown-param-override",
        ["run", "naive", "matmul", "--param", "tile=4"],
        ["graph 'naive' has no cost-model stage"],
    ),
    ("graph-bad-yaml", ["validate", "{dir}/badyaml.yaml"], ["badyaml.yaml:", "invalid YAML"]),
    (
        "graph-missing-field",
        ["validate", "{dir}/missing.yaml"],
        ["missing.yaml:3:", "stages.0.factory: Field required"],
    ),
    (
        "graph-unknown-key",
        ["validate", "{dir}/unknownkey.yaml"],
        ["unknownkey.yaml:3:", "stages.0.colour: Extra inputs are not permitted"],
    ),
    ("graph-cycle", ["validate", "{dir}/cycle.yaml"], ["cycle: "]),
    (
        "graph-unconnected-port",
        ["validate", "{dir}/unconnected.yaml"],
        ["stage 'bufferize' input 'module'", "not connected"],
    ),
    (
        "graph-doubly-connected-port",
        ["validate", "{dir}/doubly.yaml"],
        ["stage 'bufferize' input 'module' is connected 2 times"],
    ),
    (
        "graph-type-mismatch",
        ["validate", "{dir}/mismatch.yaml"],
        [
            "graph input 'payload' (Module[llvm]) cannot feed stage 'load' input 'module' "
            "(Module[tensor])"
        ],
    ),
    ("empty-graph", ["validate", "{dir}/empty.yaml"], ["graph 'empty' has no stages"]),
    (
        "graph-level-mismatch",
        ["validate", "{dir}/levels.yaml"],
        [
            "levels.yaml",
            "stage 'load' output 'module' (Module[tensor]) cannot feed stage "
            "'bufferize' input 'module' (Module[buffer])",
        ],
    ),
    (
        "graph-unknown-param-key",
        ["validate", "{dir}/badparam.yaml"],
        ["badparam.yaml", "stage 'select'", "unknown parameter 'tile_mm'", "did you mean 'tile_m'"],
    ),
    (
        "bad-splice-at",
        ["bench", "x86", "matmul:m=4,n=4,k=4", "--splice-at", "lower"],
        [
            "graph 'x86'",
            "cannot splice the benchmark wrapper at 'lower'",
            "Module[llvm]",
            "--splice-at bufferized|input|scheduled",
        ],
    ),
    (
        "unknown-cost-model",
        ["run", "x86", "matmul", "--cost-model", "heuristc"],
        ["unknown cost model 'heuristc'", "did you mean 'heuristic'"],
    ),
    (
        "unknown-target",
        ["run", "x86", "matmul:m=4,n=4,k=4", "--target", "znver33"],
        ["unknown target 'znver33'", "did you mean 'znver3'"],
    ),
    (
        "target-without-target-stage",
        ["run", "naive", "matmul:m=4,n=4,k=4", "--target", "x86-64-v3"],
        ["graph 'naive' has no target stage"],
    ),
    (
        "unresolved-symbol",
        ["run", "naive", "{dir}/external.mlir"],
        ["stage 'emit'", "calls no_such_function, which no loaded library provides"],
    ),
    (
        "unwritable-output",
        ["run", "naive", "matmul:m=4,n=4,k=4", "--dump-ir", "/proc/no/dir"],
        ["cannot write IR dumps to /proc/no/dir"],
    ),
    (
        "unwritable-library",
        ["run", "naive", "matmul", "--emit", "shared", "-o", "/no/dir/x.so"],
        ["cannot write /no/dir/x.so"],
    ),
    (
        "buffers-exceed-memory",
        ["run", "x86", "matmul:m=1000000,n=1000000,k=1000000"],
        [
            "workload 'matmul:m=1000000,n=1000000,k=1000000",
            "needs at least 14901.2 GiB",
            "is available",
            "refused before compiling",
        ],
    ),
    (
        "buffers-exceed-isolate-memory",
        ["run", "x86", "matmul:m=20000,n=20000,k=20000", "--isolate", "--memory", "1"],
        ["needs at least 6.0 GiB", "address-space limit 1.0 GiB", "--memory with --isolate"],
    ),
    (
        "npz-output-wrong-shape",
        ["run", "naive", "{dir}/npz_shape.mlir"],
        ["npz_shape.npz: out0 is float32[4, 5] but result #0 of @main is f32[4, 4]"],
    ),
    (
        "npz-output-wrong-dtype",
        ["run", "naive", "{dir}/npz_dtype.mlir"],
        [
            "npz_dtype.npz: out0 is float64[4, 4] but result #0 of @main is f32[4, 4]",
            "must match exactly",
        ],
    ),
    (
        "npz-input-wrong-shape",
        ["run", "naive", "{dir}/npz_in_shape.mlir"],
        ["npz_in_shape.npz: in0 is float32[8, 4] but argument #0 of @main is f32[4, 8]"],
    ),
    (
        "npz-without-outputs",
        ["run", "naive", "{dir}/npz_no_out.mlir"],
        ["npz_no_out.npz: has 0 arrays (none) named mutN/outN, but @main has 1 results"],
    ),
    (
        "npz-corrupt",
        ["run", "naive", "{dir}/npz_corrupt.mlir"],
        ["npz_corrupt.npz is not a readable .npz archive", "in0.. and its reference out0.."],
    ),
    ("npz-empty", ["run", "naive", "{dir}/npz_empty.mlir"], ["npz_empty.npz is empty"]),
    (
        "npz-pickled",
        ["run", "naive", "{dir}/npz_object.mlir"],
        ["npz_object.npz: array 'in0' holds Python objects (pickled data)"],
    ),
    (
        "no-results-to-verify",
        ["run", "naive", "{dir}/void.mlir"],
        ["@main returns no results, so there is nothing to verify", "--reference none"],
    ),
    (
        "unknown-reference-graph",
        ["run", "x86", "{dir}/plain.mlir", "--reference", "naiv"],
        ["--reference: unknown graph 'naiv'", "did you mean 'naive'"],
    ),
    (
        "reference-graph-fails",
        [
            "--plugin",
            "{dir}/plugin_bad_stage.py",
            "run",
            "naive",
            "{dir}/plain.mlir",
            "--reference",
            "stage-returns-none",
        ],
        [
            "the reference failed, not the graph under test: graph 'stage-returns-none' "
            "computes the reference",
            "returned None for its output 'module'",
        ],
    ),
    (
        "unknown-pass",
        ["validate", "{dir}/badpass.yaml"],
        [
            "badpass.yaml: graph 'demo': stage 'load' (verify): pass pipeline 'func.func(csee)' "
            "does not parse",
            "'csee' does not refer to a registered pass",
        ],
    ),
    (
        "unknown-pass-option",
        ["validate", "{dir}/badoption.yaml"],
        ["stage 'bufferize' (bufferize)", "no such option nope"],
    ),
    (
        "missing-transform-file",
        ["validate", "{dir}/notransform.yaml"],
        ["stage 'load' (transform): file:", "gone.mlir does not exist"],
    ),
    (
        "transform-file-does-not-parse",
        ["validate", "{dir}/badtransform.yaml"],
        ["stage 'load' (transform): cannot parse MLIR in", "bad.mlir:2:"],
    ),
    (
        "param-wrong-type",
        ["run", "x86", "matmul:m=8,n=8,k=8", "--param", "tile_m=abc"],
        ["stage 'select' of graph 'x86': invalid --param for MatmulParams: tile_m='abc'"],
    ),
    (
        # no matmul in the payload to apply it to: the typo is still an error
        "matmul-param-wrong-type-without-matmul",
        ["run", "x86", "{dir}/negate.mlir", "--param", "tile_m=abc"],
        ["stage 'select' of graph 'x86': invalid --param for MatmulParams: tile_m='abc'"],
    ),
    (
        "params-file-not-json",
        [
            "run",
            "x86",
            "matmul:m=8,n=8,k=8",
            "--cost-model",
            "fixed",
            "--params-file",
            "{dir}/notjson.json",
        ],
        ["--params-file", "notjson.json is not JSON"],
    ),
    (
        "params-file-invalid-params",
        [
            "run",
            "x86",
            "matmul:m=8,n=8,k=8",
            "--cost-model",
            "fixed",
            "--params-file",
            "{dir}/badfixed.json",
        ],
        ["stage 'select' of graph 'x86': invalid fixed params: matmul={'tile_m': 'x'}"],
    ),
    (
        "fixed-without-params-file",
        ["run", "x86", "matmul:m=8,n=8,k=8", "--cost-model", "fixed"],
        ["--cost-model fixed needs --params-file FILE.json"],
    ),
    (
        "tuned-without-db",
        ["run", "x86", "matmul:m=8,n=8,k=8", "--cost-model", "tuned"],
        ["--cost-model tuned needs --db FILE"],
    ),
    (
        "tuned-missing-db",
        ["run", "x86", "matmul:m=8,n=8,k=8", "--cost-model", "tuned", "--db", "{dir}/none.db"],
        ["none.db: tuning database does not exist", "stagegraph tune"],
    ),
    (
        "graph-file-raises",
        ["validate", "{dir}/raises.py"],
        ["graph file", "raises.py: ValueError: top-level boom", "raises.py:2)"],
    ),
    (
        "graph-build-raises",
        ["validate", "{dir}/buildraises.py"],
        ["buildraises.py: build() raised KeyError: 'missing'", "buildraises.py:2)"],
    ),
    (
        "plugin-graph-build-raises",
        ["--plugin", "{dir}/plugin_build_raises.py", "run", "broken-build", "matmul"],
        ["graph 'broken-build'", "raised RuntimeError: cannot build", "plugin_build_raises.py:6)"],
    ),
    (
        "stage-returns-none",
        [
            "--plugin",
            "{dir}/plugin_bad_stage.py",
            "run",
            "stage-returns-none",
            "matmul:m=4,n=4,k=4",
        ],
        [
            "stage 'clean' (returns_none) returned None for its output 'module' (Module[tensor])",
            "expected a Module or an MLIR ir.Module",
        ],
    ),
    (
        "stage-returns-str",
        ["--plugin", "{dir}/plugin_bad_stage.py", "run", "stage-returns-str", "matmul:m=4,n=4,k=4"],
        ["stage 'clean' (returns_str) returned a str ('module') for its output 'module'"],
    ),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One folder for the module: a plugin file is imported once per process, by path."""
    tmp_path = tmp_path_factory.mktemp("bad-input")
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    _npz_files(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("argv", "fragments"), [c[1:] for c in CATALOGUE],
                         ids=[c[0] for c in CATALOGUE])  # fmt: skip
def test_catalogue(capsys, folder, argv, fragments):
    code = main([a.replace("{dir}", str(folder)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert "reproducer:" not in err or "stage 'emit'" in err  # input errors get none
    assert "errors.pydantic.dev" not in err


def test_debug_shows_traceback(capsys):
    assert main(["--debug", "run", "naiv", "matmul"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_an_end_of_file_is_named_not_a_bare_aborted(capsys):
    """click folds EOFError into Abort; the message says what ended (--debug: where)."""
    from stagegraph.cli.main import cli

    @cli.command("eof-for-test")
    def eof_for_test():
        raise EOFError("No data left in file")

    try:
        assert main(["eof-for-test"]) == 1
        assert capsys.readouterr().err.strip() == "aborted: EOFError: No data left in file"
        assert main(["--debug", "eof-for-test"]) == 1
        assert "Traceback" in capsys.readouterr().err
    finally:
        cli.commands.pop("eof-for-test", None)
