"""The real-size tables (``benchmarks/real_size.py``, ``benchmarks/versus_table.py``): the
one scaling rule, the specs of the level-2 problems and level-3 models, and the table and
files assembled from rows (no timing). Specs of shipped problems skip without ../shared."""

from __future__ import annotations

import ast
import csv
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ROOT = SHARED / "kernelbench"


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> object:
    """The benchmark scripts importable by name, as they import one another."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import real_size
    import versus_table

    yield type("Scripts", (), {"real_size": real_size, "versus_table": versus_table})
    for name in ("real_size", "versus_table", "kernelbench_torch_coverage", "ops_vs_torch"):
        sys.modules.pop(name, None)


def test_scale_multiplies_only_the_batch(scripts) -> None:
    constants = {"batch_size": 16, "in_channels": 8, "height=width": 32, "kernel_size": 3}
    assert scripts.real_size.scale_constants(constants, 16) == {
        "batch_size": 256, "in_channels": 8, "height=width": 32, "kernel_size": 3,
    }  # fmt: skip
    assert scripts.real_size.scale_constants({"batch_size=n": 2}, 4) == {"batch_size=n": 8}
    assert scripts.real_size.scale_constants(constants, 1) == constants


def test_ops_vs_torch_scales_with_the_same_rule(scripts, tmp_path: Path) -> None:
    import ops_vs_torch

    problem = tmp_path / "l1_999_Toy.py"
    problem.write_text("batch_size = 2\ndim = 5\n")
    module = ops_vs_torch.load_problem(problem, {"batch_size": 3, "dim": 7}, 16)
    assert (module.batch_size, module.dim) == (48, 7)


def _overrides(spec: str) -> tuple[Path, dict]:
    from stagegraph.workload.torch_source import parse_value

    path, _, items = spec.rpartition(":")
    pairs = (item.split("=") for item in items.split(",") if item)
    return Path(path), {name: parse_value(value) for name, value in pairs}


def test_level2_specs_scale_the_shipped_batch(scripts) -> None:
    if not (ROOT / "src" / "level2").is_dir():
        pytest.skip("no ../shared/kernelbench")
    from stagegraph.workload import parse_workload

    payload = next((ROOT / "level2").glob("l2_001_*.mlir"))
    shipped = json.loads((ROOT / "level2" / "manifest.json").read_text())[0]
    assert shipped["stem"] == payload.stem
    path, values = _overrides(scripts.real_size.scaled_problem_spec(payload, 16))
    assert path.name.startswith("l2_001_")
    assert values["batch_size"] == 16 * shipped["scaled_constants"]["batch_size"]
    assert values["in_channels"] == shipped["scaled_constants"]["in_channels"]
    parse_workload(scripts.real_size.scaled_problem_spec(payload, 16))  # every name exists


def _inputs_of(spec: str) -> list:
    """``get_inputs()`` of a problem file run with the spec's overrides (no model built)."""
    from stagegraph.workload.torch_source import apply_overrides

    path, overrides = _overrides(spec)
    tree = apply_overrides(ast.parse(path.read_text()), overrides, str(path))
    namespace: dict = {"__name__": "problem"}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace["get_inputs"]()


def test_every_dev_model_runs_at_batch_1_with_224_images(scripts) -> None:
    if not (ROOT / "src" / "level3").is_dir():
        pytest.skip("no ../shared/kernelbench")
    pytest.importorskip("torch")
    specs = scripts.real_size.model_specs(ROOT)
    assert len(specs) == len(scripts.real_size.LEVEL3_MODELS) == 7
    for name, spec in specs:
        (image,) = _inputs_of(spec)
        assert image.shape[0] == 1 and tuple(image.shape[-2:]) == (224, 224), name


def _row(vt, name: str, speedups: dict, **fields) -> object:
    peers = {p: vt.PeerResult(seconds=0.002 * s, gflops=10 / s, speedup=s) for p, s in
             speedups.items()}  # fmt: skip
    base = {"verified": True, "x86_s": 0.002, "gflops": 10.0, "payload_threads": 1}
    return vt.VsRow(payload=name, peers=peers, **(base | fields))


