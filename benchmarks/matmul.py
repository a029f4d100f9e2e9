"""x86 graph vs numpy/OpenBLAS (and the naive graph) on f32 matmul and the MLP; bf16 vs f32.

Every ratio compares two variants measured interleaved in the same process (see
``stagegraph.app.bench.compare``: with several threads it pauses before each switch so that one
runtime's spinning workers are asleep while the other measures); one child process per thread
count runs OpenMP on that many threads (``OMP_NUM_THREADS``) and numpy's OpenBLAS on as many
(threadpoolctl, exactly as ``stagegraph bench --vs numpy``). ``OPENBLAS_CORETYPE`` and
``OPENBLAS_L2_SIZE`` force slower kernels: if either is set, the script restarts without them
and says so. The tables name the CPU, the ISA tier and OpenBLAS's core type, and mark a ratio
whose samples were too spread to trust. Each row also reports the fraction of the FMA limit
both sides reached: the best speed of a loop of independent vector FMAs
(``stagegraph.app.fma_peak``) on the row's threads, measured just before and just after the
row (the clock a core really runs at is in no file). A bf16 matmul (f32 accumulation) has no
numpy equivalent: it is compared with the x86 graph's f32 matmul of the same shape. Prints
markdown tables.

``--emulate x86-64-v3`` measures an AVX2 host's comparison on a wider host: the x86 graph is
compiled for ``--target x86-64-v3`` (ymm vectors, 16 registers, the level's documented caches),
numpy's OpenBLAS is forced to its AVX2 kernel (``OPENBLAS_CORETYPE=Haswell``, the kernel it
picks on Haswell and Zen 1-3) and the FMA limit is measured with ymm FMAs. The tables say so.

``--processes N`` measures every row in N fresh child processes (one after the other) and
reports the row of the median ratio, with the range over the processes. A ratio can depend on
the process: where the kernel put its pages decides cache-set conflicts and prefetch
distances, so the same code read 0.96 and 0.99 at 2048^3 in two processes on one VM (session
15), a spread a single process's confidence interval cannot show. A row whose processes
disagree by more than 10% (max/min, ``stagegraph.runtime.stats.MAX_REPEAT_SPREAD``) is
marked noisy, with the range, instead of quoting the median process's tight interval.
Usage:

    python benchmarks/matmul.py [--sizes 256,512,1024,2048] [--bf16-sizes 1024,2048]
                                [--budget 5] [--naive-max 512] [--emulate x86-64-v3]
                                [--processes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MLP = "mlp:batch=256,widths=1024-1024-1024"
ODD = ["matmul:m=1000,n=1000,k=1000", "matmul:m=384,n=1536,k=768"]
# The OpenBLAS kernel a host of each x86-64 level runs (DYNAMIC_ARCH picks it by CPUID).
OPENBLAS_KERNEL_OF_LEVEL = {"x86-64-v3": "Haswell", "x86-64-v4": "SkylakeX"}


def workloads(sizes: list[int], bf16_sizes: list[int]) -> list[str]:
    square = [f"matmul:m={s},n={s},k={s}" for s in sizes]
    return square + ODD + [MLP] + [f"matmul:m={s},n={s},k={s},dtype=bf16" for s in bf16_sizes]


def child(specs: list[str], threads: int, budget: float, naive_max: int, level: str | None) -> None:
    """Measure in this process and print one JSON line per workload (the x86 graph and the
    FMA limit for the x86-64 ``level`` when it is given, else for the host)."""
    from stagegraph.app.bench import BenchOptions
    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.stages.target import resolve_target

    target = resolve_target(level) if level else None

    # Every comparison alternates for its whole budget: stopping as soon as the interval is
    # tight (a second or two) let the VM's slow drift decide ratios within a few percent
    # (384x1536x768 at 1 thread read 0.96 so, 1.03 over 20 s; session 10).
    options = BenchOptions(warmup=3, repeat=10, budget_s=budget, min_time_s=budget)
    for spec in specs:
        request = SessionRequest(graph="x86", workload=spec, threads=threads, target=level)
        session = Session(request)
        before = fma_peak_gflops(threads, target)
        if "dtype=bf16" in spec:
            row = bf16_row(session, threads, options)
        else:
            row = f32_row(session, threads, options, naive_max)
        # The best FMA-loop speed seen around the row (the VM's clock drifts): the fraction
        # of the FMA limit each side reached.
        peak = max(before, fma_peak_gflops(threads, target))
        row["fma_peak_gflops"] = peak
        for side in ("x86", "numpy", "bf16"):
            if f"{side}_gflops" in row:
                row[f"{side}_of_peak"] = row[f"{side}_gflops"] / peak
        print(json.dumps(row), flush=True)


def bf16_row(session, threads: int, options) -> dict:
    """bf16 against the f32 matmul of the same shape (its fraction of the FMA peak is added
    by the caller)."""
    from stagegraph.app.bench import compare, prepare
    from stagegraph.workload import parse_workload

    engine, x86, work, spec = (
        session.engine,
        session.graph,
        session.workload,
        session.request.workload,
    )
    bf16 = prepare(engine, x86, work, None)
    row = {"workload": spec, "threads": threads, "verified": bf16.verdict.ok,
           "compile_s": bf16.result.trace.compile_seconds()}  # fmt: skip
    if bf16.verdict.ok:
        f32 = prepare(engine, x86, parse_workload(spec.replace("dtype=bf16", "dtype=f32")), None)
        vs = compare(bf16, f32, options, threads)
        row |= {"bf16_gflops": vs.a.gflops, "f32_gflops": vs.b.gflops,
                "vs_f32": 1 / vs.ratio, "vs_f32_low": 1 / vs.ratio_high,
                "vs_f32_high": 1 / vs.ratio_low, **trust(vs), "host": host(vs.a)}  # fmt: skip
    return row


def trust(comparison) -> dict:
    """Whether the comparison's ratio may be quoted, and why not."""
    return {"trustworthy": comparison.trustworthy, "warning": comparison.warning}


