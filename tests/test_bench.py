"""Benchmarking: wrapper spliced at any tag, verified before timing, built from the signature
at the splice point. Timing values are never asserted, only their presence and sanity."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from stagegraph.app.bench import BenchOptions, benchmark
from stagegraph.cli.main import main
from stagegraph.core.engine import Engine
from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module, TensorModule
from stagegraph.core.stage import stage
from stagegraph.errors import AmbiguousTagError, StageFailed
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify
from stagegraph.workload import Complexity, TensorSpec, Verdict, Workload

FIELDS = {
    "graph",
    "workload",
    "splice_at",
    "verified",
    "samples",
    "median_s",
    "min_s",
    "p10_s",
    "p90_s",
    "cv",
    "ci_low_s",
    "ci_high_s",
    "gflops",
    "compile_seconds",
}


def bench_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["bench", *args, "--json", "--repeat", "4", "--budget", "0.5"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


@pytest.mark.parametrize("tag", ["input", "bufferized"])
def test_bench_at_tag_is_verified_with_all_fields(capsys, tag):
    code, report = bench_json(capsys, "naive", "matmul:m=16,n=16,k=16", "--splice-at", tag)
    assert code == 0
    assert set(report) >= FIELDS
    assert report["verified"] is True and report["splice_at"] == tag
    assert report["samples"] >= 4
    assert report["min_s"] > 0 and report["min_s"] <= report["median_s"] <= report["p90_s"]
    assert report["ci_low_s"] <= report["median_s"] <= report["ci_high_s"]
    assert report["gflops"] > 0 and report["compile_seconds"] > 0


def test_default_splice_is_the_graphs_choice(capsys):
    code, report = bench_json(capsys, "naive", "matmul:m=8,n=8,k=8")
    assert code == 0 and report["splice_at"] == "bufferized"


def test_unknown_tag_lists_tags(capsys):
    code = main(["bench", "naive", "matmul:m=8,n=8,k=8", "--splice-at", "bufferised"])
    err = capsys.readouterr().err
    assert code == 2
    assert "did you mean 'bufferized'" in err and "its tags: bufferized, input" in err


def test_tag_on_several_stages_is_an_error():
    graph = Graph(
        "twice",
        [verify("a", tags={"x"}), verify("b", tags={"x"})],
        ["payload -> a.module", "a.module -> b.module"],
        [GraphInput("payload", Module["tensor"])],
    )
    with pytest.raises(AmbiguousTagError, match="tag 'x' is on several stages"):
        benchmark(Engine(), graph, None, splice_at="x")


def test_csv_appends_rows_with_one_header(capsys, tmp_path):
    path = tmp_path / "runs.csv"
    for _ in range(2):
        assert (
            main(
                [
                    "bench",
                    "naive",
                    "matmul:m=8,n=8,k=8",
                    "--repeat",
                    "3",
                    "--budget",
                    "0.2",
                    "--csv",
                    str(path),
                ]
            )
            == 0
        )
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 2 and rows[0]["verified"] == "True"
    assert path.read_text().count("median_s") == 1


def test_vs_numpy_reports_ratio(capsys):
    code = main(
        [
            "bench",
            "naive",
            "matmul:m=16,n=16,k=16",
            "--vs",
            "numpy",
            "--json",
            "--repeat",
            "4",
            "--budget",
            "0.3",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["a"]["graph"] == "naive" and report["b"]["graph"] == "numpy"
    assert report["ratio_low"] <= report["ratio"] <= report["ratio_high"]


class FakeMeasurement:
    """Records each batch's warm-up count and when it started; every sample takes 1 ms."""

    def __init__(self, log: list):
        self.log = log

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        import time

        self.log.append((self, warmup, time.perf_counter()))
        return np.full(count, 1e-3)

    def report(self, samples, threads=None):
        from stagegraph.app.bench import BenchReport

        return BenchReport(graph="fake", workload="w", splice_at="-", verified=True,
                           samples=samples.size)  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
def test_compare_settles_and_rewarms_only_when_multithreaded(threads):
    from stagegraph.app.bench import BenchOptions, compare

    log: list = []
    a, b = FakeMeasurement(log), FakeMeasurement(log)
    options = BenchOptions(repeat=4, budget_s=0.0, settle_s=0.05)
    result = compare(a, b, options, threads)
    assert result.ratio == pytest.approx(1.0)
    (_, _, a_start), (_, _, b_start) = log[2], log[3]  # the first timed batches
    warmups = [w for _, w, _ in log[2:]]
    if threads == 1:
        assert warmups == [0, 0] and b_start - a_start < 0.05
    else:  # 20 ms of 1 ms calls wake the other runtime's sleeping workers again
        assert warmups == [20, 20] and b_start - a_start >= 0.05


def test_rewarm_calls_cover_twenty_milliseconds_within_bounds():
    from stagegraph.app.bench import rewarm_calls

    assert rewarm_calls(1e-3) == 20
    assert rewarm_calls(2.0) == 1
    assert rewarm_calls(0.0) == 1000


