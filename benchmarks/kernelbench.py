"""Run every .mlir payload of a folder through the x86 and naive graphs and compare.

Each compile+verify+measure runs in an isolated child process with a time and memory limit,
so a payload that crashes or hangs is reported, not fatal. The table names the CPU, the ISA
tier and OpenBLAS's core type, and marks a speedup whose samples were too spread to trust; if
``OPENBLAS_CORETYPE`` or ``OPENBLAS_L2_SIZE`` is set, the script restarts without them (the
reference runs numpy) and says so. Usage:

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
    trustworthy: bool | None = None  # both medians precise enough to quote
    warning: str = ""
    error: str = ""


def measure(graph_name: str, path: str, budget_s: float) -> dict:
    """Compile, verify and time one payload through one graph (runs in the child)."""
    from stagegraph.app.bench import BenchOptions, benchmark
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.stages.analysis import analyze

    session = Session(SessionRequest(graph=graph_name, workload=path))
    workload, engine = session.workload, session.engine
    classes = sorted(analyze(workload.payload(engine.context)).classes)
    report = benchmark(engine, session.graph, workload, None,
                       BenchOptions(warmup=1, repeat=5, budget_s=budget_s))  # fmt: skip
    return {"classes": classes, "verified": report.verified, "median_s": report.median_s,
            "message": report.message, "trustworthy": report.trustworthy,
            "warning": report.warning,
            "host": report.host.model_dump(mode="json") if report.host else None}  # fmt: skip


def run_one(path: Path, limits: Limits, budget_s: float) -> tuple[Row, dict | None]:
    """The payload's row, and the host the x86 side ran on (``None`` if it never ran)."""
    row = Row(payload=path.stem)
    results = {}
    for graph in ("x86", "naive"):
        try:
            results[graph] = limits.run(measure, graph, str(path), budget_s, label=graph)
        except StagegraphError as exc:
            first = str(exc).splitlines()[0]
            host = results["x86"]["host"] if results else None
            return row.model_copy(update={"error": f"{graph}: {first}"}), host
    x86, naive = results["x86"], results["naive"]
    speedup = None
    if x86["median_s"] and naive["median_s"]:
        speedup = naive["median_s"] / x86["median_s"]
    noisy = [f"{g}: {r['warning']}" for g, r in results.items() if r["trustworthy"] is False]
    timed = x86["trustworthy"] is not None and naive["trustworthy"] is not None
    return row.model_copy(update={
        "classes": x86["classes"], "verified": bool(x86["verified"]),
        "x86_s": x86["median_s"], "naive_s": naive["median_s"], "speedup": speedup,
        "trustworthy": not noisy if timed else None, "warning": "; ".join(noisy),
        "error": "" if x86["verified"] else x86["message"],
    }), x86["host"]  # fmt: skip


def header(host: dict | None, note: str | None) -> list[str]:
    """What the timings depend on: CPU, ISA tier, OpenBLAS (and a removed override)."""
    from stagegraph.app.host import HostInfo, describe

    lines = [describe(HostInfo.model_validate(host)) if host else "host: not measured"]
    return lines + ([note] if note else [])


def main() -> int:
    from stagegraph.app.host import reexec_without_openblas_overrides

    note = reexec_without_openblas_overrides()  # before any child process starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget per graph (s)")
    args = parser.parse_args()
    limits = Limits(timeout_s=args.timeout, memory_bytes=16 * 2**30)
    rows, host = [], None
    for path in sorted(args.folder.glob("*.mlir")):
        row, row_host = run_one(path, limits, args.budget)
        rows.append(row)
        host = host or row_host
        if not args.json:
            print(f"... {path.stem}", file=sys.stderr)
    verified = [r for r in rows if r.verified]
    speedups = [r.speedup for r in verified if r.speedup]
    geomean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
    noisy = [r for r in verified if r.trustworthy is False]
    summary = {"verified": len(verified), "total": len(rows), "geomean_speedup": geomean,
               "noisy": len(noisy), "host": host, "note": note}  # fmt: skip
    if args.json:
        print(json.dumps({"rows": [r.model_dump() for r in rows], "summary": summary}, indent=1))
        return 0
    for line in header(host, note):
        print(f"{line}  ")
    print()
    print("| payload | op classes | verified | x86 ms | naive ms | speedup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ms = lambda s: f"{s * 1e3:.3f}" if s else "-"  # noqa: E731
        sp = f"{r.speedup:.1f}x" if r.speedup else "-"
        if r.speedup and r.trustworthy is False:  # no precise-looking number for noise
            sp = f"~{r.speedup:.0f}x (noisy)"
        status = "yes" if r.verified else f"no ({r.error[:60]})"
        print(f"| {r.payload} | {', '.join(r.classes)} | {status} | {ms(r.x86_s)} | "
              f"{ms(r.naive_s)} | {sp} |")  # fmt: skip
    gm = f"{geomean:.2f}" if geomean else "-"
    print(f"\n{len(verified)} verified of {len(rows)}, geometric-mean speedup {gm}")
    if noisy:
        print(f"{len(noisy)} speedups marked noisy (samples too spread to trust):")
        for r in noisy:
            print(f"  {r.payload}: {r.warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
