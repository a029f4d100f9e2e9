"""Run time of a model with every group of ops outlined (``x86.schedule``'s
``outline_every_group_above`` at 0; by default (None) only repeated groups are outlined)
against the same model with only its repeated groups outlined, both verified, timed
interleaved in one process (``stagegraph.app.bench.compare``). Outlining pays in compile
time (no function LLVM compiles holds the whole model); this measures what it costs in
run time. Usage:

    python benchmarks/outline_runtime.py [--only ResNet18] [--threads 1] [--budget 20]

Models: the dev level-3 models at batch 1 with 224x224 images (``benchmarks/real_size.py``).
Prints, per model, both medians and outlined time / inline time with its 95% interval.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(spec: str, threads: int, budget_s: float) -> str:
    """One markdown row: the two medians (ms) and their ratio, or why not."""
    from stagegraph.app.bench import BenchOptions, compare, prepare
    from stagegraph.app.session import Session, SessionRequest

    session = Session(SessionRequest(graph="x86", workload=spec, threads=threads))
    session.prepare_workload()
    built = {}
    for name, above in (("outlined", 0), ("inline", None)):
        graph = session.graph.with_config("schedule", outline_every_group_above=above)
        built[name] = prepare(session.engine, graph, session.workload, None)
        if not built[name].verdict.ok:
            return f"{name}: {built[name].verdict.message}"
    options = BenchOptions(warmup=2, repeat=10, budget_s=budget_s, min_time_s=budget_s / 2)
    result = compare(built["outlined"], built["inline"], options, threads)
    return (
        f"{result.a.median_s * 1e3:.2f} | {result.b.median_s * 1e3:.2f} | "
        f"{result.ratio:.3f} [{result.ratio_low:.3f}, {result.ratio_high:.3f}]"
    )


def main() -> int:
    from compile_time import find_shared, host_line
    from real_size import model_specs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="models whose name contains this")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per model")
    args = parser.parse_args()
    shared = find_shared()
    if shared is None:
        print("no shared/kernelbench found beside the repository", file=sys.stderr)
        return 2
    print(f"{host_line()}  \n{args.threads} thread(s), both sides verified\n")
    print("| model | outlined ms | inline ms | outlined / inline [95%] |\n|---|---|---|---|")
    for name, spec in model_specs(shared / "kernelbench", args.only):
        print(f"| {name} | {measure(spec, args.threads, args.budget)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
