"""Explicit references: reports say where the reference came from, ``--reference`` picks
it, and a verdict that would compare a result with itself is not called VERIFIED."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagegraph.cli.main import main

MATMUL = """\
func.func @main(%a: tensor<4x8x{t}>, %b: tensor<8x4x{t}>) -> tensor<4x4x{t}> {{
  %z = arith.constant 0.0 : {t}
  %e = tensor.empty() : tensor<4x4x{t}>
  %f = linalg.fill ins(%z : {t}) outs(%e : tensor<4x4x{t}>) -> tensor<4x4x{t}>
  %r = linalg.matmul ins(%a, %b : tensor<4x8x{t}>, tensor<8x4x{t}>)
                     outs(%f : tensor<4x4x{t}>) -> tensor<4x4x{t}>
  return %r : tensor<4x4x{t}>
}}
"""


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    (folder / "plain.mlir").write_text(MATMUL.format(t="f32"))
    (folder / "half.mlir").write_text(MATMUL.format(t="f16"))
    (folder / "stored.mlir").write_text(MATMUL.format(t="f32"))
    (folder / "wrong.mlir").write_text(MATMUL.format(t="f32"))
    (folder / "void.mlir").write_text("func.func @main(%a: tensor<4xf32>) {\n  return\n}\n")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((8, 4)).astype(np.float32)
    np.savez(folder / "stored.npz", in0=a, in1=b, out0=a @ b)
    np.savez(folder / "wrong.npz", in0=a, in1=b, out0=(a @ b) + 1.0)
    return folder


def run_json(capsys, *argv):
    code = main(["run", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


@pytest.mark.parametrize(
    ("graph", "payload", "extra", "source", "verified"),
    [
        ("x86", "plain.mlir", [], "graph:naive", True),
        ("naive", "stored.mlir", [], "npz", True),
        ("x86", "stored.mlir", ["--reference", "naive"], "graph:naive", True),
        ("naive", "plain.mlir", [], "graph:naive", None),  # naive against itself
        ("x86", "plain.mlir", ["--reference", "x86"], "graph:x86", None),
        ("x86", "plain.mlir", ["--reference", "none"], "none", None),
        ("x86", "void.mlir", ["--reference", "none"], "none", None),
    ],
)
def test_report_names_the_reference(capsys, payloads, graph, payload, extra, source, verified):
    code, report, err = run_json(capsys, graph, str(payloads / payload), *extra)
    assert code == 0, err
    assert report["reference"] == source
    assert report["verified"] is verified
    if verified is None:
        assert report["run_seconds"] is not None  # it ran; only the comparison is skipped
        assert "not verified" in report["message"]


def test_numpy_reference_of_python_workloads(capsys):
    code, report, _ = run_json(capsys, "naive", "matmul:m=4,n=4,k=4")
    assert code == 0 and report["reference"] == "numpy" and report["verified"] is True


def test_wrong_npz_reference_is_a_wrong_result(capsys, payloads):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "naive", str(payloads / "wrong.mlir"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert exit_.value.code == 1
    assert report["verified"] is False and report["reference"] == "npz"


def test_self_reference_is_not_printed_verified(capsys, payloads):
    assert main(["run", "naive", str(payloads / "plain.mlir")]) == 0
    out = capsys.readouterr().out
    assert "RAN, NOT VERIFIED" in out and ": VERIFIED" not in out
    assert "the reference is graph 'naive' itself" in out


def test_reduced_precision_against_naive_says_what_was_compared(capsys, payloads):
    assert main(["run", "x86", str(payloads / "half.mlir")]) == 0
    out = capsys.readouterr().out
    assert "VERIFIED against graph:naive" in out
    assert "at the payload's own precision (f16)" in out
    assert "checks the lowering, not the accuracy of the arithmetic" in out
