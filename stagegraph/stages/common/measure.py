"""Measurement as graph stages: check a binary against the workload, then time it.

A tuning run is the graph's own stages, run once per candidate, followed by two stages of
kind ``measure`` that :func:`measuring_graph` adds:

* ``check`` (:func:`check`) calls the entry on the workload's inputs and verifies the
  outputs against its reference;
* ``measure`` (:func:`interleaved_timer` by default) times the candidate's benchmark
  wrapper interleaved with the baseline's binary, so machine noise hits both alike.

The workload and the baseline's binary are graph inputs (``workload``, ``baseline``). A
user's measurement stage (another timer, a device, a power meter) replaces ``measure``:
any registered stage of kind ``measure`` with the same ports that returns :class:`Timing`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import Field

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Binary, Config, Facts, WorkloadRef
from stagegraph.core.stage import stage


class Verdict(Facts):
    """Whether the binary computes what the workload's reference does, and how far off."""

    ok: bool
    message: str = ""


class Timing(Facts):
    """Seconds per call of the candidate and, measured beside it, of the baseline (empty
    when the timer does not measure a baseline; the tuner then compares medians)."""

    samples: tuple[float, ...] = ()
    baseline_samples: tuple[float, ...] = ()


class Checked(NamedTuple):
    verdict: Verdict


class Measured(NamedTuple):
    timing: Timing


@stage("measure", name="common.check", cacheable=False)
def check(binary: Binary, workload: WorkloadRef) -> Checked:
    """Call the entry once on the workload's inputs and verify the outputs."""
    work = workload.workload
    outputs = binary.call(work.entry, work.inputs())
    verdict = work.verify(outputs)
    return Checked(Verdict(ok=verdict.ok, message=verdict.message))


#: Timed samples of each variant when tuning (``--samples``' default).
DEFAULT_SAMPLES = 20


class TimerConfig(Config):
    """Samples of each variant (taken in four interleaved chunks) after a warm-up."""

    samples: int = Field(DEFAULT_SAMPLES, ge=4)
    warmup: int = Field(2, ge=0)


@stage("measure", name="common.interleaved_timer", cacheable=False)
def interleaved_timer(
    binary: Binary,
    verdict: Verdict,
    workload: WorkloadRef,
    baseline: Binary,
    config: TimerConfig,
) -> Measured:
    """Time the benchmark wrappers of candidate and baseline in alternating chunks (nothing
    for a candidate that does not verify)."""
    from stagegraph.runtime.stats import interleaved_samples
    from stagegraph.stages.common.bench_harness import bench_entry_name, run_benchmark

    if not verdict.ok:
        return Measured(Timing())
    work = workload.workload
    bench, inputs = bench_entry_name(work.entry), work.inputs()
    run_benchmark(baseline, bench, inputs, config.warmup, 1)
    run_benchmark(binary, bench, inputs, config.warmup, 1)
    chunk = max(1, config.samples // 4)
    base, cand = interleaved_samples(
        (lambda count: run_benchmark(baseline, bench, inputs, 0, count),
         lambda count: run_benchmark(binary, bench, inputs, 0, count)),
        chunk,
        lambda samples, _spent: samples[0].size >= 4 * chunk,  # four rounds
    )  # fmt: skip
    return Measured(Timing(samples=tuple(cand.tolist()), baseline_samples=tuple(base.tolist())))


#: Names of the nodes :func:`measuring_graph` adds.
CHECK, MEASURE, WORKLOAD_INPUT, BASELINE_INPUT = "check", "measure", "workload", "baseline"


def measuring_graph(graph: Graph, timer: Any = None, samples: int | None = None) -> Graph:
    """``graph`` (already spliced with the benchmark wrapper) followed by ``check`` and
    ``measure`` (``timer``: a stage factory of kind measure, default the interleaved timer;
    ``samples`` sets its config's ``samples`` when it has one).

    Raises:
        PortTypeError: the timer's ports do not fit (named by the graph check).
    """
    emit = next(
        (n for n in reversed(graph.order()) if n in graph.stages
         and any(issubclass(p.type, Binary) for p in graph.stages[n].outputs.values())),
        None,
    )  # fmt: skip
    if emit is None:
        from stagegraph.errors import StagegraphError

        raise StagegraphError(f"graph {graph.name!r} emits no binary: nothing to measure")
    port = next(p.name for p in graph.stages[emit].outputs.values() if issubclass(p.type, Binary))
    factory = timer or interleaved_timer
    takes_samples = samples is not None and "samples" in factory.config_model.model_fields
    timer_stage = factory(MEASURE, **({"samples": samples} if takes_samples else {}))
    edges = [
        f"{emit}.{port} -> {CHECK}.binary",
        f"{WORKLOAD_INPUT}.value -> {CHECK}.workload",
    ]
    wanted = set(timer_stage.inputs)
    feeds = {
        "binary": f"{emit}.{port}",
        "verdict": f"{CHECK}.verdict",
        "workload": f"{WORKLOAD_INPUT}.value",
        "baseline": f"{BASELINE_INPUT}.value",
    }
    edges += [f"{src} -> {MEASURE}.{name}" for name, src in feeds.items() if name in wanted]
    inputs = [GraphInput(WORKLOAD_INPUT, WorkloadRef)]
    if "baseline" in wanted:
        inputs.append(GraphInput(BASELINE_INPUT, Binary))
    return graph.extend([check(CHECK), timer_stage], edges, inputs)
