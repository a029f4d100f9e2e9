"""Run every .mlir payload of a folder through the x86 and naive graphs and IREE, and compare.

Each compile+verify+measure runs in an isolated child process with a time and memory limit,
so a payload that crashes or hangs is reported, not fatal. IREE (``pip install
'stagegraph[peers]'``) compiles and runs each payload in its own child too (its invocation
overhead subtracted, as in ``bench --vs iree``); without the extra its columns say so. The
table names the CPU, the ISA tier and OpenBLAS's core type, and marks a speedup whose
samples were too spread to trust; if ``OPENBLAS_CORETYPE`` or ``OPENBLAS_L2_SIZE`` is set,
the script restarts without them (the reference runs numpy) and says so. A last row gives
the geometric means (times over the payloads both x86 and IREE verify). Usage:

    python benchmarks/kernelbench.py ../shared/kernelbench/level1 [--json] [--timeout S]
    python benchmarks/kernelbench.py ../shared/kernelbench/level3 --no-naive --threads 1
    python benchmarks/kernelbench.py ../shared/kernelbench/level2 --torch --threads 1

``--torch`` adds PyTorch eager and ``torch.compile`` (inductor) columns for the payloads whose
problem file lies in ``../src/levelN`` (run at the payload's ``scaled_constants``, verified
against eager PyTorch, threads pinned like ``bench --vs torch``).

The real-size tables (``benchmarks/versus_table.py``) run the problem files instead, each
side timed interleaved with x86 as ``bench --vs`` does, one child per payload, every row
saved to ``--save`` as it finishes:

    python benchmarks/kernelbench.py ../shared/kernelbench/level2 --vs torch --scale 16
    python benchmarks/kernelbench.py ../shared/kernelbench --models --vs torch iree --threads 1

``--scale N`` multiplies each level-2 problem's batch (every input N times larger);
``--models`` takes the dev level-3 models at batch 1 with 224x224 images.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from pydantic import Field

from stagegraph.app.child_process import Limits
from stagegraph.core.ports import Schema
from stagegraph.errors import StagegraphError


class Row(Schema):
    payload: str
    classes: list[str] = Field(default_factory=list)
    verified: bool = False
    x86_s: float | None = None
    naive_s: float | None = None
    speedup: float | None = None
    iree_s: float | None = None
    iree_verified: bool | None = None  # None: IREE did not run (missing, crashed, rejected)
    x86_vs_iree: float | None = None  # x86 time / IREE time: below 1, x86 is faster
    iree_error: str = ""
    trustworthy: bool | None = None  # both medians precise enough to quote
    torch_s: float | None = None  # PyTorch eager on the problem file (--torch)
    torch_compile_s: float | None = None  # torch.compile (inductor)
    torch_error: str = ""
    warning: str = ""
    error: str = ""


def measure(graph_name: str, path: str, budget_s: float, threads: int | None = None) -> dict:
    """Compile, verify and time one payload through one graph (runs in the child)."""
    from stagegraph.app.bench import BenchOptions, benchmark
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.stages.analysis import analyze

    session = Session(SessionRequest(graph=graph_name, workload=path, threads=threads))
    workload, engine = session.workload, session.engine
    classes = sorted(analyze(workload.payload(engine.context)).classes)
    report = benchmark(engine, session.graph, workload, None,
                       BenchOptions(warmup=1, repeat=5, budget_s=budget_s))  # fmt: skip
    return {"classes": classes, "verified": report.verified, "median_s": report.median_s,
            "message": report.message, "trustworthy": report.trustworthy,
            "warning": report.warning,
            "host": report.host.model_dump(mode="json") if report.host else None}  # fmt: skip


def measure_iree(path: str, budget_s: float, threads: int | None = None) -> dict:
    """Compile, verify and time one payload with IREE (runs in the child)."""
    from stagegraph.app.bench import BenchOptions, sample
    from stagegraph.app.iree import IreeMeasurement
    from stagegraph.app.session import open_workload

    measurement = IreeMeasurement(open_workload(path), threads=threads)
    if not measurement.verdict.ok:
        return {"verified": False, "median_s": None, "message": measurement.verdict.message}
    measurement.measure(1, warmup=1)
    samples, _ = sample(measurement.measure, BenchOptions(warmup=1, repeat=5, budget_s=budget_s))
    return {"verified": True, "median_s": measurement.report(samples).median_s, "message": ""}


def measure_torch(spec: str, peer: str, budget_s: float, threads: int | None = None) -> dict:
    """Verify and time the problem file's model in PyTorch (``torch``: eager;
    ``torch-compile``: inductor), as ``bench --vs`` does (runs in the child)."""
    from stagegraph.app.bench import BenchOptions, sample
    from stagegraph.app.session import open_workload
    from stagegraph.app.torch_peer import TorchMeasurement

    measurement = TorchMeasurement(open_workload(spec), threads, peer)
    if not measurement.verdict.ok:
        return {"verified": False, "median_s": None, "message": measurement.verdict.message}
    samples, _ = sample(measurement.measure, BenchOptions(warmup=1, repeat=5, budget_s=budget_s))
    return {"verified": True, "median_s": measurement.report(samples).median_s, "message": ""}


def with_torch(row: Row, path: Path, limits: Limits, budget_s: float, threads: int | None) -> Row:
    """The row with PyTorch's columns, when the payload has a problem file beside the set
    (``../src/levelN/<stem>*.py``, run at the payload's ``scaled_constants``)."""
    from kernelbench_torch_coverage import payload_problem_spec

    spec = payload_problem_spec(path)
    if spec is None:
        return row.model_copy(update={"torch_error": "no problem file"})
    update: dict = {}
    for peer, column in (("torch", "torch_s"), ("torch-compile", "torch_compile_s")):
        try:
            result = limits.run(measure_torch, spec, peer, budget_s, threads, label=peer)
        except StagegraphError as exc:
            update["torch_error"] = f"{peer}: {str(exc).splitlines()[0]}"
            break
        if not result["verified"]:
            update["torch_error"] = f"{peer}: not verified: {result['message']}"
            break
        update[column] = result["median_s"]
    return row.model_copy(update=update)


def iree_missing() -> str:
    """Why IREE cannot run here ("" when it can); nothing of IREE is loaded in this process."""
    import importlib.util

    try:
        found = all(importlib.util.find_spec(n) for n in ("iree.compiler", "iree.runtime"))
    except ModuleNotFoundError:
        found = False
    return "" if found else "missing: pip install 'stagegraph[peers]'"


def with_iree(
    row: Row, path: Path, limits: Limits, budget_s: float, missing: str, threads: int | None = None
) -> Row:
    """The row with IREE's columns; an IREE failure stays in them."""
    if missing:
        return row.model_copy(update={"iree_error": missing})
    try:
        result = limits.run(measure_iree, str(path), budget_s, threads, label="iree")
    except StagegraphError as exc:
        return row.model_copy(update={"iree_error": str(exc).splitlines()[0]})
    ratio = None
    if result["median_s"] and row.x86_s and row.verified:
        ratio = row.x86_s / result["median_s"]
    return row.model_copy(update={
        "iree_s": result["median_s"], "iree_verified": result["verified"],
        "x86_vs_iree": ratio, "iree_error": result["message"],
    })  # fmt: skip


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def run_one(
    path: Path, limits: Limits, budget_s: float, threads: int | None = None, naive: bool = True
) -> tuple[Row, dict | None]:
    """The payload's row, and the host the x86 side ran on (``None`` if it never ran)."""
    row = Row(payload=path.stem)
    results = {}
    for graph in ("x86", "naive") if naive else ("x86",):
        try:
            results[graph] = limits.run(measure, graph, str(path), budget_s, threads, label=graph)
        except StagegraphError as exc:
            first = str(exc).splitlines()[0]
            host = results["x86"]["host"] if results else None
            return row.model_copy(update={"error": f"{graph}: {first}"}), host
    x86 = results["x86"]
    naive = results.get("naive", {"median_s": None, "trustworthy": None})
    speedup = None
    if x86["median_s"] and naive["median_s"]:
        speedup = naive["median_s"] / x86["median_s"]
    noisy = [f"{g}: {r['warning']}" for g, r in results.items() if r["trustworthy"] is False]
    timed = x86["trustworthy"] is not None and (
        naive["trustworthy"] is not None or not results.get("naive")
    )
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


def parse_arguments() -> argparse.Namespace:
    from versus_table import add_versus_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget per graph (s)")
    parser.add_argument("--threads", type=int, help="threads of x86 and IREE (default: all)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive graph (models)")
    parser.add_argument("--torch", action="store_true",
                        help="add PyTorch eager and torch.compile columns (payloads with a "
                        "problem file in ../src/levelN; needs the torch extra)")  # fmt: skip
    add_versus_arguments(parser)  # --vs, --scale, --models: the real-size tables
    return parser.parse_args()


def main() -> int:
    from stagegraph.app.host import reexec_without_openblas_overrides

    note = reexec_without_openblas_overrides()  # before any child process starts
    args = parse_arguments()
    if args.vs is not None or args.models:
        from versus_table import main_specs, run_tables

        return run_tables(*main_specs(args))
    limits = Limits(timeout_s=args.timeout, memory_bytes=16 * 2**30)
    rows, host = [], None
    missing = iree_missing()
    for path in sorted(args.folder.glob("*.mlir")):
        row, row_host = run_one(path, limits, args.budget, args.threads, not args.no_naive)
        row = with_iree(row, path, limits, args.budget, missing, args.threads)
        if args.torch:
            row = with_torch(row, path, limits, args.budget, args.threads)
        rows.append(row)
        host = host or row_host
        if not args.json:
            print(f"... {path.stem}", file=sys.stderr)
    verified = [r for r in rows if r.verified]
    speedups = [r.speedup for r in verified if r.speedup]
    gm_speedup = geomean(speedups)
    both = [r for r in verified if r.iree_verified and r.x86_s and r.iree_s]
    gm_x86 = geomean([r.x86_s for r in both])
    gm_iree = geomean([r.iree_s for r in both])
    gm_ratio = geomean([r.x86_vs_iree for r in both if r.x86_vs_iree])
    noisy = [r for r in verified if r.trustworthy is False]
    summary = {"verified": len(verified), "total": len(rows), "geomean_speedup": gm_speedup,
               "iree_verified": sum(bool(r.iree_verified) for r in rows),
               "iree": missing or "installed", "geomean_x86_s": gm_x86,
               "geomean_iree_s": gm_iree, "geomean_x86_vs_iree": gm_ratio,
               "noisy": len(noisy), "host": host, "note": note,
               "threads": args.threads}  # fmt: skip
    if args.torch:
        summary["torch"] = torch_summary(rows)
    if args.json:
        print(json.dumps({"rows": [r.model_dump() for r in rows], "summary": summary}, indent=1))
        return 0
    for line in header(host, note):
        print(f"{line}  ")
    print(f"threads: {args.threads or 'all cores'} (x86 and IREE)  ")
    print()
    print(
        "| payload | op classes | verified | x86 ms | naive ms | speedup "
        "| IREE ms | IREE verified | x86/IREE time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = lambda s: f"{s * 1e3:.3f}" if s else "-"  # noqa: E731
        sp = f"{r.speedup:.1f}x" if r.speedup else "-"
        if r.speedup and r.trustworthy is False:  # no precise-looking number for noise
            sp = f"~{r.speedup:.0f}x (noisy)"
        status = "yes" if r.verified else f"no ({r.error[:60]})"
        if r.iree_verified is None:
            iree_ok = r.iree_error[:60] or "-"
        else:
            iree_ok = "yes" if r.iree_verified else f"no ({r.iree_error[:60]})"
        vs = f"{r.x86_vs_iree:.2f}" if r.x86_vs_iree else "-"
        print(f"| {r.payload} | {', '.join(r.classes)} | {status} | {ms(r.x86_s)} | "
              f"{ms(r.naive_s)} | {sp} | {ms(r.iree_s)} | {iree_ok} | {vs} |")  # fmt: skip
    g = lambda v, f="{:.2f}": f.format(v) if v else "-"  # noqa: E731
    print(f"| geometric mean ({len(both)} verified by both) | | {len(verified)} of {len(rows)} | "
          f"{g(gm_x86 and gm_x86 * 1e3, '{:.3f}')} | | {g(gm_speedup)}x | "
          f"{g(gm_iree and gm_iree * 1e3, '{:.3f}')} | "
          f"{missing or sum(bool(r.iree_verified) for r in rows)} | {g(gm_ratio)} |")  # fmt: skip
    gm = f"{gm_speedup:.2f}" if gm_speedup else "-"
    print(f"\n{len(verified)} verified of {len(rows)}, geometric-mean speedup {gm}")
    if gm_ratio:
        print(f"x86/IREE time, geometric mean over {len(both)} payloads: {gm_ratio:.2f}")
    if noisy:
        print(f"{len(noisy)} speedups marked noisy (samples too spread to trust):")
        for r in noisy:
            print(f"  {r.payload}: {r.warning}")
    if args.torch:
        print_torch_table(rows, summary["torch"])
    return 0


def torch_summary(rows: list[Row]) -> dict:
    """Geometric means of x86 time / PyTorch time over the payloads both verified."""
    result = {}
    for column in ("torch_s", "torch_compile_s"):
        pairs = [(r.x86_s, getattr(r, column)) for r in rows
                 if r.verified and r.x86_s and getattr(r, column)]  # fmt: skip
        result[column] = {"payloads": len(pairs),
                          "geomean_x86_vs": geomean([a / b for a, b in pairs])}  # fmt: skip
    return result


def print_torch_table(rows: list[Row], summary: dict) -> None:
    """x86 against PyTorch eager and torch.compile (time ratios: below 1, x86 is faster)."""
    ms = lambda s: f"{s * 1e3:.3f}" if s else "-"  # noqa: E731
    ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
    print("\n| payload | x86 ms | torch ms | x86/torch | torch.compile ms | x86/torch.compile "
          "| note |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        x86 = r.x86_s if r.verified else None
        print(f"| {r.payload} | {ms(x86)} | {ms(r.torch_s)} | {ratio(x86, r.torch_s)} | "
              f"{ms(r.torch_compile_s)} | {ratio(x86, r.torch_compile_s)} | "
              f"{r.torch_error[:60]} |")  # fmt: skip
    for column, name in (("torch_s", "PyTorch eager"), ("torch_compile_s", "torch.compile")):
        entry = summary[column]
        if entry["geomean_x86_vs"]:
            print(f"x86/{name} time, geometric mean over {entry['payloads']} payloads: "
                  f"{entry['geomean_x86_vs']:.2f}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