def host(report) -> dict | None:
    return report.host.model_dump(mode="json") if report.host else None


def f32_row(session, threads: int, options, naive_max: int) -> dict:
    """The x86 graph against numpy (and the naive graph on small shapes)."""
    from stagegraph.app.bench import NumpyMeasurement, compare, prepare
    from stagegraph.core.catalog import load_graph

    engine, x86, work, spec = (
        session.engine,
        session.graph,
        session.workload,
        session.request.workload,
    )
    fast = prepare(engine, x86, work, None)
    row = {"workload": spec, "threads": threads, "verified": fast.verdict.ok,
           "compile_s": fast.result.trace.compile_seconds()}  # fmt: skip
    if fast.verdict.ok:
        # numpy's OpenBLAS on exactly ``threads`` threads, like the x86 side.
        vs_numpy = compare(fast, NumpyMeasurement(work, threads), options, threads)
        row |= {"x86_gflops": vs_numpy.a.gflops, "numpy_gflops": vs_numpy.b.gflops,
                "vs_numpy": 1 / vs_numpy.ratio, "vs_numpy_low": 1 / vs_numpy.ratio_high,
                "vs_numpy_high": 1 / vs_numpy.ratio_low, **trust(vs_numpy),
                "host": host(vs_numpy.b)}  # fmt: skip
        if max(work.params.model_dump().get(k, 0) or 0 for k in ("m", "batch")) <= naive_max:
            slow = prepare(engine, load_graph("naive"), work, None)
            vs_naive = compare(fast, slow, options)
            row |= {"naive_gflops": vs_naive.b.gflops, "vs_naive": 1 / vs_naive.ratio,
                    "naive_trustworthy": vs_naive.trustworthy}  # fmt: skip
    return row


def table(rows: list[dict], note: str | None = None, level: str | None = None) -> str:
    """The machine, then the f32 table, then the bf16 one when there are bf16 rows, then
    why any ratio marked noisy is not to be trusted."""
    f32 = [r for r in rows if "dtype=bf16" not in r["workload"]]
    bf16 = [r for r in rows if "dtype=bf16" in r["workload"]]
    text = machine(rows, note, level) + "\n\n" + f32_table(f32)
    text += "\n\n" + bf16_table(bf16) if bf16 else ""
    noisy = [r for r in rows if r.get("trustworthy") is False]
    for r in noisy:
        text += f"\n\nnoisy: {r['workload']}, threads={r['threads']}: {r['warning']}"
    return text


