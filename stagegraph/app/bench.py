"""Benchmarking spliced in at a tagged stage: verify first, then time with trustworthy stats."""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from stagegraph.app.bench_options import BenchOptions
from stagegraph.app.host import BlasInfo, HostInfo
from stagegraph.core.engine import Engine, RunResult
from stagegraph.core.graph import Graph
from stagegraph.core.ports import Module, Schema
from stagegraph.errors import StagegraphError
from stagegraph.stages.target import effective_threads, payload_threads

WRAPPER_STAGE = "bench"


class BenchReport(Schema):
    """One benchmark (the ``--json`` output; the CSV row has the same fields)."""

    graph: str
    workload: str
    splice_at: str
    verified: bool
    message: str = ""
    samples: int = 0
    median_s: float | None = None
    min_s: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    mean_s: float | None = None
    cv: float | None = None
    ci_low_s: float | None = None
    ci_high_s: float | None = None
    converged: bool | None = None
    gflops: float | None = None
    gbps: float | None = None
    compile_seconds: float = 0.0
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    #: The threads granted (``--threads``, or all usable cores) ...
    threads: int | None = None
    #: ... and those the payload ran on: what its params chose (a cost model may take fewer
    #: for a small payload), numpy's pinned BLAS count, IREE's workers (None: not known).
    payload_threads: int | None = None
    # Too-spread samples are flagged rather than quoted to four digits (None: not timed).
    trustworthy: bool | None = None
    warning: str = ""
    host: HostInfo | None = None
    #: Where the reference came from: ``npz``, ``pytorch``, ``numpy``, ``graph:NAME``.
    reference: str = ""


class Comparison(Schema):
    """Two variants measured interleaved in one run: ``ratio`` = median(a) / median(b)."""

    a: BenchReport
    b: BenchReport
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    trustworthy: bool | None = None
    warning: str = ""


def timing_fields(samples: np.ndarray, complexity: Any) -> dict[str, Any]:
    """The statistics, throughput and trust fields of a :class:`BenchReport` for ``samples``."""
    from stagegraph.runtime.stats import assess, gbps, gflops, summarize

    stats = summarize(samples)
    flops, nbytes = complexity.flops, complexity.bytes_moved
    return {
        **stats.model_dump(),
        **assess(stats).model_dump(),
        "gflops": gflops(flops, stats.median_s) if flops else None,
        "gbps": gbps(nbytes, stats.median_s) if nbytes else None,
    }


def spliced(graph: Graph, splice_at: str | None, entry: str) -> tuple[Graph, str]:
    """The graph with the benchmark wrapper after ``splice_at`` (default: the graph's choice)."""
    from stagegraph.stages.common.wrapper_stage import bench_wrapper

    tag = splice_at or graph.default_splice
    if tag is None:
        raise StagegraphError(
            f"graph {graph.name!r} declares no default splice tag; pass --splice-at "
            f"(its tags: {', '.join(sorted(graph.tags)) or 'none'})"
        )
    level = splice_level(graph, tag)
    wrapper = bench_wrapper(WRAPPER_STAGE, entry=entry, level=level)
    return graph.splice(after=tag, stage=wrapper), tag


def splice_level(graph: Graph, tag: str) -> str:
    """The IR level of the module at ``tag``, checked before anything compiles.

    Raises:
        UnknownTagError, AmbiguousTagError: ``tag`` names no single node.
        SpliceError: the wrapper cannot be built there (no module, or LLVM level).
    """
    from stagegraph.errors import SpliceError
    from stagegraph.stages.common.wrapper_stage import WRAPPABLE_LEVELS

    def level_at(node: str) -> str | None:
        found = graph.stages.get(node) or graph.inputs[node]
        levels = [
            graph.output_type(node, p.name).level
            for p in found.outputs.values()
            if issubclass(p.type, Module)
        ]
        return levels[0] if levels else None

    anchor = graph.node_for_tag(tag)
    level = level_at(anchor)
    if level in (*WRAPPABLE_LEVELS, "any"):
        return level
    usable = sorted(
        t
        for t, nodes in graph.tags.items()
        if len(nodes) == 1 and level_at(nodes[0]) in (*WRAPPABLE_LEVELS, "any")
    )
    what = f"gives Module[{level}]" if level else "gives no module"
    raise SpliceError(
        f"graph {graph.name!r}: cannot splice the benchmark wrapper at {tag!r}: stage "
        f"{anchor!r} {what}, and the wrapper is built from the entry's tensor or buffer "
        f"signature; splice at a tag before lowering to LLVM (--splice-at "
        f"{'|'.join(usable) or 'none'})"
    )