# -- the wrapper follows the signature at the splice point --------------------------------

GLOBAL = """
func.func @main(%a: tensor<8x4xf32>, %b: tensor<4x4xf32>) -> tensor<8x4xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %r = linalg.matmul ins(%a, %b : tensor<8x4xf32>, tensor<4x4xf32>)
                     outs(%f : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}
"""
LOCAL = GLOBAL.replace("8x4", "4x4")


@stage("schedule", name="test.halve_rows")
def halve_rows(module: TensorModule) -> TensorModule:
    """Like partitioning on 2 ranks: @main now works on half of the rows of A."""
    from stagegraph.mlir.bindings import ir

    local = ir.Module.parse(LOCAL, module.ir.context)
    old = next(
        op
        for op in module.ir.body.operations
        if "sym_name" in op.attributes and op.attributes["sym_name"].value == "main"
    )
    new = local.body.operations[0].clone(ir.InsertionPoint(old))
    del new
    old.erase()
    if not module.ir.operation.verify():
        raise ValueError("module does not verify after partitioning")
    return module


class LocalMatmul(Workload):
    """The per-rank part of an 8x4 @ 4x4 matmul split in two row blocks."""

    name = "test-local-matmul"

    def payload(self, context=None):
        from stagegraph.mlir.bindings import ir

        return ir.Module.parse(GLOBAL, context)

    def input_specs(self):
        return [TensorSpec(shape=(4, 4), dtype="f32"), TensorSpec(shape=(4, 4), dtype="f32")]

    def output_specs(self):
        return [TensorSpec(shape=(4, 4), dtype="f32")]

    def _compute_reference(self):
        a, b = self.inputs()
        return [a.astype(np.float64) @ b.astype(np.float64)]

    @property
    def complexity(self) -> Complexity:
        return Complexity(flops=2 * 4 * 4 * 4, bytes_moved=3 * 64)


def partitioned_graph() -> Graph:
    return Graph(
        "halved",
        [
            verify("load"),
            halve_rows("partition", tags={"partitioned"}),
            bufferize(),
            linalg_to_loops("loops"),
            lower_to_llvm("lower"),
            jit("emit"),
        ],
        [
            "payload -> load.module",
            "load.module -> partition.module",
            "partition.module -> bufferize.module",
            "bufferize.module -> loops.module",
            "loops.module -> lower.module",
            "lower.module -> emit.module",
        ],
        [GraphInput("payload", Module["tensor"], frozenset({"input"}))],
        default_splice="partitioned",
    )


def test_wrapper_uses_signature_after_partitioning():
    report = benchmark(Engine(), partitioned_graph(), LocalMatmul(), splice_at="partitioned",
                       options=BenchOptions(repeat=3, budget_s=0.2))  # fmt: skip
    assert report.verified is True and report.samples >= 3


def test_wrapper_before_signature_change_fails_clearly():
    with pytest.raises(StageFailed) as info:
        benchmark(Engine(), partitioned_graph(), LocalMatmul(), splice_at="input",
                  options=BenchOptions(repeat=3))  # fmt: skip
    assert info.value.stage == "partition"
    assert "Verification failed" in str(info.value)
    assert any("'func.call'" in d and "@main" in d for d in info.value.diagnostics)


def test_wrong_result_is_reported_not_timed(monkeypatch):
    monkeypatch.setattr(
        LocalMatmul,
        "verify",
        lambda self, outs: Verdict(
            ok=False, max_abs_error=1.0, max_rel_error=1.0, tolerance=0.0, message="wrong"
        ),
    )
    report = benchmark(Engine(), partitioned_graph(), LocalMatmul(), options=BenchOptions(repeat=3))
    assert report.verified is False and report.median_s is None and report.samples == 0


# -- honest comparisons: pinned BLAS threads, host facts, flagged noise -------------------


