"""Linear layers and MLPs (matmul + epilogue payloads) against PyTorch eager and IREE, and
x86 variants against each other, one process, interleaved, by thread CPU time.

Each workload (a KernelBench ``.mlir`` with its ``.npz``, or a problem-file spec
``FILE.py:name=value,...``) is compiled through the x86 graph (default params, and one
build per ``--variant NAME:KEY=VALUE,...`` of ``--param`` overrides), every side verified,
then timed in rounds: per round each side runs ``--calls`` times and ``time.thread_time``
measures each call's CPU time on this thread (one thread: the compiled code, PyTorch's
kernels and IREE's ``local-sync`` driver all run in it). Thread CPU time is what a loaded
machine disturbs least. Prints per workload each side's median time and fraction of the
FMA peak, and the median of the per-round ratios (side / x86: above 1, x86 is faster) with
their 10th-90th percentiles. Usage:

    python benchmarks/linear_vs_peers.py \\
        "../shared/kernelbench/src/level3/l3_001_MLP.py:batch_size=16,input_size=4096,..." \\
        ../shared/kernelbench/level2/l2_009_*.mlir [--vs torch iree] [--rounds 10]
        [--calls 3] [--target znver4] [--variant old:tile_k=128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from conv_patch_gather import cpu_times


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` as the name and its ``--param`` overrides."""
    name, _, assignments = text.partition(":")
    return name, dict(item.split("=", 1) for item in assignments.split(",") if item)


def build_sides(spec: str, args: argparse.Namespace) -> dict | str:
    """Every side of ``spec``, prepared and verified (or the first failure's message)."""
    from stagegraph.app.bench import prepare
    from stagegraph.app.graph_options import with_params
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.app.versus import PEERS
    from stagegraph.core.registry import import_entry

    request = SessionRequest(graph="x86", workload=spec, threads=1, target=args.target)
    session = Session(request)
    sides = {"x86": prepare(session.engine, session.graph, session.workload, None)}
    for name, overrides in args.variant:
        graph = with_params(session.graph, overrides, 1)
        sides[name] = prepare(session.engine, graph, session.workload, None)
    for peer in args.vs:
        sides[peer] = import_entry(PEERS.get(peer).measurement)(session)
    for name, side in sides.items():
        if not side.verdict.ok:
            return f"{name}: {side.verdict.message}"
        side.measure(1, warmup=2)
    return {"sides": sides, "flops": getattr(session.workload, "flops", None)}


def measure(spec: str, args: argparse.Namespace) -> dict | str:
    """Every side of ``spec`` timed in interleaved rounds (order rotated per round)."""
    from stagegraph.errors import StagegraphError

    try:
        built = build_sides(spec, args)
    except StagegraphError as error:  # (e.g. --vs torch for a .mlir: no PyTorch module)
        return str(error)
    if isinstance(built, str):
        return built
    sides = built["sides"]
    names = list(sides)
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for number in range(args.rounds):
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            rounds[name].append(float(np.median(cpu_times(sides[name], args.calls))))
    times = {name: np.array(values) for name, values in rounds.items()}
    return {"times": times, "flops": built["flops"]}


def row(label: str, result: dict, peak: float | None) -> str:
    """One table row: each side's median ms and % of peak, then its ratio to x86."""
    times, flops = result["times"], result["flops"]
    cells = [label]
    for name, values in times.items():
        ms = float(np.median(values)) * 1e3
        share = f" ({flops / (ms * 1e-3) / peak:.0%})" if flops and peak else ""
        cells.append(f"{name} {ms:.3f}{share}")
    for name, values in times.items():
        if name == "x86":
            continue
        ratios = values / times["x86"]
        p10, p90 = np.percentile(ratios, [10, 90])
        cells.append(f"{name}/x86 {np.median(ratios):.2f} [{p10:.2f}, {p90:.2f}]")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--vs", nargs="*", default=["torch", "iree"], choices=["torch", "iree"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--target", help="target to compile for (default: the host)")
    parser.add_argument("--variant", action="append", default=[], type=parse_variant,
                        help="NAME:KEY=VALUE,... an x86 build with these --param overrides")  # fmt: skip  # noqa: E501
    args = parser.parse_args()

    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.app.host import describe, host_info
    from stagegraph.stages.target import resolve_target

    target = resolve_target(args.target)
    peak = fma_peak_gflops(1, target) * 1e9  # measured here, by wall clock: a floor
    print(f"{describe(host_info())}; target {target.name}; 1 thread; thread CPU time; FMA "
          f"peak {peak / 1e9:.1f} GFLOP/s; shared machine: under load\n")  # fmt: skip
    for name in args.workloads:
        label = Path(name.split(":")[0]).stem + (f":{name.split(':', 1)[1]}" if ":" in name else "")
        result = measure(name, args)
        if isinstance(result, str):
            print(f"| {label} | error: {result[:200]} |", flush=True)
            continue
        print(row(label, result, peak), flush=True)


if __name__ == "__main__":
    main()
