"""Direct path against implicit GEMM (and the cost model's pick against PyTorch eager) for
dense convolutions at real sizes, one process, interleaved.

Each shape is a bias-free ``nn.Conv2d``/``nn.Conv3d`` (batch ``n``, ``cin`` -> ``cout``
channels, a cubic/square ``hw`` input, a ``k`` window, ``stride``, ``padding`` k//2) that
this script writes as a PyTorch workload file and compiles three ways through the x86
graph: every convolution on the direct path (``x86.normalize``'s ``path="direct"``), on the
implicit GEMM (``path="gemm"``), and as the cost model chooses (``path="auto"``, the
default). It prints, per shape, the medians of direct, GEMM and PyTorch (timed in pairs:
direct against GEMM, the pick against PyTorch, each pair interleaved by
``stagegraph.app.bench.compare``), each side's fraction of the FMA peak
(``stagegraph.app.fma_peak``), which path the cost model took, and whether it was the
faster. Fitting data for :mod:`stagegraph.stages.x86.conv.choice`. Usage:

    python benchmarks/conv_paths.py [--shapes resnet18|vgg16|small|all] [--match TEXT]
        [--threads 1] [--budget 1] [--target x86-64-v4] [--json]

On a shared, loaded machine the ratios are noisy: a ratio marked ``~`` had samples too
spread to quote.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

_MODEL = """import torch
import torch.nn as nn
n, cin, cout, hw, k, stride, dims = 1, 64, 64, 56, 3, 1, 2
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        self.conv = conv(cin, cout, k, stride=stride, padding=k // 2, bias=False)
    def forward(self, x):
        return self.conv(x)
def get_inputs():
    return [torch.rand(n, cin, *[hw] * dims)]
def get_init_inputs():
    return []
"""

#: name -> (n, cin, cout, hw, k, stride, dims): the distinct convolutions of ResNet-18 and
#: VGG-16 at batch 1 on 224x224 images, and small shapes like KernelBench's level 1.
SHAPES = {
    "resnet18": {
        "r18.conv1": (1, 3, 64, 224, 7, 2, 2),
        "r18.l1": (1, 64, 64, 56, 3, 1, 2),
        "r18.l2.s2": (1, 64, 128, 56, 3, 2, 2),
        "r18.l2": (1, 128, 128, 28, 3, 1, 2),
        "r18.l2.down": (1, 64, 128, 56, 1, 2, 2),
        "r18.l3.s2": (1, 128, 256, 28, 3, 2, 2),
        "r18.l3": (1, 256, 256, 14, 3, 1, 2),
        "r18.l4.s2": (1, 256, 512, 14, 3, 2, 2),
        "r18.l4": (1, 512, 512, 7, 3, 1, 2),
    },
    "vgg16": {
        "vgg.b1a": (1, 3, 64, 224, 3, 1, 2),
        "vgg.b1b": (1, 64, 64, 224, 3, 1, 2),
        "vgg.b2": (1, 128, 128, 112, 3, 1, 2),
        "vgg.b3": (1, 256, 256, 56, 3, 1, 2),
        "vgg.b4": (1, 512, 512, 28, 3, 1, 2),
        "vgg.b5": (1, 512, 512, 14, 3, 1, 2),
    },
    "small": {
        "s.c32.hw16.n8": (8, 32, 32, 16, 3, 1, 2),
        "s.c16.hw16.n16": (16, 16, 16, 16, 3, 1, 2),
        "s.c3f16.3d": (8, 3, 16, 16, 3, 1, 3),
        "s.c64.hw32.n4": (4, 64, 64, 32, 3, 1, 2),
        "s.c128.hw16.n2": (2, 128, 128, 16, 3, 1, 2),
        "s3.c32.hw16": (1, 32, 32, 16, 3, 1, 3),
        "s3.c64.hw16": (1, 64, 64, 16, 3, 1, 3),
    },
    # few input channels (8-16: the first layers of small CNNs, KernelBench's level-2
    # Conv2d + epilogue modules) into 16-128 filters
    "few": {
        "f.c8f64.hw32.n16": (16, 8, 64, 32, 3, 1, 2),
        "f.c8f32.hw32.n16": (16, 8, 32, 32, 3, 1, 2),
        "f.c16f64.hw32.n16": (16, 16, 64, 32, 3, 1, 2),
        "f.c8f128.hw64.n4": (4, 8, 128, 64, 3, 1, 2),
        "f.c16f64.hw112.n1": (1, 16, 64, 112, 3, 1, 2),
        "f.c4f64.hw64.n4": (4, 4, 64, 64, 3, 1, 2),
        "f.c8f64.k5.hw32.n8": (8, 8, 64, 32, 5, 1, 2),
    },
}


def shape_spec(model: Path, shape: tuple[int, ...]) -> str:
    """The ``FILE.py:k=v,...`` workload of one shape."""
    names = ("n", "cin", "cout", "hw", "k", "stride", "dims")
    return f"{model}:" + ",".join(f"{k}={v}" for k, v in zip(names, shape, strict=True))


def measure(name: str, spec: str, args: argparse.Namespace, peak: float) -> dict:
    """Direct against GEMM, then the cost model's pick against PyTorch."""
    from stagegraph.app.bench import BenchOptions, compare, prepare
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.app.torch_peer import TorchMeasurement

    request = SessionRequest(graph="x86", workload=spec, threads=args.threads, target=args.target)
    session = Session(request)
    picked = chosen_paths(session, session.graph)
    built = {}
    for path in ("direct", "gemm", "auto"):
        graph = session.graph.with_config("normalize", path=path)
        built[path] = prepare(session.engine, graph, session.workload, None)
        if not built[path].verdict.ok:
            return {"shape": name, "error": f"{path}: {built[path].verdict.message}"}
    options = BenchOptions(warmup=2, repeat=10, budget_s=args.budget, min_time_s=args.budget / 2)
    paths = compare(built["direct"], built["gemm"], options, args.threads)
    peer = TorchMeasurement(session.workload, args.threads)
    vs = compare(built["auto"], peer, options, args.threads)
    flops = session.workload.complexity.flops
    row = {
        "shape": name, "direct_ms": paths.a.median_s * 1e3, "gemm_ms": paths.b.median_s * 1e3,
        "gemm_over_direct": paths.ratio, "pick": ",".join(picked) or "-",
        "auto_ms": vs.a.median_s * 1e3, "torch_ms": vs.b.median_s * 1e3,
        "torch_over_auto": 1 / vs.ratio, "trustworthy": paths.trustworthy and vs.trustworthy,
    }  # fmt: skip
    for side in ("direct", "gemm", "torch", "auto"):
        row[f"{side}_peak"] = flops / (row[f"{side}_ms"] * 1e-3) / 1e9 / peak
    return row


def chosen_paths(session, graph) -> list[str]:
    """The paths ``x86.normalize`` stamped on the payload's convolutions."""
    from stagegraph.stages.x86.conv.choice import stamped_choices

    result = session.engine.run(graph, session.workload, until="normalize")
    return [c.path for c in stamped_choices(result.value("normalize", "module").ir)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="all", choices=[*SHAPES, "all"])
    parser.add_argument("--match", help="only shapes whose name contains this")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per comparison")
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument("--json", action="store_true", help="one JSON line per shape")
    args = parser.parse_args()

    import torch

    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.app.host import describe, host_info
    from stagegraph.stages.target import resolve_target

    target = resolve_target(args.target) if args.target else None
    peak = fma_peak_gflops(args.threads, target)
    groups = SHAPES if args.shapes == "all" else {args.shapes: SHAPES[args.shapes]}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "conv_shape.py"
        model.write_text(_MODEL)
        for shapes in groups.values():
            for name, shape in shapes.items():
                if args.match and args.match not in name:
                    continue
                try:
                    row = measure(name, shape_spec(model, shape), args, peak)
                except Exception as error:  # one shape failing keeps the others
                    row = {"shape": name, "error": str(error)[:200]}
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
    print(f"{describe(host_info())}; PyTorch {torch.__version__} eager (oneDNN)  ")
    print(f"threads {args.threads}; FMA peak {peak:.1f} GFLOP/s; shared machine: noisy  \n")
    print(table(rows))


def table(rows: list[dict]) -> str:
    """A markdown table: times, fractions of the FMA peak, the pick and PyTorch's ratio."""
    head = (
        "| shape | direct ms (peak) | GEMM ms (peak) | GEMM/direct speed | pick | "
        "pick ms | torch ms (peak) | torch/pick |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | FAILED: {r['error'][:80]} | | | | | | |")
            continue
        mark = "" if r["trustworthy"] else "~"
        lines.append(
            f"| {r['shape']} | {r['direct_ms']:.3f} ({r['direct_peak']:.0%}) | "
            f"{r['gemm_ms']:.3f} ({r['gemm_peak']:.0%}) | {mark}{r['gemm_over_direct']:.2f} | "
            f"{r['pick']} | {r['auto_ms']:.3f} | {r['torch_ms']:.3f} ({r['torch_peak']:.0%}) | "
            f"{mark}{r['torch_over_auto']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