def blas_threads_now() -> int | None:
    from threadpoolctl import threadpool_info

    return next((i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"), None)


@pytest.fixture
def record_blas_threads(monkeypatch):
    """Make matmul's numpy equivalent record numpy's BLAS thread count at every call."""
    from stagegraph.workloads.matmul import Matmul

    seen: list[int | None] = []

    def numpy_equivalent(self):
        def recorded(a, b):
            seen.append(blas_threads_now())
            return [a @ b]

        return recorded

    monkeypatch.setattr(Matmul, "numpy_equivalent", numpy_equivalent)
    return seen


@pytest.mark.parametrize("threads", [1, 2])
def test_vs_numpy_runs_openblas_on_the_x86_thread_count(capsys, record_blas_threads, threads):
    before = blas_threads_now()
    code = main(["bench", "x86", "matmul:m=32,n=32,k=32", "--vs", "numpy", "--json",
                 "--threads", str(threads), "--repeat", "4", "--budget", "0.2"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert record_blas_threads and set(record_blas_threads) == {threads}
    assert report["b"]["threads"] == threads
    assert report["b"]["host"]["blas"]["num_threads"] == threads
    assert blas_threads_now() == before  # the limit is lifted after the measurement


def test_numpy_without_threads_uses_all_usable_cores(monkeypatch, record_blas_threads):
    from stagegraph.app.bench import NumpyMeasurement
    from stagegraph.workload import parse_workload

    monkeypatch.setattr("stagegraph.stages.target.usable_cores", lambda *a: 1)
    numpy_side = NumpyMeasurement(parse_workload("matmul:m=8,n=8,k=8"))
    numpy_side.measure(2, warmup=1)
    assert numpy_side.threads == 1 and record_blas_threads == [1, 1, 1]


HOST_FIELDS = {"cpu_model", "target", "blas", "openblas_coretype", "openblas_l2_size"}


def test_json_records_cpu_target_and_openblas(capsys):
    code, report = bench_json(capsys, "naive", "matmul:m=8,n=8,k=8")
    assert code == 0
    host = report["host"]
    assert set(host) == HOST_FIELDS
    assert host["cpu_model"] and host["target"]
    assert host["blas"]["internal_api"] == "openblas" and host["blas"]["architecture"]
    assert report["trustworthy"] in (True, False) and isinstance(report["warning"], str)


def test_csv_flattens_host_columns(capsys, tmp_path):
    path = tmp_path / "runs.csv"
    assert main(["bench", "naive", "matmul:m=8,n=8,k=8", "--repeat", "3", "--budget", "0.1",
                 "--csv", str(path)]) == 0  # fmt: skip
    (row,) = csv.DictReader(path.open())
    assert row["host_target"] and row["host_cpu_model"] and row["blas_internal_api"]
    assert "host" not in row and row["trustworthy"] in ("True", "False")


class SpreadMeasurement(FakeMeasurement):
    """Alternates fast and 3x slower calls, like threads fighting for cores; real reports."""

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        super().measure(count, warmup)
        return np.resize([1e-3, 3e-3], count)

    def report(self, samples, threads=None):
        from stagegraph.app.bench import BenchReport, timing_fields
        from stagegraph.workload import Complexity

        timing = timing_fields(samples, Complexity(flops=1e6, bytes_moved=0))
        return BenchReport(graph="spread", workload="w", splice_at="-", verified=True, **timing)


class SteadyMeasurement(SpreadMeasurement):
    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        FakeMeasurement.measure(self, count, warmup)
        return np.full(count, 1e-3) * (1 + 0.001 * (np.arange(count) % 3))


def test_spread_samples_flag_report_and_ratio():
    from stagegraph.app.bench import BenchOptions, compare

    log: list = []
    options = BenchOptions(repeat=16, budget_s=0.0, settle_s=0.0)  # one batch of 8 each
    noisy = compare(SpreadMeasurement(log), SteadyMeasurement(log), options, 1)
    assert noisy.a.trustworthy is False and "p90/p10" in noisy.a.warning
    assert noisy.b.trustworthy is True and noisy.b.warning == ""
    assert noisy.trustworthy is False and noisy.warning
    steady = compare(SteadyMeasurement(log), SteadyMeasurement(log), options, 1)
    assert steady.trustworthy is True and steady.warning == ""


def test_text_output_warns_instead_of_a_precise_number(capsys):
    from stagegraph.app.bench import BenchReport
    from stagegraph.cli.output import print_bench_report as _print_report
    from stagegraph.cli.output import print_ratio as _print_ratio
    from stagegraph.runtime.stats import summarize

    stats = summarize(np.resize([1e-3, 3e-3], 20))
    report = BenchReport(graph="g", workload="w", splice_at="t", verified=True,
                         **stats.model_dump(), trustworthy=False,
                         warning="p90/p10 of the samples is 3.00 (bound 1.50)")  # fmt: skip
    _print_report(report)
    out = capsys.readouterr().out
    assert "NOT TRUSTWORTHY" in out and "warning: p90/p10" in out
    assert f"{stats.median_s * 1e3:.4f}" not in out  # no four-digit median

    from stagegraph.app.bench import Comparison

    result = Comparison(a=report, b=report, ratio=0.05, ratio_low=0.04, ratio_high=0.3,
                        trustworthy=False, warning="interval of the ratio is ±260%")  # fmt: skip
    _print_ratio(result)
    out = capsys.readouterr().out
    assert "NOT TRUSTWORTHY" in out and "speedup" not in out


def test_reports_state_the_threads_the_payload_ran_on():
    """The granted count and the count the payload ran on: a cost model takes one thread for
    a payload too small to split, whatever it was granted; numpy's side states its BLAS."""
    import stagegraph as sg

    small = "matmul:m=8,n=8,k=8"
    report = sg.run("x86", small, threads=2)
    assert report.threads == 2 and report.payload_threads == 1 == report.params["threads"]
    assert sg.run("x86", small, threads=2, param={"threads": 2}).payload_threads == 2
    assert sg.run("naive", small).payload_threads is None  # no params that say
    comparison = sg.bench("x86", small, vs="numpy", threads=1, warmup=0, repeat=2, budget=0.05)
    assert comparison.a.payload_threads == 1 and comparison.b.payload_threads == 1
