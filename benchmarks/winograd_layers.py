"""Winograd against the other convolution paths and PyTorch eager on 3x3 stride-1 layers,
one process, interleaved.

Each shape is a bias-free ``nn.Conv2d`` (batch ``n``, ``cin`` -> ``cout``, a square ``hw``
input, 3x3, stride 1, padding 1) written as a PyTorch workload (the model of
``benchmarks/conv_paths.py``), compiled through the x86 graph three ways: ``old`` (Winograd
off: the cost model picks direct or GEMM as before), ``winograd`` (``path="winograd"``,
F(``--tile``, 3)) and ``auto`` (the cost model with Winograd on). Per shape it prints the
medians of old and Winograd timed in one interleaved pair, Winograd's speed over old, the
pick and the pick against PyTorch (another interleaved pair), each side's fraction of the
FMA peak. Times are of ``stagegraph.app.bench.compare`` (interleaved; on a shared machine
a ratio marked ``~`` had samples too spread to quote). Usage:

    python benchmarks/winograd_layers.py [--match TEXT] [--tile 2|4] [--budget 1]
        [--target x86-64-v4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

#: name -> (n, cin, cout, hw, k, stride, dims): 3x3 stride-1 layers of ResNet-18, VGG-16
#: and UNet at batch 1 on 224x224 images, and small ones like KernelBench's.
SHAPES = {
    "c64.hw56": (1, 64, 64, 56, 3, 1, 2),
    "c64.hw224": (1, 64, 64, 224, 3, 1, 2),
    "c128.hw28": (1, 128, 128, 28, 3, 1, 2),
    "c128.hw112": (1, 128, 128, 112, 3, 1, 2),
    "c256.hw14": (1, 256, 256, 14, 3, 1, 2),
    "c256.hw56": (1, 256, 256, 56, 3, 1, 2),
    "c512.hw7": (1, 512, 512, 7, 3, 1, 2),
    "c512.hw28": (1, 512, 512, 28, 3, 1, 2),
    "c16.hw16.n16": (16, 16, 16, 16, 3, 1, 2),
    "c32.hw16.n8": (8, 32, 32, 16, 3, 1, 2),
    "c3f64.hw224": (1, 3, 64, 224, 3, 1, 2),
}


def measure(name: str, spec: str, args: argparse.Namespace, peak: float) -> dict:
    """Old paths against Winograd, then the cost model's pick against PyTorch."""
    from conv_paths import chosen_paths

    from stagegraph.app.bench import BenchOptions, compare, prepare
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.app.torch_peer import TorchMeasurement

    request = SessionRequest(graph="x86", workload=spec, threads=1, target=args.target)
    session = Session(request)
    graphs = {
        "old": session.graph.with_config("normalize", winograd=False),
        "winograd": session.graph.with_config(
            "normalize", path="winograd", winograd_tile=args.tile
        ),
        "auto": session.graph.with_config("normalize", winograd_tile=args.tile),
    }
    picked = chosen_paths(session, graphs["auto"])
    built = {}
    for key, graph in graphs.items():
        built[key] = prepare(session.engine, graph, session.workload, None)
        if not built[key].verdict.ok:
            return {"shape": name, "error": f"{key}: {built[key].verdict.message}"}
    options = BenchOptions(warmup=2, repeat=10, budget_s=args.budget, min_time_s=args.budget / 2)
    paths = compare(built["old"], built["winograd"], options, 1)
    vs = compare(built["auto"], TorchMeasurement(session.workload, 1), options, 1)
    flops = session.workload.complexity.flops
    row = {
        "shape": name, "old_ms": paths.a.median_s * 1e3, "wino_ms": paths.b.median_s * 1e3,
        "wino_over_old": paths.ratio, "pick": ",".join(picked) or "-",
        "auto_ms": vs.a.median_s * 1e3, "torch_ms": vs.b.median_s * 1e3,
        "torch_over_auto": 1 / vs.ratio, "trustworthy": paths.trustworthy and vs.trustworthy,
    }  # fmt: skip
    for side in ("old", "wino", "torch", "auto"):
        row[f"{side}_peak"] = flops / (row[f"{side}_ms"] * 1e-3) / 1e9 / peak
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--match", help="only shapes whose name contains this")
    parser.add_argument("--tile", type=int, default=2, choices=(2, 4))
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per comparison")
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    args = parser.parse_args()

    import torch
    from conv_paths import _MODEL, shape_spec

    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.app.host import describe, host_info
    from stagegraph.stages.target import resolve_target

    target = resolve_target(args.target) if args.target else None
    peak = fma_peak_gflops(1, target)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "conv_shape.py"
        model.write_text(_MODEL)
        for name, shape in SHAPES.items():
            if args.match and args.match not in name:
                continue
            try:
                row = measure(name, shape_spec(model, shape), args, peak)
            except Exception as error:  # one shape failing keeps the others
                row = {"shape": name, "error": str(error)[:200]}
            rows.append(row)
            print(row, flush=True)
    print(f"{describe(host_info())}; PyTorch {torch.__version__} eager (oneDNN)  ")
    print(f"1 thread; F({args.tile}, 3); FMA peak {peak:.1f} GFLOP/s (direct-equivalent "
          "flops); shared machine, under load  \n")  # fmt: skip
    print(table(rows))


def table(rows: list[dict]) -> str:
    """A markdown table: times, fractions of the FMA peak, Winograd/old, pick, torch/pick."""
    head = (
        "| shape | old ms (peak) | Winograd ms (peak) | Winograd/old speed | pick | "
        "pick ms | torch ms (peak) | torch/pick |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | FAILED: {r['error'][:80]} | | | | | | |")
            continue
        mark = "" if r["trustworthy"] else "~"
        lines.append(
            f"| {r['shape']} | {r['old_ms']:.3f} ({r['old_peak']:.0%}) | "
            f"{r['wino_ms']:.3f} ({r['wino_peak']:.0%}) | {mark}{r['wino_over_old']:.2f} | "
            f"{r['pick']} | {r['auto_ms']:.3f} | {r['torch_ms']:.3f} ({r['torch_peak']:.0%}) | "
            f"{mark}{r['torch_over_auto']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
