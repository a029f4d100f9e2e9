"""Tune payloads and report whether the tuner finds a measured win over the heuristic.

For each payload, ``stagegraph tune`` runs with the given strategy and budget (every
candidate compiled, verified and timed interleaved with the heuristic's params in an
isolated child); the table gives the best candidate's median and the baseline's measured
beside it, the speedup with its paired bootstrap interval, and whether the interval
excludes 1 (a win).
The reference is the x86 graph's own heuristic cost model (the params the tuner starts
from). The header names the host CPU and its ISA tier. Usage:

    python benchmarks/tune.py PAYLOAD... [--budget N] [--strategy model] [--threads 1]
    python benchmarks/tune.py --dev      # the five dev payloads of ../shared/kernelbench

Each payload gets a fresh database in ``--db-dir`` (default: a temporary folder), so a
rerun measures again rather than reusing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

#: Dev payloads where the heuristic was slowest against IREE (issue #16's acceptance set).
DEV_PAYLOADS = (
    "l1_065_conv_transposed_2D_square_input_asymmetric_kernel",
    "l1_069_conv_transposed_2D_asymmetric_input_asymmetric_kernel",
    "l1_042_Max_Pooling_2D",
    "l1_034_InstanceNorm",
    "l1_009_Tall_skinny_matrix_multiplication",
)


def shared_level1() -> Path | None:
    """``shared/kernelbench/level1`` in a parent folder of this checkout, if any."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "kernelbench" / "level1"
        if candidate.is_dir():
            return candidate
    return None


def tune_one(path: str, args: argparse.Namespace, db: Path) -> dict:
    from stagegraph.app.session import SessionRequest
    from stagegraph.errors import StagegraphError
    from stagegraph.tune.runner import TuneOptions, tune

    options = TuneOptions(
        session=SessionRequest(graph="x86", workload=path, threads=args.threads),
        budget=args.budget,
        db=str(db),
        strategy=args.strategy,
        seed=args.seed,
        samples=args.samples,
        per_op=args.per_op,
    )
    start = time.perf_counter()
    try:
        report = tune(options, progress=False)
    except StagegraphError as exc:
        return {"payload": Path(path).stem, "error": str(exc).splitlines()[0]}
    best = report.best
    return {
        "payload": Path(path).stem,
        "baseline_ms": (best.baseline_median_s if best else report.baseline["median_s"] or 0) * 1e3,
        "best_ms": best.median_s * 1e3 if best else None,
        "speedup": best.speedup if best else None,
        "low": best.speedup_low if best else None,
        "high": best.speedup_high if best else None,
        "win": report.winner,
        "measured": report.measured,
        "failed": report.failed,
        "seconds": time.perf_counter() - start,
    }


def main() -> int:
    from stagegraph.app.host import describe, host_info

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("payloads", nargs="*")
    parser.add_argument("--dev", action="store_true", help="the five dev payloads")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--strategy", default="model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--per-op", action="store_true")
    parser.add_argument("--db-dir", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    payloads = list(args.payloads)
    if args.dev:
        level1 = shared_level1()
        if level1 is None:
            print("no shared/kernelbench/level1 found above this checkout", file=sys.stderr)
            return 2
        payloads += [str(level1 / f"{name}.mlir") for name in DEV_PAYLOADS]
    if not payloads:
        parser.error("give payloads or --dev")
    folder = args.db_dir or Path(tempfile.mkdtemp(prefix="stagegraph-tune-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in payloads:
        rows.append(tune_one(path, args, folder / f"{Path(path).stem}.db"))
        if not args.json:
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    wins = sum(1 for r in rows if r.get("win"))
    if args.json:
        print(json.dumps({"host": host_info().model_dump(mode="json"), "rows": rows,
                          "wins": wins}, indent=2))  # fmt: skip
        return 0
    print(describe(host_info()))
    print(f"reference: the x86 graph's heuristic params; strategy {args.strategy}, budget "
          f"{args.budget}, {args.threads} thread(s), {args.samples} paired samples")  # fmt: skip
    print(f"{'payload':<62} {'heur ms':>9} {'best ms':>9} {'speedup [95% CI]':>22} win")
    for r in rows:
        if "error" in r:
            print(f"{r['payload']:<62} error: {r['error']}")
            continue
        interval = (f"{r['speedup']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
                    if r["speedup"] else "-")  # fmt: skip
        best = f"{r['best_ms']:.4f}" if r["best_ms"] else "-"
        print(
            f"{r['payload']:<62} {r['baseline_ms']:>9.4f} {best:>9} {interval:>22} "
            f"{'yes' if r['win'] else 'no'}"
        )
    print(f"measured wins (interval above 1): {wins} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