class Measurement:
    """A compiled, verified benchmark harness that can produce timing samples."""

    def __init__(self, graph: Graph, workload: Any, result: RunResult, splice_at: str):
        self.graph, self.workload, self.result, self.splice_at = graph, workload, result, splice_at
        self.binary = result.binary
        self.entry = workload.entry
        outputs = self.binary.call(self.entry, workload.inputs())
        self.verdict = workload.verify(outputs)

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        from stagegraph.stages.common.bench_harness import bench_entry_name, run_benchmark

        timed = getattr(self.binary, "benchmark", None)  # a binary that times itself (GPU)
        if timed is not None:
            return timed(self.entry, self.workload.inputs(), warmup, count)

        return run_benchmark(
            self.binary, bench_entry_name(self.entry), self.workload.inputs(), warmup, count
        )

    def report(self, samples: np.ndarray | None, threads: int | None = None) -> BenchReport:
        from stagegraph.app.host import host_info

        trace = self.result.trace
        base = {
            "graph": self.graph.name,
            "workload": self.workload.spec,
            "splice_at": self.splice_at,
            "verified": self.verdict.ok,
            "message": self.verdict.message,
            "reference": self.workload.reference_source,
            "compile_seconds": trace.compile_seconds(),
            "stage_seconds": {r.name: r.seconds for r in trace.records},
            "threads": effective_threads(threads),
            "payload_threads": payload_threads(self.result.params),
            "host": host_info(),
        }
        if samples is None or not self.verdict.ok:
            return BenchReport(**base)
        return BenchReport(**base, **timing_fields(samples, self.workload.complexity))


def prepare(engine: Engine, graph: Graph, workload: Any, splice_at: str | None) -> Measurement:
    """Splice, compile and verify; raises nothing for a wrong result (the report says so).

    Raises:
        InsufficientMemoryError: the workload's buffers cannot fit (before compiling).
    """
    from stagegraph.app.memory_budget import check_fits

    check_fits(workload)
    if splice_at is not None:  # an unknown, ambiguous or LLVM-level tag fails before compiling
        splice_level(graph, splice_at)
    bench_graph, tag = spliced(graph, splice_at, workload.entry)
    result = engine.run(bench_graph, workload)
    return Measurement(graph, workload, result, tag)


def sample(
    measure: Callable[[int], np.ndarray], options: BenchOptions, max_samples: int | None = None
) -> tuple[np.ndarray, bool]:
    """Samples until the CI of the median is within ±rel_halfwidth (or the budget is spent);
    ``max_samples`` caps them (an MPI benchmark whose calls leak communicators)."""
    from stagegraph.runtime.stats import collect_samples

    return collect_samples(
        measure,
        rel_halfwidth=options.rel_halfwidth,
        budget_s=options.budget_s,
        min_samples=max(2, options.repeat),
        max_samples=max_samples,
        min_time_s=options.min_time_s,
    )


def benchmark(
    engine: Engine,
    graph: Graph,
    workload: Any,
    splice_at: str | None = None,
    options: BenchOptions | None = None,
    threads: int | None = None,
) -> BenchReport:
    """Compile with the wrapper spliced after ``splice_at``, verify, then time."""
    options = options or BenchOptions()
    measurement = prepare(engine, graph, workload, splice_at)
    if not measurement.verdict.ok:
        return measurement.report(None, threads)
    measurement.measure(1, warmup=options.warmup)
    samples, converged = sample(measurement.measure, options)
    report = measurement.report(samples, threads)
    return report.model_copy(update={"converged": converged})


