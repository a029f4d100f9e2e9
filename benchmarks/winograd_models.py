"""Whole models with Winograd on and off, against PyTorch eager, one process, interleaved,
one thread: what the Winograd path (:mod:`stagegraph.stages.x86.conv.winograd`) brings a
model at real size.

Each ``FILE.py[:overrides]`` compiles twice through the x86 graph (``x86.normalize``'s
``winograd=False``: the old paths; the defaults: the cost model may pick Winograd), both
verified; then ``stagegraph.app.bench.compare`` times off against on and on against
PyTorch, each pair interleaved. Usage:

    python benchmarks/winograd_models.py \\
        ../shared/kernelbench/src/level3/l3_009_ResNet18.py:batch_size=1 [--budget 3]
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per comparison")
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument(
        "--tile",
        type=int,
        default=None,
        choices=(2, 4),
        help="Winograd's output tile (default: the config's)",
    )
    args = parser.parse_args()

    import torch

    from stagegraph.app.bench import BenchOptions, compare, prepare
    from stagegraph.app.host import describe, host_info
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.app.torch_peer import TorchMeasurement
    from stagegraph.stages.x86.conv.choice import stamped_choices

    print(f"{describe(host_info())}; PyTorch {torch.__version__} eager; 1 thread; under load")
    options = BenchOptions(warmup=1, repeat=5, budget_s=args.budget, min_time_s=args.budget / 2)
    for spec in args.workloads:
        session = Session(SessionRequest(graph="x86", workload=spec, threads=1,
                                         target=args.target))  # fmt: skip
        on = session.graph
        if args.tile:
            on = on.with_config("normalize", winograd_tile=args.tile)
        graphs = {"off": session.graph.with_config("normalize", winograd=False), "on": on}
        result = session.engine.run(graphs["on"], session.workload, until="normalize")
        picks = [c.path for c in stamped_choices(result.value("normalize", "module").ir)]
        built = {k: prepare(session.engine, g, session.workload, None) for k, g in graphs.items()}
        for key, made in built.items():
            print(f"{spec} winograd {key}: {made.verdict.message}")
        paths = compare(built["off"], built["on"], options, 1)
        vs = compare(built["on"], TorchMeasurement(session.workload, 1), options, 1)
        mark = "" if paths.trustworthy and vs.trustworthy else "~"
        print(
            f"{spec}: paths {dict((p, picks.count(p)) for p in sorted(set(picks)))}; "
            f"off {paths.a.median_s * 1e3:.2f} ms, on {paths.b.median_s * 1e3:.2f} ms "
            f"(off/on {mark}{paths.ratio:.2f}); torch {vs.b.median_s * 1e3:.2f} ms "
            f"(torch/on {mark}{1 / vs.ratio:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
