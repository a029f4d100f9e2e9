"""3-D convolution payloads: x86 variants against PyTorch eager, interleaved in one process
by thread CPU time (the loaded-machine protocol of ``benchmarks/conv_patch_gather.py``).

Each payload (a KernelBench ``.mlir`` with its ``.npz`` and problem file) is compiled once
per variant through the x86 graph (each must verify), PyTorch runs the problem's ``Model``
at the manifest's scaled constants (``benchmarks/conv_vs_torch.py``), then rounds alternate
the order of all sides; per round each side runs ``--calls`` times and ``time.thread_time``
measures each call (one thread: the compiled code and PyTorch's intra-op work run in this
thread). Per payload and variant it prints the median thread time, torch / variant (the
median of the per-round ratios, with their 10th-90th percentiles; above 1 the x86 code is
faster), and each side's fraction of the FMA peak. A variant is ``NAME`` or
``NAME:key=value,key=value`` where a key is a generic param (``conv_reduction_tile``) or,
prefixed ``conv.``, a ``ConvGemmConfig`` field of ``x86.normalize`` (``conv.path=gemm``).
The path before the channels-last 3-D kernel (the 3-D convolutions as depth loops of 2-D
ones, the 2-D cost model for direct or GEMM and col2im) is
``before:conv3d_direct=false,conv.direct3d=false``. Usage:

    python benchmarks/conv3d_rounds.py ../shared/kernelbench/level2 --match l2_077,l2_027
        [--variant before:conv3d_direct=false,conv.direct3d=false --variant after]
        [--rounds 12] [--calls 3] [--target x86-64-v3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def parse_variant(text: str) -> tuple[str, dict, dict]:
    """``NAME[:k=v,...]`` -> (name, generic params, ConvGemmConfig fields)."""
    name, _, spec = text.partition(":")
    params: dict = {}
    conv: dict = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        parsed: object = {"true": True, "false": False}.get(value.lower(), value)
        if isinstance(parsed, str) and parsed.lstrip("-").isdigit():
            parsed = int(parsed)
        if key.startswith("conv."):
            conv[key[5:]] = parsed
        else:
            params[key] = parsed
    return name, params, conv


def cpu_times(side, calls: int) -> np.ndarray:
    """Thread CPU time of each of ``calls`` calls of a prepared measurement."""
    out = np.empty(calls)
    for i in range(calls):
        start = time.thread_time()
        side.measure(1)
        out[i] = time.thread_time() - start
    return out


def build(path: Path, variant: tuple[str, dict, dict], target: str | None):
    """The compiled, verified x86 measurement of one variant (or an error string)."""
    from stagegraph.app.bench import prepare
    from stagegraph.app.session import Session, SessionRequest

    _, params, conv = variant
    request = SessionRequest(
        graph="x86", workload=str(path), threads=1, target=target, params=params
    )
    session = Session(request)
    graph = session.graph.with_config("normalize", **conv) if conv else session.graph
    built = prepare(session.engine, graph, session.workload, None)
    if not built.verdict.ok:
        return f"{variant[0]}: {built.verdict.message[:160]}"
    return built


def measure(entry: dict, folder: Path, variants: list, args: argparse.Namespace) -> dict:
    """All variants and PyTorch of one payload, verified, then timed in rounds."""
    from conv_vs_torch import TorchMeasurement, problem_file

    sides = {}
    for variant in variants:
        built = build(folder / entry["mlir"], variant, args.target)
        if isinstance(built, str):
            return {"error": built}
        sides[variant[0]] = built
    workload = next(iter(sides.values())).workload
    problem = problem_file(folder, entry["stem"])
    sides["torch"] = TorchMeasurement(problem, entry.get("scaled_constants") or {}, 1, workload)
    for side in sides.values():
        side.measure(1, warmup=2)
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for number in range(args.rounds):
        order = names if number % 2 == 0 else names[::-1]
        for name in order:
            rounds[name].append(float(np.median(cpu_times(sides[name], args.calls))))
    torch = np.array(rounds["torch"])
    row = {"torch_s": float(np.median(torch)), "variants": {}}
    for name in names[:-1]:
        times = np.array(rounds[name])
        ratios = torch / times
        row["variants"][name] = {
            "s": float(np.median(times)), "ratio": float(np.median(ratios)),
            "p10": float(np.percentile(ratios, 10)), "p90": float(np.percentile(ratios, 90)),
        }  # fmt: skip
    return row


def thread_peak_gflops(target) -> float:
    """The FMA peak of one thread by thread CPU time (``stagegraph.app.fma_peak``'s loop,
    the best of 20 calls): wall time on a loaded machine counts the other processes' turns."""
    from stagegraph.app.fma_peak import build_fma_loop

    loop = build_fma_loop(1, target)
    loop.run()
    best = min(_timed(loop.run) for _ in range(20))
    return loop.flops / best / 1e9


def _timed(call) -> float:
    start = time.thread_time()
    call()
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--match", required=True, help="payload stems (comma-separated parts)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME[:k=v,...]")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in (args.variant or ["x86"])]

    import torch
    from conv_vs_torch import conv_payloads

    from stagegraph.app.host import describe, host_info
    from stagegraph.stages.target import resolve_target

    torch.set_num_threads(1)
    target = resolve_target(args.target) if args.target else None
    peak = thread_peak_gflops(target)
    print(f"{describe(host_info())}; PyTorch {torch.__version__} eager (oneDNN)  ")
    print(f"1 thread, timed by thread CPU time; FMA peak {peak:.1f} GFLOP/s (likewise); ", end="")
    print("shared machine: under load\n")
    print("| payload | variant | ms | torch ms | torch/x86 [p10, p90] | x86 peak | torch peak |")
    print("|---|---|---|---|---|---|---|")
    for entry in conv_payloads(args.folder, args.match):
        row = measure(entry, args.folder, variants, args)
        if "error" in row:
            print(f"| {entry['stem']} | error: {row['error']} | | | | | |", flush=True)
            continue
        flops = entry.get("flops") or 0
        torch_peak = flops / row["torch_s"] / 1e9 / peak
        for name, v in row["variants"].items():
            print(
                f"| {entry['stem'][:40]} | {name} | {v['s'] * 1e3:.3f} | "
                f"{row['torch_s'] * 1e3:.3f} | {v['ratio']:.2f} [{v['p10']:.2f}, "
                f"{v['p90']:.2f}] | {flops / v['s'] / 1e9 / peak:.0%} | {torch_peak:.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
