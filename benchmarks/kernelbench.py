"""Run every .mlir payload of a folder through the x86 and naive graphs and compare.

Each compile+verify+measure runs in an isolated child process with a time and memory limit,
so a payload that crashes or hangs is reported, not fatal. Usage:

    python benchmarks/kernelbench.py ../shared/kernelbench/level1 [--json] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from pydantic import Field

from stagegraph.app.isolate import Limits
from stagegraph.core.ports import Schema
from stagegraph.errors import StagegraphError


class Row(Schema):
    payload: str
    classes: list[str] = Field(default_factory=list)
    verified: bool = False
    x86_s: float | None = None
    naive_s: float | None = None
    speedup: float | None = None
    error: str = ""


def measure(graph_name: str, path: str, budget_s: float) -> dict:
    """Compile, verify and time one payload through one graph (runs in the child)."""
    from stagegraph.app.bench import BenchOptions, benchmark
    from stagegraph.app.run import install_reference_runner
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.stages.analysis import analyze
    from stagegraph.workload import parse_workload

    install_reference_runner()
    workload = parse_workload(path)
    engine = Engine()
    classes = sorted(analyze(workload.payload(engine.context)).classes)
    report = benchmark(engine, load_graph(graph_name), workload, None,
                       BenchOptions(warmup=1, repeat=5, budget_s=budget_s))  # fmt: skip
    return {"classes": classes, "verified": report.verified, "median_s": report.median_s,
            "message": report.message}  # fmt: skip


def run_one(path: Path, limits: Limits, budget_s: float) -> Row:
    row = Row(payload=path.stem)
    results = {}
    for graph in ("x86", "naive"):
        try:
            results[graph] = limits.run(measure, graph, str(path), budget_s, label=graph)
        except StagegraphError as exc:
            first = str(exc).splitlines()[0]
            return row.model_copy(update={"error": f"{graph}: {first}"})
    x86, naive = results["x86"], results["naive"]
    speedup = None
    if x86["median_s"] and naive["median_s"]:
        speedup = naive["median_s"] / x86["median_s"]
    return row.model_copy(update={
        "classes": x86["classes"], "verified": bool(x86["verified"]),
        "x86_s": x86["median_s"], "naive_s": naive["median_s"], "speedup": speedup,
        "error": "" if x86["verified"] else x86["message"],
    })  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget per graph (s)")
    args = parser.parse_args()
    limits = Limits(timeout_s=args.timeout, memory_bytes=16 * 2**30)
    rows = []
    for path in sorted(args.folder.glob("*.mlir")):
        rows.append(run_one(path, limits, args.budget))
        if not args.json:
            print(f"... {path.stem}", file=sys.stderr)
    verified = [r for r in rows if r.verified]
    speedups = [r.speedup for r in verified if r.speedup]
    geomean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
    summary = {"verified": len(verified), "total": len(rows), "geomean_speedup": geomean}
    if args.json:
        print(json.dumps({"rows": [r.model_dump() for r in rows], "summary": summary}, indent=1))
        return 0
    print("| payload | op classes | verified | x86 ms | naive ms | speedup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ms = lambda s: f"{s * 1e3:.3f}" if s else "-"  # noqa: E731
        sp = f"{r.speedup:.1f}x" if r.speedup else "-"
        status = "yes" if r.verified else f"no ({r.error[:60]})"
        print(f"| {r.payload} | {', '.join(r.classes)} | {status} | {ms(r.x86_s)} | "
              f"{ms(r.naive_s)} | {sp} |")  # fmt: skip
    gm = f"{geomean:.2f}" if geomean else "-"
    print(f"\n{len(verified)} verified of {len(rows)}, geometric-mean speedup {gm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