def test_table_has_peaks_geomeans_and_the_count_below_one(scripts) -> None:
    vt = scripts.versus_table
    rows = [
        _row(vt, "a", {"torch": 2.0, "iree": 4.0}),
        _row(vt, "b", {"torch": 0.5, "iree": 1.0}),
        vt.VsRow(payload="c", error="x86: timeout after 300 s"),
        _row(vt, "d", {"torch": 1.0}).model_copy(update={"peers": {
            "torch": vt.PeerResult(speedup=3.0, seconds=0.006, gflops=3.3, trustworthy=False),
            "iree": vt.PeerResult(error="IREE cannot compile it")}}),
    ]  # fmt: skip
    totals = vt.summary(rows, ["torch", "iree"])
    assert totals["torch"]["payloads"] == 3 and totals["iree"]["payloads"] == 2
    assert totals["torch"]["geomean_speedup"] == pytest.approx(3.0 ** (1 / 3))
    assert totals["torch"]["below_1"] == ["b"] and totals["iree"]["below_1"] == []
    lines = vt.table_lines(rows, ["torch", "iree"], ["host X; target x86-64-v4"], peak=40.0)
    assert lines[0] == "host X; target x86-64-v4  "
    head = next(line for line in lines if line.startswith("| payload"))
    assert "torch % peak" in head and "iree/x86 time" in head
    row_a = next(line for line in lines if line.startswith("| a |"))
    cells = [c.strip() for c in row_a.strip("|").split("|")]
    assert cells[:6] == ["a", "yes", "1", "2.000", "10.0", "25%"]
    assert cells[6:] == ["4.000", "12%", "2.00", "8.000", "6%", "4.00"]
    assert "no (x86: timeout after 300 s)" in next(x for x in lines if x.startswith("| c |"))
    row_d = next(line for line in lines if line.startswith("| d |"))
    assert "3.00 (noisy)" in row_d and "(IREE cannot compile it)" in row_d
    drifted = _row(vt, "e", {"torch": 2.0}).model_copy(update={"peers": {
        "torch": vt.PeerResult(seconds=0.002, speedup=2.0, x86_s=0.001)}})  # fmt: skip
    row_e = vt.table_lines([drifted], ["torch"], [], None)[3]
    assert "| 2.000 (x86 1.000) | - | 2.00 |" in row_e  # x86 ran 2 ms in the first pair
    mean = next(line for line in lines if line.startswith("| geometric mean"))
    assert "3 of 4" in mean and "1.44" in mean and "2.00" in mean
    assert "torch: geometric-mean speedup 1.44 over 3 payloads; below 1.0: 1 (b)" in lines


def test_rows_are_saved_as_json_and_csv(scripts, tmp_path: Path) -> None:
    vt = scripts.versus_table
    rows = [_row(vt, "a", {"torch": 2.0}), vt.VsRow(payload="b", error="crashed")]
    vt.save(tmp_path / "out.json", rows, {"threads": 1})
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["meta"] == {"threads": 1}
    assert [vt.VsRow.model_validate(r) for r in data["rows"]] == rows
    vt.save(tmp_path / "out.csv", rows, {})
    with (tmp_path / "out.csv").open() as handle:
        read = list(csv.DictReader(handle))
    assert [r["payload"] for r in read] == ["a", "b"]
    assert float(read[0]["torch_speedup"]) == 2.0 and read[1]["torch_speedup"] == ""
    assert read[1]["error"] == "crashed"


def test_a_failing_child_becomes_an_error_row(scripts) -> None:
    vt = scripts.versus_table
    row = vt.row_from("p", "p.py:batch_size=1", {"verified": False, "message": "no fit"})
    assert not row.verified and row.error == "no fit" and row.peers == {}
    result = {"verified": True, "x86_s": 0.1, "gflops": 5.0,
              "peers": {"torch": {"seconds": 0.2, "speedup": 2.0}}}  # fmt: skip
    ok = vt.row_from("q", "q.py", result)
    assert ok.peers["torch"].speedup == 2.0 and ok.error == ""


