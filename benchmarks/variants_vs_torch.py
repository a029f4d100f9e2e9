"""Two builds of the x86 graph (``before``: cost-model params and stage configs given on the
command line; ``after``: the defaults) against PyTorch eager, one process, interleaved, by
thread CPU time, one thread.

Each payload (a shipped KernelBench ``levelN/*.mlir``) runs from its problem file at the
payload's ``scaled_constants`` (``--scale N``: the batch N times larger, the rule of
``benchmarks/real_size.py``), so PyTorch runs the same module; both x86 builds and
PyTorch must verify. Per round each side runs ``--calls`` times (or more: at least 5 ms),
``time.thread_time`` around those calls (the compiled code and PyTorch at one thread run
in this thread; thread CPU time is what a loaded machine disturbs least), in an order that
rotates between rounds. Per payload the table gives each side's median, its share of the
FMA peak (``--peak``, or ``stagegraph.app.fma_peak``: the best of a reading before and
after), and the medians of the per-round ratios with their 10th-90th percentiles:
``before/after`` (above 1: the change is faster) and ``torch/after`` (above 1: x86 is
faster than PyTorch). Usage:

    python benchmarks/variants_vs_torch.py ../shared/kernelbench/level1/l1_080_*.mlir
        [--scale 16] [--rounds 10] [--calls 3] [--target x86-64-v3]
        [--before param:conv_nhwc_width_tile=4] [--before normalize:gather_patches=false]
    python benchmarks/variants_vs_torch.py \
        ../shared/kernelbench/src/level3/l3_019_MobileNetV1.py:batch_size=1
    python benchmarks/variants_vs_torch.py 'MODEL.py:n=16,cin=8,cout=64'

(a PyTorch problem file, with ``:KEY=VALUE,...`` overrides, runs at those sizes; ``--scale``
is then ignored).

``--before param:KEY=VALUE`` overrides a field of the cost model's params (``--param``),
``--before STAGE:KEY=VALUE`` a field of that stage's config (``Graph.with_config``),
``--before env:NAME=VALUE`` sets an environment variable while the before build compiles
(a switch a change under test reads);
without any, both builds are the same (a check of the harness's noise).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def parse_before(items: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(cost-model params, stage -> config fields) of ``--before`` items (``env:`` items
    under the stage name ``env``, as strings)."""
    from stagegraph.app.session import parse_assignments

    params: dict[str, Any] = {}
    stages: dict[str, dict[str, Any]] = {}
    for item in items:
        stage, _, assignment = item.partition(":")
        if stage == "env":
            name, _, value = assignment.partition("=")
            stages.setdefault("env", {})[name] = value
            continue
        values = parse_assignments([assignment])
        if stage == "param":
            params.update(values)
        else:
            stages.setdefault(stage, {}).update(values)
    return params, stages


def build(spec: str, args: argparse.Namespace, params: dict, stages: dict) -> Any:
    """The x86 graph's measurement of ``spec`` with ``params`` and stage ``stages``."""
    from stagegraph.app.bench import prepare
    from stagegraph.app.session import Session, SessionRequest

    request = SessionRequest(
        graph="x86", workload=spec, threads=1, target=args.target, params=params
    )
    session = Session(request)
    graph = session.graph
    environment = stages.get("env", {})
    for stage, fields in stages.items():
        if stage != "env":
            graph = graph.with_config(stage, **fields)
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)  # while this build compiles
    try:
        return session, prepare(session.engine, graph, session.workload, None)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cpu_time(measurement: Any, calls: int) -> float:
    """Thread CPU time per call of ``calls`` calls of a prepared measurement, made in one
    go (so the harness's per-measurement overhead is spread over them)."""
    start = time.thread_time()
    measurement.measure(calls)
    return (time.thread_time() - start) / calls


