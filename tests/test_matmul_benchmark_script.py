"""benchmarks/matmul.py: the AVX2-tier emulation really forces OpenBLAS's AVX2 kernel and
compiles for the tier, while a plain run drops an inherited OPENBLAS_CORETYPE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "matmul.py"
TINY = ["--budget", "0.2", "--threads", "1", "--naive-max", "0", "--json", "matmul:m=32,n=32,k=32"]


def _run(*args: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args, *TINY],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout)


def test_emulating_x86_64_v3_forces_openblas_haswell_kernel():
    """The child measuring numpy keeps OPENBLAS_CORETYPE=Haswell (a restart that drops it
    would compare the tier's code with the host's wider BLAS kernel)."""
    report = _run("--emulate", "x86-64-v3")
    (row,) = report["rows"]
    assert row["verified"]
    assert row["host"]["openblas_coretype"] == "Haswell"
    assert row["host"]["blas"]["architecture"] == "Haswell"
    # The FMA limit is the tier's: 8-lane FMAs, the same loop the x86 graph's code runs.
    assert row["fma_peak_gflops"] > 0


def test_plain_run_drops_an_inherited_coretype_and_says_so():
    report = _run(env={"OPENBLAS_CORETYPE": "Prescott"})
    (row,) = report["rows"]
    assert row["host"]["openblas_coretype"] is None
    assert row["host"]["blas"]["architecture"] != "Prescott"
    assert "OPENBLAS_CORETYPE=Prescott" in report["note"]


def test_emulating_a_level_the_host_lacks_is_refused(monkeypatch, capsys):
    """On an AVX2 host, --emulate x86-64-v4 stops with exit 2 naming the missing features,
    before any child compiles code it could not run."""
    import importlib.util

    import stagegraph.stages.target as target_module

    avx2_host = target_module.resolve_target("x86-64-v3")
    monkeypatch.setattr(target_module, "detect_target", lambda: avx2_host)
    spec = importlib.util.spec_from_file_location("matmul_benchmark", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--emulate", "x86-64-v4", *TINY])
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    with pytest.raises(SystemExit) as stop:
        script.main()
    assert stop.value.code == 2
    assert "--emulate x86-64-v4: this host lacks avx512bw" in capsys.readouterr().err


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("matmul_benchmark", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _row(workload: str, ratio: float, verified: bool = True, threads: int = 1) -> dict:
    return {"workload": workload, "threads": threads, "verified": verified,
            "vs_numpy": ratio, "vs_numpy_low": ratio - 0.01, "vs_numpy_high": ratio + 0.01,
            "trustworthy": True}  # fmt: skip


def test_several_processes_report_the_median_row_and_every_ratio():
    """--processes: the row of the median ratio (the lower of an even count) is reported,
    with each process's ratio; rows are kept apart by workload and thread count."""
    script = _script()
    runs = [
        [_row("a", 0.96), _row("b", 1.05), _row("a", 1.5, threads=2)],
        [_row("a", 1.04), _row("b", 1.0)],
        [_row("a", 1.00)],
    ]
    merged = {(r["workload"], r["threads"]): r for r in script.median_rows(runs)}
    assert merged["a", 1]["vs_numpy"] == 1.00
    assert merged["a", 1]["vs_numpy_per_process"] == [0.96, 1.04, 1.00]
    assert merged["b", 1]["vs_numpy"] == 1.0  # lower median of two
    assert merged["a", 2]["vs_numpy_per_process"] == [1.5]
    cell = script.ratio_cell(merged["a", 1], "vs_numpy")
    assert cell == "1.00 [0.99, 1.01]; 3 processes 0.96-1.04"
    assert script.ratio_cell(merged["a", 2], "vs_numpy") == "1.50 [1.49, 1.51]"


def test_processes_that_disagree_mark_the_row_noisy():
    """Each process's interval is tight, but the processes read 1.01 to 1.36: the table
    gives a rough value and the range, and says why, instead of the median's interval."""
    script = _script()
    runs = [[_row("a", 1.01)], [_row("a", 1.36)], [_row("a", 1.34)]]
    (merged,) = script.median_rows(runs)
    assert merged["trustworthy"] is False
    assert merged["warning"] == "3 processes read 1.01-1.36 (max/min 1.35, bound 1.10)"
    assert script.ratio_cell(merged, "vs_numpy") == "~1.3 (noisy); 3 processes 1.01-1.36"
    merged |= {"x86_gflops": 100.0, "numpy_gflops": 80.0, "fma_peak_gflops": 117.0,
               "x86_of_peak": 0.85, "numpy_of_peak": 0.68, "compile_s": 0.1}  # fmt: skip
    report = script.table([merged])
    assert "| a | 1 | 100 | 80 | ~1.3 (noisy); 3 processes 1.01-1.36 |" in report
    assert "noisy: a, threads=1: 3 processes read 1.01-1.36 (max/min 1.35" in report


def test_a_row_that_failed_to_verify_in_any_process_is_reported_failed():
    script = _script()
    runs = [[_row("a", 1.0)], [_row("a", 0.0, verified=False)], [_row("a", 1.1)]]
    (merged,) = script.median_rows(runs)
    assert merged["verified"] is False


def test_processes_option_runs_fresh_children():
    report = _run("--processes", "2")
    (row,) = report["rows"]
    assert row["verified"]
    assert len(row["vs_numpy_per_process"]) == 2
    assert row["vs_numpy"] == min(row["vs_numpy_per_process"])
