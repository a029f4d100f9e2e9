"""`stagegraph exec` on the artifact folders the link tests build, and `stagegraph compile`'s
entry-symbol rules: results checked against references, files in and out, timing, no MLIR
loaded, and exit 2 with a message for every kind of bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from stagegraph.artifact.cabi import default_symbol
from stagegraph.cli.main import main
from stagegraph.workload import parse_workload
from tests.artifact_cases import CASES, build_once
from tests.conftest import kernelbench_or_skip

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("cc", "objcopy", "ld")), reason="needs cc, binutils"
)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return build_once(tmp_path_factory)


def exec_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["exec", *map(str, args), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def error_of(capsys, *args: str) -> str:
    assert main([*map(str, args)]) == 2
    return capsys.readouterr().err


def copy_of(artifacts, case: str, tmp_path):
    folder = tmp_path / case
    shutil.copytree(artifacts[case][0], folder)
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_exec_checks_against_the_reference(artifacts, case, capsys):
    folder, _ = artifacts[case]
    code, report = exec_json(capsys, folder, "--check", folder / "ref.npz")
    assert code == 0 and report["verified"] is True, report
    assert report["inputs"] == [f"{folder / 'ref.npz'}:in{i}" for i in range(len(report["inputs"]))]


def test_exec_reads_inputs_and_writes_outputs(artifacts, capsys, tmp_path):
    folder, workload = artifacts["two_results"]
    x, b = workload.inputs()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "b.npy", b)
    outs = [tmp_path / "y.npy", tmp_path / "s.npy"]
    inputs = ["--input", tmp_path / "x.npy", "--input", tmp_path / "b.npy"]
    code, report = exec_json(capsys, folder, *inputs, "--output", outs[0], "--output", outs[1])
    assert code == 0 and report["verified"] is None
    y = np.maximum(x + b, 0)
    np.testing.assert_allclose(np.load(outs[0]), y, rtol=1e-6)
    np.testing.assert_allclose(np.load(outs[1]), y.sum(axis=1), rtol=1e-5)


def test_exec_wrong_result_exits_1(artifacts, capsys, tmp_path):
    folder, _ = artifacts["mlp"]
    with np.load(folder / "ref.npz") as data:
        arrays = dict(data)
    arrays["out0"] = arrays["out0"] + 1.0
    np.savez(tmp_path / "wrong.npz", **arrays)
    with pytest.raises(SystemExit) as exited:  # as `run` on a wrong result
        main(["exec", str(folder), "--check", str(tmp_path / "wrong.npz"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert exited.value.code == 1 and report["verified"] is False
    assert "output 0 differs" in report["message"]


def test_exec_bench_samples_the_call(artifacts, capsys):
    folder, _ = artifacts["bf16"]
    code, report = exec_json(capsys, folder, "--check", folder / "ref.npz", "--bench",
                             "--budget", "0.5")  # fmt: skip
    assert code == 0 and report["verified"] is True
    timing = report["timing"]
    assert timing["samples"] >= 10 and 0 < timing["min_s"] <= timing["median_s"]


def test_exec_loads_no_mlir(artifacts):
    folder, _ = artifacts["matmul"]
    code = (
        "import sys\n"
        "from stagegraph.cli.main import main\n"
        f"rc = main(['exec', {str(folder)!r}, '--check', {str(folder / 'ref.npz')!r}])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch_mlir', 'mlir'))\n"
        "print('RESULT', rc, loaded)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert "RESULT 0 []" in proc.stdout, proc.stdout + proc.stderr


def test_wrong_inputs_exit_2(artifacts, capsys, tmp_path):
    folder, workload = artifacts["matmul"]
    a = workload.inputs()[0]
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "at.npy", np.ascontiguousarray(a[:, :128]))
    np.save(tmp_path / "a64.npy", a.astype(np.float64))
    err = error_of(capsys, "exec", folder, "--input", tmp_path / "at.npy", "--input",
                   tmp_path / "a.npy")  # fmt: skip
    assert "at.npy: in0 has shape (256, 128), but the artifact takes (256, 256)" in err
    err = error_of(capsys, "exec", folder, "--input", tmp_path / "a64.npy", "--input",
                   tmp_path / "a.npy")  # fmt: skip
    assert "a64.npy: in0 has dtype float64, but the artifact takes f32" in err
    err = error_of(capsys, "exec", folder, "--input", tmp_path / "a.npy")
    assert "takes 2 inputs (in0, in1), got 1" in err
    err = error_of(capsys, "exec", folder, "--input", tmp_path / "nope.npy", "--input",
                   tmp_path / "a.npy")  # fmt: skip
    assert "nope.npy: cannot read a .npy array" in err
    err = error_of(capsys, "exec", folder)
    assert "give one --input FILE.npy per argument (2)" in err
    err = error_of(capsys, "exec", folder, "--check", folder / "ref.npz", "--output",
                   tmp_path / "o.npy", "--output", tmp_path / "p.npy")  # fmt: skip
    assert "has 1 results; give as many --output files, got 2" in err


def test_bad_folders_exit_2(artifacts, capsys, tmp_path):
    folder = copy_of(artifacts, "matmul", tmp_path)
    (folder / "libiomp5.so").unlink()
    err = error_of(capsys, "exec", folder, "--check", folder / "ref.npz")
    assert "names libiomp5.so, which the folder lacks" in err
    (folder / "libstagegraph_matmul.so").unlink()
    err = error_of(capsys, "exec", folder, "--check", folder / "ref.npz")
    assert "libstagegraph_matmul.so, libiomp5.so, which the folder lacks" in err
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 99}))
    err = error_of(capsys, "exec", folder, "--check", folder / "ref.npz")
    assert "manifest schema version 99, but this stagegraph reads version 1" in err
    err = error_of(capsys, "exec", tmp_path, "--check", folder / "ref.npz")
    assert "no manifest.json (is it an artifact folder?)" in err


def test_missing_isa_is_refused_before_loading(artifacts, capsys, tmp_path):
    """Checked first: with the library gone, the ISA is still what is reported."""
    folder = copy_of(artifacts, "mlp", tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["target"]["isa"] = [*manifest["target"]["isa"], "avx10_9"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / manifest["library"]).unlink()
    err = error_of(capsys, "exec", folder, "--check", folder / "ref.npz")
    assert "this host lacks avx10_9" in err and "rebuild it for a target" in err


@pytest.mark.parametrize(
    "spec, symbol",
    [
        ("matmul:m=8,n=8,k=8", "stagegraph_matmul"),
        ("mlp", "stagegraph_mlp"),
        ("/data/l1_019_ReLU.mlir", "stagegraph_l1_019_relu"),
        ("my-model.v2.mlir", "stagegraph_my_model_v2"),
        ("---", "stagegraph_entry"),
    ],
)
def test_default_symbol_is_a_c_identifier(spec, symbol):
    assert default_symbol(spec) == symbol


def test_entry_symbol_option(capsys, tmp_path):
    code = main(["compile", "naive", "matmul:m=4,n=3,k=2", "-o", str(tmp_path / "a"),
                 "--entry-symbol", "my_mm", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["entry_symbol"] == "my_mm"
    header = (tmp_path / "a" / "my_mm.h").read_text()
    assert "void my_mm(const float *in0, const float *in1, float *out0);" in header
    nm = subprocess.run(["nm", "-g", "--defined-only", str(tmp_path / "a" / "my_mm.o")],
                        capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert sorted(line.split()[-1] for line in nm.splitlines()) == ["_mlir_ciface_my_mm", "my_mm"]
    (tmp_path / "empty.npy").write_bytes(b"")
    err = error_of(capsys, "exec", tmp_path / "a", "--input", tmp_path / "empty.npy")
    assert "empty.npy: cannot read a .npy array" in err
    for bad, message in [("main", "would collide"), ("9x", "not a C identifier"),
                         ("_mlir_x", "would collide")]:  # fmt: skip
        err = error_of(capsys, "compile", "naive", "matmul:m=4,n=3,k=2", "-o",
                       tmp_path / "b", "--entry-symbol", bad)  # fmt: skip
        assert message in err
    err = error_of(capsys, "compile", "naive", "matmul", "-o", tmp_path / "no" / "dir")
    assert "directory" in err and "does not exist" in err


def test_emit_object_exports_no_main(capsys, tmp_path):
    obj = tmp_path / "mm.o"
    assert main(["run", "naive", "matmul:m=4,n=3,k=2", "--emit", "object", "-o", str(obj)]) == 0
    capsys.readouterr()
    nm = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True,
                        text=True, check=True).stdout  # fmt: skip
    names = sorted(line.split()[-1] for line in nm.splitlines())
    assert names == ["_mlir_ciface_stagegraph_matmul", "stagegraph_matmul"]


def test_named_target_is_recorded_and_runs_here(capsys, tmp_path):
    folder = tmp_path / "v3"
    assert main(["compile", "x86", "matmul:m=16,n=8,k=4", "-o", str(folder),
                 "--target", "x86-64-v3"]) == 0  # fmt: skip
    capsys.readouterr()
    target = json.loads((folder / "manifest.json").read_text())["target"]
    assert target["name"] == "x86-64-v3" and target["arch"] == "x86_64"
    assert {"avx2", "fma"} <= set(target["isa"]) and "avx512f" not in target["isa"]
    workload = parse_workload("matmul:m=16,n=8,k=4")
    np.savez(tmp_path / "ref.npz", in0=workload.inputs()[0], in1=workload.inputs()[1],
             out0=workload.reference()[0])  # fmt: skip
    code, report = exec_json(capsys, folder, "--check", tmp_path / "ref.npz")
    assert code == 0 and report["verified"] is True


def test_missing_binutils_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OBJCOPY", "no-such-objcopy")
    err = error_of(capsys, "compile", "naive", "matmul:m=4,n=3,k=2", "-o", tmp_path / "a")
    assert "building an artifact needs 'no-such-objcopy' on PATH" in err


def test_reference_without_the_results_exits_2(artifacts, capsys, tmp_path):
    folder, _ = artifacts["two_results"]
    with np.load(folder / "ref.npz") as data:
        np.savez(tmp_path / "part.npz", in0=data["in0"], in1=data["in1"], out0=data["out0"])
    err = error_of(capsys, "exec", folder, "--check", tmp_path / "part.npz")
    assert "part.npz: the artifact has 2 results and the file lacks out1" in err


def test_kernelbench_training_norm_reference(capsys, tmp_path):
    """A KernelBench reference lists the updated statistics (mut0..) before out0."""
    payload = kernelbench_or_skip() / "l1_033_BatchNorm.mlir"
    assert main(["compile", "x86", str(payload), "-o", str(tmp_path / "bn")]) == 0
    capsys.readouterr()
    code, report = exec_json(capsys, tmp_path / "bn", "--check", payload.with_suffix(".npz"))
    assert code == 0 and report["verified"] is True
