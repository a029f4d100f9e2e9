"""x86 graph vs numpy/OpenBLAS (and the naive graph) on f32 matmul and the MLP.

Every ratio compares two variants measured interleaved in the same process (see
``stagegraph.bench.compare``); one child process per thread count pins OpenBLAS and OpenMP to
that many threads. Prints a markdown table. Usage:

    python benchmarks/matmul.py [--sizes 256,512,1024,2048] [--budget 5] [--naive-max 512]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MLP = "mlp:batch=256,widths=1024-1024-1024"
ODD = ["matmul:m=1000,n=1000,k=1000", "matmul:m=384,n=1536,k=768"]


def workloads(sizes: list[int]) -> list[str]:
    return [f"matmul:m={s},n={s},k={s}" for s in sizes] + ODD + [MLP]


def child(specs: list[str], threads: int, budget: float, naive_max: int) -> None:
    """Measure in this process and print one JSON line per workload."""
    from stagegraph.bench import BenchOptions, NumpyMeasurement, compare, prepare
    from stagegraph.catalog import load_graph
    from stagegraph.engine import Engine
    from stagegraph.execute import with_params
    from stagegraph.workload import parse_workload

    options = BenchOptions(warmup=3, repeat=10, budget_s=budget)
    x86 = with_params(load_graph("x86"), {}, threads)
    engine = Engine()
    for spec in specs:
        work = parse_workload(spec)
        fast = prepare(engine, x86, work, None)
        row = {"workload": spec, "threads": threads, "verified": fast.verdict.ok,
               "compile_s": fast.result.trace.compile_seconds()}  # fmt: skip
        if fast.verdict.ok:
            vs_numpy = compare(fast, NumpyMeasurement(work), options, threads)
            row |= {"x86_gflops": vs_numpy.a.gflops, "numpy_gflops": vs_numpy.b.gflops,
                    "vs_numpy": 1 / vs_numpy.ratio, "vs_numpy_low": 1 / vs_numpy.ratio_high,
                    "vs_numpy_high": 1 / vs_numpy.ratio_low}  # fmt: skip
            if max(work.params.model_dump().get(k, 0) or 0 for k in ("m", "batch")) <= naive_max:
                slow = prepare(engine, load_graph("naive"), work, None)
                vs_naive = compare(fast, slow, options.model_copy(update={"budget_s": budget}))
                row |= {"naive_gflops": vs_naive.b.gflops, "vs_naive": 1 / vs_naive.ratio}
        print(json.dumps(row), flush=True)


def table(rows: list[dict]) -> str:
    lines = [
        "| workload | threads | x86 GFLOP/s | numpy GFLOP/s | x86 / numpy [95% CI] | "
        "naive GFLOP/s | x86 / naive | compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["verified"]:
            lines.append(f"| {r['workload']} | {r['threads']} | NOT VERIFIED | | | | | |")
            continue
        naive = f"{r['naive_gflops']:.2f}" if "naive_gflops" in r else "-"
        vs_naive = f"{r['vs_naive']:.0f}x" if "vs_naive" in r else "-"
        lines.append(
            f"| {r['workload']} | {r['threads']} | {r['x86_gflops']:.0f} | "
            f"{r['numpy_gflops']:.0f} | {r['vs_numpy']:.2f} [{r['vs_numpy_low']:.2f}, "
            f"{r['vs_numpy_high']:.2f}] | {naive} | {vs_naive} | {r['compile_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048")
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per comparison")
    parser.add_argument("--naive-max", type=int, default=512, help="largest m run on naive")
    parser.add_argument("--threads", default=None, help="comma list (default: 1 and all cores)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("specs", nargs="*", help="workloads (default: the standard set)")
    args = parser.parse_args()
    specs = args.specs or workloads([int(s) for s in args.sizes.split(",")])
    if args.child:
        child(specs, int(args.threads), args.budget, args.naive_max)
        return 0
    cores = len(os.sched_getaffinity(0))
    counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, cores})
    rows = []
    for threads in counts:
        pinned = {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        env = {**os.environ, **pinned}
        options = ["--budget", str(args.budget), "--naive-max", str(args.naive_max)]
        cmd = [sys.executable, __file__, "--child", "--threads", str(threads), *options, *specs]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
