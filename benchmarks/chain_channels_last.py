"""Channels-last carried from one convolution to the next (``GenericParams.
conv_chain_channels_last``, :mod:`stagegraph.stages.x86.generic.layout_sinking`) against
the transposes back to NCHW and forth around every convolution, and both against PyTorch
eager, one process, interleaved, by thread CPU time.

Each workload (a ``FILE.py:k=v`` problem spec, or a dev level-3 model name of
``real_size.LEVEL3_MODELS``: ``l3_045`` is UNet at batch 1, 224x224) is compiled both ways
through the x86 graph at one thread (both must verify), then timed in rounds: per round
each variant and PyTorch run ``--calls`` times, ``time.thread_time`` around each call.
Prints per workload the transposes the generic schedule's rewrites leave (not counting
those of constant filters, folded at compile time) without and with the sinking, the
medians, and the medians of the per-round ratios with their 10th-90th percentiles.
Usage:

    python benchmarks/chain_channels_last.py l3_045 l3_009 /tmp/vgg_prefix.py:batch_size=1
        [--rounds 5] [--calls 1] [--target x86-64-v3] [--no-torch] [--conv path=direct]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

KERNELBENCH = Path(__file__).resolve().parents[1].parent / "shared" / "kernelbench"
PARAM = "conv_chain_channels_last"


def workload_spec(name: str) -> str:
    """A level-3 model name as its 224x224 batch-1 spec; anything else as it is."""
    from real_size import model_specs

    specs = dict(model_specs(KERNELBENCH, name)) if name.startswith("l3_") else {}
    return next(iter(specs.values())) if len(specs) == 1 else name


def transpose_counts(session) -> tuple[int, int]:
    """Transposes of computed tensors after the channels-last rewrites, without and with
    the sinking, on the module ``x86.normalize`` gives (the paths the cost model chose;
    ``session``'s normalize config has ``chain_channels_last`` off)."""
    from stagegraph.mlir.build import ir_location
    from stagegraph.mlir.functions import entry_function
    from stagegraph.mlir.walk import top_level_ops
    from stagegraph.stages.x86.conv.rewrites import (
        conv_to_channels_last,
        depthwise_to_channels_last,
    )
    from stagegraph.stages.x86.generic.layout_sinking import sink_channels_last_transposes
    from stagegraph.stages.x86.generic.transpose_fusion import _stored_constant

    module = session.compile(until="normalize").module.ir
    counts = []
    with module.context, ir_location(module):
        fn = entry_function(module)
        conv_to_channels_last(fn)
        depthwise_to_channels_last(fn)
        for sink in (False, True):
            if sink:
                sink_channels_last_transposes(fn)
            counts.append(
                sum(
                    op.name == "linalg.transpose" and not _stored_constant(op.operands[0])
                    and bool(list(op.results[0].uses))
                    for op in top_level_ops(fn)
                )
            )  # fmt: skip
    return counts[0], counts[1]


def count_only(spec: str, args: argparse.Namespace) -> str:
    """``before -> after`` for ``spec`` without compiling past ``x86.normalize``."""
    from stagegraph.app.session import Session, SessionRequest

    session = Session(SessionRequest(graph="x86", workload=spec, threads=1, target=args.target))
    knobs = {**args.conv, "chain_channels_last": False}  # counted on the NCHW form
    session.graph = session.graph.with_config("normalize", **knobs)
    before, after = transpose_counts(session)
    return f"{before} -> {after}"


def cpu_times(measure, calls: int) -> np.ndarray:
    out = np.empty(calls)
    for i in range(calls):
        start = time.thread_time()
        measure(1)
        out[i] = time.thread_time() - start
    return out


def build(spec: str, args: argparse.Namespace) -> dict:
    """Both variants (verified) and PyTorch, keyed ``off``/``on``/``torch``."""
    from stagegraph.app.bench import prepare
    from stagegraph.app.session import Session, SessionRequest

    built, counts = {}, None
    for label, chained in (("off", False), ("on", True)):
        request = SessionRequest(
            graph="x86", workload=spec, threads=1, target=args.target, params={PARAM: chained}
        )
        session = Session(request)
        knobs = {**args.conv, "chain_channels_last": chained}
        session.graph = session.graph.with_config("normalize", **knobs)
        if counts is None:
            counts = transpose_counts(session)
        measurement = prepare(session.engine, session.graph, session.workload, None)
        if not measurement.verdict.ok:
            raise RuntimeError(f"{label}: {measurement.verdict.message}")
        built[label] = measurement.measure
    if not args.no_torch:
        built["torch"] = torch_measure(session.workload)
    return {"built": built, "counts": counts}


def torch_measure(workload):
    """PyTorch eager on the workload's model (``stagegraph bench --vs torch``'s peer, its
    outputs checked against the reference), one thread."""
    from stagegraph.app.torch_peer import TorchMeasurement

    peer = TorchMeasurement(workload, threads=1)
    if not peer.verdict.ok:
        raise RuntimeError(f"torch: {peer.verdict.message}")
    return lambda count: peer.measure(count)


def measure(spec: str, args: argparse.Namespace) -> dict:
    made = build(spec, args)
    built = made["built"]
    for run in built.values():
        run(1)  # warm
    rounds: dict[str, list[float]] = {label: [] for label in built}
    for number in range(args.rounds):
        order = list(built) if number % 2 == 0 else list(reversed(built))
        for label in order:
            rounds[label].append(float(np.median(cpu_times(built[label], args.calls))))
    times = {label: np.array(values) for label, values in rounds.items()}
    row = {"counts": made["counts"]}
    row |= {f"{label}_ms": float(np.median(t)) * 1e3 for label, t in times.items()}
    pairs = [("on_vs_off", "off", "on")] + ([] if args.no_torch else [
        ("torch_vs_off", "torch", "off"), ("torch_vs_on", "torch", "on")])  # fmt: skip
    for key, num, den in pairs:
        ratios = times[num] / times[den]
        row[key] = (np.median(ratios), np.percentile(ratios, 10), np.percentile(ratios, 90))
    return row


def _cell(ratio) -> str:
    return f"{ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument("--no-torch", action="store_true", help="the two variants only")
    parser.add_argument(
        "--conv", action="append", default=[], metavar="KEY=VALUE",
        help="a ConvGemmConfig field for both variants (path=direct: every convolution direct)",
    )  # fmt: skip
    parser.add_argument(
        "--count-only", action="store_true", help="the transposes only (compiles nothing)"
    )
    args = parser.parse_args()
    args.conv = dict(item.split("=", 1) for item in args.conv)

    from stagegraph.app.host import describe, host_info

    print(f"{describe(host_info())}; 1 thread; thread CPU time; shared machine: under load\n")
    print("| workload | transposes off -> on | off ms | on ms | torch ms | on/off speed "
          "| torch/x86 off | torch/x86 on |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name in args.workloads:
        if args.count_only:
            print(f"| {Path(name.split(':')[0]).stem} | {count_only(workload_spec(name), args)} "
                  "| | | | | | |", flush=True)  # fmt: skip
            continue
        row = measure(workload_spec(name), args)
        torch_cells = ["", "", ""]
        if not args.no_torch:
            torch_cells = [f"{row['torch_ms']:.1f}", _cell(row["torch_vs_off"]),
                           _cell(row["torch_vs_on"])]  # fmt: skip
        before, after = row["counts"]
        print(
            f"| {Path(name.split(':')[0]).stem} | {before} -> {after} | {row['off_ms']:.1f} | "
            f"{row['on_ms']:.1f} | {torch_cells[0]} | {_cell(row['on_vs_off'])} | "
            f"{torch_cells[1]} | {torch_cells[2]} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
