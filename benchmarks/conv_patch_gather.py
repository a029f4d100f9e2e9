"""Implicit-GEMM convolutions with the patch matrix gathered into B's packed panels
(``ConvGemmConfig.gather_patches``, the default) against the window copy written out
whole and then packed (``gather_patches=false``), one process, interleaved, by thread CPU
time.

Each workload (a KernelBench ``.mlir`` with its ``.npz``, or a shape of
``benchmarks/conv_paths.py``: ``r18.l1``, ``vgg.b3``, ...) is compiled both ways through
the x86 graph (both must verify), then timed in rounds: per round each variant runs
``--calls`` times and ``time.thread_time`` measures each call's CPU time on this thread
(one thread: the compiled code runs in it). Thread CPU time is what a loaded machine
disturbs least (its wall clock moved PyTorch's time 2x between runs, docs/measurements.md,
session 20). Prints per workload both medians, and the median of the per-round ratios
(window copy / gather: above 1, the gather is faster) with their 10th-90th percentiles.
Usage:

    python benchmarks/conv_patch_gather.py ../shared/kernelbench/level1/l1_050_*.mlir r18.l1 vgg.b3
        [--rounds 10] [--calls 3] [--target x86-64-v4] [--min-stride 1] [--conv path=gemm]

The gather variant uses ``gather_min_stride=--min-stride`` (default 2, the config's): a
unit-stride convolution compiles the same both ways unless ``--min-stride 1``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def workload_spec(name: str, folder: Path) -> str:
    """A ``.mlir`` path as it is, a conv_paths shape name as a ``FILE.py:k=v`` spec."""
    from conv_paths import _MODEL, SHAPES, shape_spec

    shapes = {k: v for group in SHAPES.values() for k, v in group.items()}
    if name not in shapes:
        return name
    model = folder / "conv_model.py"
    model.write_text(_MODEL)
    return shape_spec(model, shapes[name])


def cpu_times(measurement, calls: int) -> np.ndarray:
    """Thread CPU time of each of ``calls`` calls of a prepared ``measurement``."""
    out = np.empty(calls)
    for i in range(calls):
        start = time.thread_time()
        measurement.measure(1)
        out[i] = time.thread_time() - start
    return out


def measure(spec: str, args: argparse.Namespace) -> dict:
    """Both variants of ``spec``, verified, then timed in interleaved rounds."""
    from stagegraph.app.bench import prepare
    from stagegraph.app.session import Session, SessionRequest

    request = SessionRequest(graph="x86", workload=spec, threads=1, target=args.target)
    session = Session(request)
    built = {}
    for gather in (True, False):
        knobs = {**args.conv, "gather_patches": gather, "gather_min_stride": args.min_stride}
        graph = session.graph.with_config("normalize", **knobs)
        built[gather] = prepare(session.engine, graph, session.workload, None)
        if not built[gather].verdict.ok:
            return {"error": f"gather_patches={gather}: {built[gather].verdict.message}"}
        built[gather].measure(1, warmup=2)
    rounds: dict[bool, list[float]] = {True: [], False: []}
    for number in range(args.rounds):
        order = (True, False) if number % 2 == 0 else (False, True)
        for gather in order:
            rounds[gather].append(float(np.median(cpu_times(built[gather], args.calls))))
    gather, copy = np.array(rounds[True]), np.array(rounds[False])
    ratios = copy / gather
    return {
        "gather_ms": float(np.median(gather)) * 1e3,
        "copy_ms": float(np.median(copy)) * 1e3,
        "ratio": float(np.median(ratios)),
        "p10": float(np.percentile(ratios, 10)),
        "p90": float(np.percentile(ratios, 90)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument(
        "--min-stride", type=int, default=2,
        help="ConvGemmConfig.gather_min_stride of the gather variant (1: unit strides too)",
    )  # fmt: skip
    parser.add_argument(
        "--conv", action="append", default=[], metavar="KEY=VALUE",
        help="a ConvGemmConfig field for both variants (path=gemm: the GEMM path forced)",
    )  # fmt: skip
    args = parser.parse_args()
    args.conv = dict(item.split("=", 1) for item in args.conv)

    from stagegraph.app.host import describe, host_info

    print(f"{describe(host_info())}; 1 thread; thread CPU time; shared machine: under load\n")
    print("| workload | gather ms | copy+pack ms | copy / gather [p10, p90] |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.workloads:
            row = measure(workload_spec(name, Path(folder)), args)
            label = Path(name).stem if name.endswith(".mlir") else name
            if "error" in row:
                print(f"| {label} | error: {row['error'][:120]} | | |", flush=True)
                continue
            print(
                f"| {label} | {row['gather_ms']:.3f} | {row['copy_ms']:.3f} | "
                f"{row['ratio']:.2f} [{row['p10']:.2f}, {row['p90']:.2f}] |",
                flush=True,
            )


if __name__ == "__main__":
    main()