class NumpyMeasurement:
    """The workload's numpy equivalent timed from Python, for ``--vs numpy``.

    OpenBLAS runs on exactly as many threads as the compiled side (``threads``, or all
    usable cores): left alone it takes every core, so against a one-thread x86 run it both
    gets more hardware and fights the x86 code for it, and the ratio means nothing.
    """

    def __init__(self, workload: Any, threads: int | None = None):
        self.fn = workload.numpy_equivalent()
        if self.fn is None:
            raise StagegraphError(f"workload {workload.spec!r} has no numpy equivalent")
        self.workload = workload
        self.inputs = [np.asarray(x) for x in workload.inputs()]
        self.threads = effective_threads(threads)

    def pinned(self) -> Any:
        """A context in which numpy's BLAS uses ``self.threads`` threads (restored after)."""
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=self.threads, user_api="blas")

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        out = np.empty(count)
        with self.pinned():
            for _ in range(warmup):
                self.fn(*self.inputs)
            for i in range(count):
                start = time.perf_counter()
                self.fn(*self.inputs)
                out[i] = time.perf_counter() - start
        return out

    def report(self, samples: np.ndarray, threads: int | None = None) -> BenchReport:
        """The report; ``threads`` is ignored: the BLAS thread count is fixed at creation."""
        from stagegraph.app.host import host_info

        with self.pinned():  # so host.blas.num_threads is the count the samples ran on
            host = host_info()
        return BenchReport(
            graph="numpy",
            workload=self.workload.spec,
            splice_at="-",
            verified=True,
            compile_seconds=0.0,
            threads=self.threads,
            payload_threads=host.blas.num_threads if host.blas else self.threads,
            host=host,
            **timing_fields(samples, self.workload.complexity),
        )


def rewarm_calls(seconds_per_call: float, rewarm_s: float = 0.02) -> int:
    """Calls that wake the sleeping worker threads and caches after a settle pause."""
    return max(1, min(1000, math.ceil(rewarm_s / max(seconds_per_call, 1e-9))))


def compare(
    a: Measurement,
    b: Measurement | NumpyMeasurement,
    options: BenchOptions,
    threads: int | None = None,
) -> Comparison:
    """Interleave batches of ``a`` and ``b`` so machine noise hits both alike."""
    from stagegraph.runtime.stats import Trust, assess_ratio, interleaved_samples, ratio

    first_a = float(a.measure(1, warmup=options.warmup)[0])
    first_b = float(b.measure(1, warmup=options.warmup)[0])
    batch = max(1, options.repeat // 2)
    multi_threaded = effective_threads(threads) > 1
    settle = options.settle_s if multi_threaded else 0.0
    rewarm_a, rewarm_b = (rewarm_calls(first_a), rewarm_calls(first_b)) if settle else (0, 0)

    def settled(side: Any, rewarm: int) -> Callable[[int], np.ndarray]:
        def measure(count: int) -> np.ndarray:
            time.sleep(settle)
            return side.measure(count, warmup=rewarm)

        return measure

    def done(samples: list[np.ndarray], spent: float) -> bool:
        r = ratio(samples[0], samples[1], paired=True)
        tight = (r.high - r.low) / 2 <= options.rel_halfwidth * r.ratio
        enough = tight and samples[0].size >= options.repeat and spent >= options.min_time_s
        return enough or spent >= options.budget_s

    measures = (settled(a, rewarm_a), settled(b, rewarm_b))
    xa, xb = interleaved_samples(measures, batch, done)
    r = ratio(xa, xb, paired=True)
    report_a, report_b = a.report(xa, threads), b.report(xb, threads)
    sides = tuple(
        Trust(trustworthy=bool(rep.trustworthy), warning=f"{rep.graph}: {rep.warning}")
        for rep in (report_a, report_b)
    )
    trust = assess_ratio(r, sides)
    return Comparison(
        a=report_a,
        b=report_b,
        ratio=r.ratio,
        ratio_low=r.low,
        ratio_high=r.high,
        **trust.model_dump(),
    )


def rough(value: float) -> str:
    """Two significant digits, never in exponent form: how a noisy number is shown."""
    return f"{float(f'{value:.2g}'):g}" if abs(value) >= 1e-4 else f"{value:.2g}"


def append_csv(path: str | Path, report: BenchReport) -> None:
    """Append one row; write the header only when the file is new."""
    path = Path(path)
    row = report.model_dump(mode="json")
    row["stage_seconds"] = ";".join(f"{k}={v:.6f}" for k, v in report.stage_seconds.items())
    # Flat, and the same columns whether or not the report was timed (one header per file).
    host = row.pop("host") or {}
    blas = host.pop("blas", None) or {}
    row |= {f"host_{k}": host.get(k) for k in HostInfo.model_fields if k != "blas"}
    row |= {f"blas_{k}": blas.get(k) for k in BlasInfo.model_fields}
    new = not path.exists() or path.stat().st_size == 0
    try:
        with path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
    except OSError as exc:
        raise StagegraphError(f"cannot write CSV {path}: {exc.strerror or exc}") from None
