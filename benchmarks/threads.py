"""The payload's thread count, measured: each payload through the x86 graph on one thread
against the same payload on N threads (the cost model's tiles for N; only the payload's
``threads`` param differs between the two), interleaved in one process, and the thread count
the cost model chose. A speedup below 1.0 on a payload the model threads is a wrong choice.

    python benchmarks/threads.py ../shared/kernelbench/level2/l2_0*ConvTranspose*.mlir
    python benchmarks/threads.py 'matmul:m=512,n=512,k=512' --threads 2 --budget 5

On a machine other processes load, multi-threaded timings wait for descheduled workers:
the table says the load average it was measured under.
"""

from __future__ import annotations

import argparse
import os
import sys


def measure(workload: str, threads: int, budget: float) -> dict:
    """One payload: the model's thread choice and the 1-thread / N-thread time ratio."""
    from stagegraph.app.bench import compare, prepare
    from stagegraph.app.bench_options import BenchOptions
    from stagegraph.app.session import Session, SessionRequest

    model = Session(SessionRequest(graph="x86", workload=workload, threads=threads))
    chosen = model.compile(until="select").params.threads
    sides = []
    for count in (1, threads):
        request = SessionRequest(graph="x86", workload=workload, threads=threads,
                                 params={"threads": count})  # fmt: skip
        session = Session(request)
        session.prepare_workload()
        sides.append(prepare(session.engine, session.graph, session.workload, None))
    options = BenchOptions(budget_s=budget)
    result = compare(sides[0], sides[1], options, threads)
    return {
        "workload": workload,
        "chosen": chosen,
        "verified": all(side.verdict.ok for side in sides),
        "speedup": 1.0 / result.ratio if result.ratio else float("nan"),
        "low": 1.0 / result.ratio_high if result.ratio_high else float("nan"),
        "high": 1.0 / result.ratio_low if result.ratio_low else float("nan"),
        "trusted": result.trustworthy,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--budget", type=float, default=4.0)
    args = parser.parse_args(argv)
    from stagegraph.app.host import describe, host_info

    print(f"host: {describe(host_info())}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'payload':60s} {'model':>5s} {'1->' + str(args.threads) + ' threads':>22s}")
    for workload in args.workloads:
        row = measure(workload, args.threads, args.budget)
        note = "" if row["trusted"] else " (noisy)"
        print(f"{os.path.basename(workload)[:60]:60s} {row['chosen']:5d} "
              f"{row['speedup']:6.2f}x [{row['low']:.2f}, {row['high']:.2f}]{note}"
              f"{'' if row['verified'] else ' NOT VERIFIED'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