def calls_per_round(sides: dict[str, Any], least: int, block_s: float = 0.005) -> int:
    """At least ``least`` calls, and enough that the slowest side's block of calls takes
    ``block_s`` of CPU time (a 25 us kernel timed call by call measures the harness)."""
    slowest = max(cpu_time(side, 2) for side in sides.values())
    return max(least, math.ceil(block_s / max(slowest, 1e-7)))


def measure(payload: Path, args: argparse.Namespace, spec: str | None = None) -> dict:
    """Both builds and PyTorch on ``payload`` (or on the problem ``spec``, a
    ``FILE.py:name=value,...`` of a script's own), verified, timed in interleaved rounds."""
    from real_size import scaled_problem_spec

    from stagegraph.app.torch_peer import TorchMeasurement

    # a problem file with its overrides (``FILE.py:batch_size=1``) runs as it is
    is_problem = payload.name.partition(":")[0].endswith(".py")
    spec = spec or (str(payload) if is_problem else scaled_problem_spec(payload, args.scale))
    if spec is None:
        return {"error": "no problem file"}
    params, stages = parse_before(args.before)
    session, after = build(spec, args, {}, {})
    _, before = build(spec, args, params, stages)
    sides = {"before": before, "after": after}
    for name, side in sides.items():
        if not side.verdict.ok:
            return {"error": f"{name}: {side.verdict.message}"}
    torch = TorchMeasurement(session.workload, 1)
    if not torch.verdict.ok:
        return {"error": f"torch: {torch.verdict.message}"}
    sides["torch"] = torch
    calls = calls_per_round(sides, args.calls)  # (also the warm-up)
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for number in range(args.rounds):
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            rounds[name].append(cpu_time(sides[name], calls))
    times = {name: np.array(values) for name, values in rounds.items()}
    row: dict[str, Any] = {"flops": session.workload.complexity.flops}
    for name, values in times.items():
        row[f"{name}_ms"] = float(np.median(values)) * 1e3
    for label, num, den in (("before/after", "before", "after"), ("torch/after", "torch", "after")):
        ratios = times[num] / times[den]
        row[label] = tuple(float(np.percentile(ratios, q)) for q in (50, 10, 90))
    return row


def _label(payload: Path) -> str:
    """A row's name: a KernelBench payload's number (``l2_067``), a PyTorch workload's
    size overrides (``k=v,...``) or file stem."""
    if ".py" in str(payload):
        return str(payload).partition(".py:")[2] or payload.stem
    return payload.stem[:6]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("payloads", nargs="+", type=Path)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument(
        "--peak", type=float, help="FMA peak GFLOP/s (default: read here, best of two)"
    )
    parser.add_argument(
        "--before", action="append", default=[], metavar="param:KEY=VALUE|STAGE:KEY=VALUE",
        help="what the before build overrides (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()

    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.app.host import describe, host_info
    from stagegraph.stages.target import resolve_target

    target = resolve_target(args.target) if args.target else None
    peak = args.peak or fma_peak_gflops(1, target)
    rows = [(_label(p), measure(p, args)) for p in args.payloads]
    peak = args.peak or max(peak, fma_peak_gflops(1, target))
    print(f"{describe(host_info())}; 1 thread; scale {args.scale}; thread CPU time; "
          f"FMA peak {peak:.1f} GFLOP/s; before: {' '.join(args.before) or '(same)'}; "
          f"shared machine: under load\n")  # fmt: skip
    print("| payload | before ms (peak) | after ms (peak) | torch ms (peak) "
          "| before/after [p10, p90] | torch/after [p10, p90] |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, row in rows:
        if "error" in row:
            print(f"| {name} | error: {row['error'][:160]} | | | | |")
            continue
        cells = []
        for side in ("before", "after", "torch"):
            ms = row[f"{side}_ms"]
            cells.append(f"{ms:.3f} ({row['flops'] / (ms * 1e-3) / 1e9 / peak:.0%})")
        for label in ("before/after", "torch/after"):
            mid, low, high = row[label]
            cells.append(f"{mid:.2f} [{low:.2f}, {high:.2f}]")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