def test_compile_time_table_lists_every_stage_and_iree(scripts) -> None:
    import compile_time

    results = [
        ("m1", {"seconds": 6.0, "cpu_s": 5.5, "import_s": 30.0,
                "stages": {"schedule": 2.0, "lower": 1.5, "emit": 2.5}},
         {"seconds": 9.0, "cpu_s": 12.0}),
        ("m2", {"error": "timeout after 600 s"}, {"error": "exit 1: IREE failed"}),
    ]  # fmt: skip
    lines = compile_time.stage_table(results)
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:5] == ["model", "import s", "schedule", "lower", "emit"]
    assert head[5:] == ["x86 s", "x86 CPU s", "IREE s", "IREE CPU s", "x86/IREE"]
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first == ["m1", "30.00", "2.00", "1.50", "2.50", "6.00", "5.50", "9.00", "12.00",
                     "0.67"]  # fmt: skip
    second = [c.strip() for c in lines[3].strip("|").split("|")]
    assert second[5] == "timeout after 600 s" and second[7] == "exit 1: IREE failed"
    assert second[-1] == "-"


def test_specs_of_each_mode(scripts) -> None:
    if not (ROOT / "src" / "level3").is_dir():
        pytest.skip("no ../shared/kernelbench")
    from argparse import Namespace

    vt = scripts.versus_table
    args = Namespace(folder=ROOT / "level2", models=False, scale=16, only="l2_00")
    specs, _, mode = vt.main_specs(args)
    assert [name[:6] for name, _ in specs] == ["l2_001", "l2_003", "l2_005", "l2_007", "l2_009"]
    assert "16x larger" in mode
    shipped = scripts.real_size.scaled_problem_spec(ROOT / "level2" / f"{specs[0][0]}.mlir", 1)
    assert specs[0][1].replace("batch_size=256", "batch_size=16") == shipped != specs[0][1]
    for folder in (ROOT, ROOT / "level3"):  # the kernelbench root or its level3
        args = Namespace(folder=folder, models=True, scale=1, only="ResNet")
        specs, _, mode = vt.main_specs(args)
        assert [name for name, _ in specs] == ["l3_009_ResNet18"] and "224x224" in mode


@pytest.mark.slow
def test_one_payload_against_pytorch_in_process(scripts, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    problem = tmp_path / "linear.py"
    problem.write_text(
        "import torch\n"
        "batch_size = 4\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(32, 16)\n"
        "    def forward(self, x):\n"
        "        return torch.relu(self.fc(x))\n"
        "def get_inputs():\n"
        "    return [torch.randn(batch_size, 32)]\n"
        "def get_init_inputs():\n"
        "    return []\n"
    )
    result = scripts.versus_table.measure_versus(f"{problem}:batch_size=8", ["torch"], 1, 0.05)
    row = scripts.versus_table.row_from("linear", str(problem), result)
    assert row.verified and row.x86_s > 0 and row.payload_threads == 1
    assert row.peers["torch"].seconds > 0 and row.peers["torch"].speedup > 0
    assert row.peers["torch"].error == ""
    assert row.gflops == pytest.approx(2 * 8 * 32 * 16 / row.x86_s / 1e9, rel=0.5)


def test_bad_arguments_exit_2_with_a_message(scripts, tmp_path: Path, capsys) -> None:
    from argparse import Namespace

    vt = scripts.versus_table
    for args, words in (
        (Namespace(folder=tmp_path, models=True, scale=1, only=""), "no problem files found"),
        (Namespace(folder=tmp_path, models=False, scale=0, only=""), "--scale 0"),
    ):
        with pytest.raises(SystemExit) as exited:
            vt.main_specs(args)
        assert exited.value.code == 2
        assert words in capsys.readouterr().err
