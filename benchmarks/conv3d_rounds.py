"""3-D convolution payloads: x86 variants against PyTorch eager, interleaved in one process
by thread CPU time (the loaded-machine protocol of ``benchmarks/conv_patch_gather.py``).

Each payload (a KernelBench ``.mlir`` with its ``.npz`` and problem file) is compiled once
per variant through the x86 graph (each must verify), PyTorch runs the problem's ``Model``
at the manifest's scaled constants (``benchmarks/conv_vs_torch.py``), then rounds alternate
the order of all sides; per round each side runs ``--calls`` times and ``time.thread_time``
measures each call (one thread: the compiled code and PyTorch's intra-op work run in this
thread). Per payload and variant it prints the median thread time, torch / variant and the
first variant / this one (the medians of the per-round ratios, with their 10th-90th
percentiles; above 1 this variant is faster), and each side's fraction of the FMA peak
(measured by thread CPU time too). A problem PyTorch cannot run at the manifest's scaled
constants is timed without it. A variant is ``NAME`` or
``NAME:key=value,key=value`` where a key is a generic param (``conv_reduction_tile``) or,
prefixed ``conv.``, a ``ConvGemmConfig`` field of ``x86.normalize`` (``conv.path=gemm``).
The code before the channels-last 3-D kernel (the 3-D convolutions as depth loops of 2-D
ones, the 2-D cost model for direct or GEMM and col2im, reductions chunked with a masked
tail) is ``before:conv3d_direct=false,conv.direct3d=false,reduction_whole_tail=false``.
Usage:

    python benchmarks/conv3d_rounds.py ../shared/kernelbench/level2 --match l2_077,l2_027
        [--variant before:conv3d_direct=false,conv.direct3d=false,reduction_whole_tail=false
         --variant after] [--rounds 12] [--calls 3] [--target x86-64-v3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from conv_patch_gather import cpu_times


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


def _torch_side(entry: dict, folder: Path, workload):
    """PyTorch eager on the problem file, or why not (a constant the manifest does not
    scale, say: its shapes would not match the payload's)."""
    from conv_vs_torch import TorchMeasurement, problem_file

    try:
        problem = problem_file(folder, entry["stem"])
        side = TorchMeasurement(problem, entry.get("scaled_constants") or {}, 1, workload)
        side.measure(1, warmup=2)
    except Exception as error:  # the x86 variants are still compared with each other
        return f"{type(error).__name__}: {str(error)[:80]}"
    return side


def _spread(ratios: np.ndarray) -> dict:
    return {
        "ratio": float(np.median(ratios)),
        "p10": float(np.percentile(ratios, 10)),
        "p90": float(np.percentile(ratios, 90)),
    }


def measure(entry: dict, folder: Path, variants: list, args: argparse.Namespace) -> dict:
    """All variants and PyTorch of one payload, verified, then timed in rounds."""
    sides = {}
    for variant in variants:
        built = build(folder / entry["mlir"], variant, args.target)
        if isinstance(built, str):
            return {"error": built}
        built.measure(1, warmup=2)
        sides[variant[0]] = built
    torch = _torch_side(entry, folder, next(iter(sides.values())).workload)
    if not isinstance(torch, str):
        sides["torch"] = torch
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for number in range(args.rounds):
        order = names if number % 2 == 0 else names[::-1]
        for name in order:
            rounds[name].append(float(np.median(cpu_times(sides[name], args.calls))))
    times = {name: np.array(values) for name, values in rounds.items()}
    first = times[variants[0][0]]
    row: dict = {"torch_s": None, "torch_error": torch if isinstance(torch, str) else None}
    if "torch" in times:
        row["torch_s"] = float(np.median(times["torch"]))
    row["variants"] = {
        name: {
            "s": float(np.median(times[name])),
            "vs_first": _spread(first / times[name]),
            "vs_torch": _spread(times["torch"] / times[name]) if "torch" in times else None,
        }
        for name, _, _ in variants
    }
    return row


def _cells(flops: float, peak: float, row: dict, name: str) -> str:
    """One variant's markdown cells."""
    v = row["variants"][name]

    def spread(s: dict | None) -> str:
        return "-" if s is None else f"{s['ratio']:.2f} [{s['p10']:.2f}, {s['p90']:.2f}]"

    torch = row["torch_s"]
    cells = [
        name, f"{v['s'] * 1e3:.3f}", "-" if torch is None else f"{torch * 1e3:.3f}",
        spread(v["vs_torch"]), spread(v["vs_first"]), f"{flops / v['s'] / 1e9 / peak:.0%}",
        "-" if torch is None else f"{flops / torch / 1e9 / peak:.0%}",
    ]  # fmt: skip
    return " | ".join(cells)


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
    first = variants[0][0]
    print(
        f"| payload | variant | ms | torch ms | torch/x86 [p10, p90] | {first}/x86 [p10, p90] "
        "| x86 peak | torch peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for entry in conv_payloads(args.folder, args.match):
        row = measure(entry, args.folder, variants, args)
        if "error" in row:
            print(f"| {entry['stem']} | error: {row['error']} | | | | | |", flush=True)
            continue
        flops = entry.get("flops") or 0
        for name, _, _ in variants:
            print(f"| {entry['stem'][:40]} | {_cells(flops, peak, row, name)} |", flush=True)
        if row["torch_error"]:
            print(f"| {entry['stem'][:40]} | torch: {row['torch_error']} | | | | | | |")


if __name__ == "__main__":
    main()