def machine(rows: list[dict], note: str | None, level: str | None = None) -> str:
    """What the numbers depend on: CPU, ISA tier, OpenBLAS core type and thread pinning (and
    the emulated x86-64 level, if any)."""
    from stagegraph.app.host import HostInfo, describe

    hosts = [HostInfo.model_validate(r["host"]) for r in rows if r.get("host")]
    lines = [describe(hosts[0]) if hosts else "host: not measured"]
    lines.append("OpenBLAS (numpy) runs on the row's thread count, pinned with threadpoolctl")
    if level:
        lines.append(
            f"emulating an {level} host: x86 graph compiled for --target {level}, OpenBLAS "
            f"forced to its {OPENBLAS_KERNEL_OF_LEVEL[level]} kernel, FMA limit of {level}'s "
            "vectors"
        )
    elif hosts and hosts[0].openblas_coretype:
        lines.append(f"warning: OPENBLAS_CORETYPE={hosts[0].openblas_coretype}: numpy is slowed")
    if note:
        lines.append(note)
    return "\n".join(f"{line}  " for line in lines)  # markdown line breaks


def ratio_cell(r: dict, key: str) -> str:
    """``x [low, high]``, or a rough value marked noisy when the samples were too spread;
    then the range over the processes that measured the row (``--processes``)."""
    if r.get("trustworthy") is False:
        cell = f"~{r[key]:.1f} (noisy)"
    else:
        cell = f"{r[key]:.2f} [{r[key + '_low']:.2f}, {r[key + '_high']:.2f}]"
    spread = r.get(key + "_per_process") or []
    if len(spread) > 1:
        cell += f"; {len(spread)} processes {min(spread):.2f}-{max(spread):.2f}"
    return cell


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """One row per (workload, threads) from several processes' rows: the row whose ratio
    (``vs_numpy``, or ``vs_f32`` for bf16) is the median (the lower one of an even count),
    with every process's ratio in ``<ratio>_per_process``. A row that failed to verify in
    any process is that failing row: a wrong result is never hidden by a median. A row whose
    processes disagree beyond ``MAX_REPEAT_SPREAD`` (max/min) is marked not to be trusted:
    each process's interval is tight, but the median is one phase's number."""
    from stagegraph.runtime.stats import assess_repeats

    grouped: dict[tuple[str, int], list[dict]] = {}
    for rows in runs:
        for row in rows:
            grouped.setdefault((row["workload"], row["threads"]), []).append(row)
    merged = []
    for rows in grouped.values():
        failed = [r for r in rows if not r["verified"]]
        if failed:
            merged.append(failed[0])
            continue
        key = "vs_f32" if "vs_f32" in rows[0] else "vs_numpy"
        ordered = sorted(rows, key=lambda r: r[key])
        row = {**ordered[(len(ordered) - 1) // 2], f"{key}_per_process": [r[key] for r in rows]}
        repeats = assess_repeats(row[f"{key}_per_process"], what="processes")
        if not repeats.trustworthy:
            warnings = (row.get("warning"), repeats.warning)
            row |= {"trustworthy": False, "warning": "; ".join(w for w in warnings if w)}
        merged.append(row)
    return merged


def markdown(header: list[str], rows: list[dict], cells) -> str:
    """A markdown table: workload and threads, then ``cells(row)`` (or NOT VERIFIED)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        rest = cells(r) if r["verified"] else ["NOT VERIFIED"] + [""] * (len(header) - 3)
        lines.append("| " + " | ".join([r["workload"], str(r["threads"]), *rest]) + " |")
    return "\n".join(lines)


def bf16_table(rows: list[dict]) -> str:
    header = ["bf16 matmul (f32 accumulation)", "threads", "bf16 GFLOP/s", "x86 f32 GFLOP/s",
              "bf16 / f32 [95% CI]", "FMA peak GFLOP/s", "bf16 of peak", "compile s"]  # fmt: skip
    return markdown(header, rows, lambda r: [
        f"{r['bf16_gflops']:.0f}", f"{r['f32_gflops']:.0f}",
        ratio_cell(r, "vs_f32"),
        f"{r['fma_peak_gflops']:.0f}", f"{r['bf16_of_peak']:.0%}", f"{r['compile_s']:.2f}",
    ])  # fmt: skip


def f32_table(rows: list[dict]) -> str:
    header = ["workload", "threads", "x86 GFLOP/s", "numpy GFLOP/s", "x86 / numpy [95% CI]",
              "FMA peak GFLOP/s", "x86 / numpy of peak", "naive GFLOP/s", "x86 / naive",
              "compile s"]  # fmt: skip
    return markdown(header, rows, lambda r: [
        f"{r['x86_gflops']:.0f}", f"{r['numpy_gflops']:.0f}",
        ratio_cell(r, "vs_numpy"),
        f"{r['fma_peak_gflops']:.0f}", f"{r['x86_of_peak']:.0%} / {r['numpy_of_peak']:.0%}",
        f"{r['naive_gflops']:.2f}" if "naive_gflops" in r else "-", naive_cell(r),
        f"{r['compile_s']:.2f}",
    ])  # fmt: skip


def naive_cell(r: dict) -> str:
    if "vs_naive" not in r:
        return "-"
    return f"{r['vs_naive']:.0f}x" + (" (noisy)" if r.get("naive_trustworthy") is False else "")


def main() -> int:
    from stagegraph.app.host import reexec_without_openblas_overrides

    # Before any numpy is timed, here or in a child (which inherits the cleaned environment,
    # or is given OPENBLAS_CORETYPE on purpose by --emulate).
    note = None if "--child" in sys.argv[1:] else reexec_without_openblas_overrides()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048")
    parser.add_argument("--bf16-sizes", default="1024,2048", help="'' for none")
    parser.add_argument(
        "--budget", type=float, default=5.0, help="seconds each comparison alternates for"
    )
    parser.add_argument("--naive-max", type=int, default=512, help="largest m run on naive")
    parser.add_argument("--threads", default=None, help="comma list (default: 1 and all cores)")
    parser.add_argument(
        "--emulate",
        choices=sorted(OPENBLAS_KERNEL_OF_LEVEL),
        help="compare as on a host of this x86-64 level (it must run here)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh child processes per thread count; rows report the median ratio",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("specs", nargs="*", help="workloads (default: the standard set)")
    args = parser.parse_args()
    sizes = [[int(s) for s in text.split(",") if s] for text in (args.sizes, args.bf16_sizes)]
    specs = args.specs or workloads(*sizes)
    if args.child:
        child(specs, int(args.threads), args.budget, args.naive_max, args.emulate)
        return 0
    if args.emulate:
        from stagegraph.stages.target import detect_target, resolve_target

        missing = resolve_target(args.emulate).missing_on(detect_target())
        if missing:
            parser.error(f"--emulate {args.emulate}: this host lacks {', '.join(missing)}")
    cores = len(os.sched_getaffinity(0))
    counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, cores})
    rows = []
    for threads in counts:
        # OpenMP by environment; OpenBLAS by threadpoolctl in the child (NumpyMeasurement).
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        options = ["--budget", str(args.budget), "--naive-max", str(args.naive_max)]
        if args.emulate:
            env["OPENBLAS_CORETYPE"] = OPENBLAS_KERNEL_OF_LEVEL[args.emulate]
            options += ["--emulate", args.emulate]
        cmd = [sys.executable, __file__, "--child", "--threads", str(threads), *options, *specs]
        runs = []
        for _ in range(max(1, args.processes)):
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return out.returncode
            lines = out.stdout.splitlines()
            runs.append([json.loads(line) for line in lines if line.startswith("{")])
        rows += median_rows(runs)
    print(
        json.dumps({"note": note, "rows": rows}, indent=1)
        if args.json
        else table(rows, note, args.emulate)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
