"""Tensor-core matmuls of the gpu graph against ``torch.matmul`` (cuBLAS), side by side.

On the CPU machine (compiles; needs the MLIR bindings; for ``sm_90a`` the matmuls that
split into 128-row blocks take the wgmma + TMA path, the others ``mma.sync``):

    python benchmarks/gpu_matmul.py --build build/gpu-mm [--target sm_90a] [--shapes 1000x1000x1000]

On the GPU machine (numpy, cuda-bindings and torch; no pydantic, no MLIR):

    python benchmarks/gpu_matmul.py --run build/gpu-mm

Each case is ``C[m, n] (f32) = A[m, k] @ B[k, n]`` with f16 or bf16 inputs: one artifact
folder per case (manifest and PTX only, a few KiB) and ``cases.json`` with the shapes and
the target's datasheet tensor-core peak. The run side checks every result against
``torch.matmul`` of the same inputs in f32 (relative error ``||out - ref|| / ||ref||``),
then times the artifact's launches (the zero fill and the matmul) and ``torch.matmul`` in
the input dtype with CUDA events (median after warm-up) and prints the ratio
(``torch_ms / ours_ms``: above 1 is faster than cuBLAS), TFLOP/s and the fraction of the
datasheet peak and of the best cuBLAS rate measured in the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: The issue's shapes: square at 4096 and 8192, and awkward ones (m, n, k).
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 8192), (8192, 1024, 4096),
          (1000, 1000, 1000))  # fmt: skip
DTYPES = ("bf16", "f16")
TOLERANCE = 2e-2  # f16/bf16 inputs, f32 accumulation in a different order than cuBLAS


def matmul_payload(m: int, n: int, k: int, dtype: str) -> str:
    """The MLIR of one case: a zero fill and a ``linalg.matmul`` into f32."""
    a, b, c = f"tensor<{m}x{k}x{dtype}>", f"tensor<{k}x{n}x{dtype}>", f"tensor<{m}x{n}xf32>"
    return (
        f"func.func @mm(%a: {a}, %b: {b}) -> {c} {{\n"
        "  %zero = arith.constant 0.0 : f32\n"
        f"  %empty = tensor.empty() : {c}\n"
        f"  %init = linalg.fill ins(%zero : f32) outs(%empty : {c}) -> {c}\n"
        f"  %c = linalg.matmul ins(%a, %b : {a}, {b}) outs(%init : {c}) -> {c}\n"
        f"  return %c : {c}\n}}\n"
    )


def build(directory: Path, target: str, shapes: list[tuple[int, int, int]],
          params: list[str] | None = None, compare_mma_sync: bool = False) -> int:  # fmt: skip
    """Compile every case for ``target`` into ``directory`` (one folder per case), with
    the cost model's ``params`` overridden (``wgmma=false``: the sm_90a matmuls on
    ``mma.sync``); ``compare_mma_sync`` builds each case a second time that way (suffix
    ``_mmasync``), so one run times both paths."""
    sys.path.insert(0, str(ROOT))
    from stagegraph.stages.gpu.target import resolve_gpu_target

    facts = resolve_gpu_target(target)
    variants = [("", list(params or []))]
    if compare_mma_sync:
        variants.append(("_mmasync", [*(params or []), "wgmma=false"]))
    cases = []
    for m, n, k in shapes:
        for dtype in DTYPES:
            source = directory / "src" / f"{dtype}_{m}x{n}x{k}.mlir"
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(matmul_payload(m, n, k, dtype))
            for suffix, chosen in variants:
                name = f"{dtype}_{m}x{n}x{k}{suffix}"
                case = _build_case(directory / name, source, target, chosen)
                cases.append({"name": name, "m": m, "n": n, "k": k, "dtype": dtype, **case})
                print(f"built {name}: {case['path']}", flush=True)
    peaks = {d: facts.peak_tflops(d, tensor_cores=True) for d in DTYPES}
    meta = {"target": target, "cases": cases, "peak_tflops": peaks}
    (directory / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


def _build_case(folder: Path, source: Path, target: str, params: list[str]) -> dict:
    """Emit one artifact; returns what the cost model chose for its matmul."""
    import stagegraph as sg

    sg.run("gpu", str(source), target=target, emit="object", output=str(folder),
           param=params or None)  # fmt: skip
    chosen = sg.run("gpu", str(source), target=target, until="select",
                    param=params or None).value("select")  # fmt: skip
    plan = chosen.kernels[-1]  # the matmul (after its fill)
    path = ("wgmma-ws" if plan.warp_specialized else "wgmma") if plan.stages else (
        "mma.sync" if plan.mma else "simt")  # fmt: skip
    return {"mma": list(plan.mma), "tile": [plan.tile_m, plan.tile_n], "path": path,
            "stages": plan.stages}  # fmt: skip


def _events_ms(fn, repeats: int, warmup: int = 3) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + repeats):
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def run_case(folder: Path, case: dict, repeats: int) -> dict:
    """Verify one case against torch and time both."""
    import torch
    from gpu_check import load_artifact, relative_error

    from stagegraph.runtime.cuda import CudaProgram

    m, n, k = case["m"], case["n"], case["k"]
    kind = {"bf16": torch.bfloat16, "f16": torch.float16}[case["dtype"]]
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=kind, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=kind, generator=generator)
    raw = [x.cpu().view(torch.int16).numpy().view(np.uint16) if kind == torch.bfloat16
           else x.cpu().numpy() for x in (a, b)]  # fmt: skip
    program = CudaProgram(*load_artifact(folder))
    try:
        (out,) = program.run(raw)
        ours = statistics.median(program.time_ms(repeats))
    finally:
        program.close()
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = (a.float() @ b.float()).cpu().numpy()
    error = relative_error(out, ref)
    theirs = _events_ms(lambda: torch.matmul(a, b), repeats)
    flops = 2.0 * m * n * k
    return {"case": case["name"], "ok": error <= TOLERANCE, "error": error, "ms": ours,
            "torch_ms": theirs, "ratio": theirs / ours, "tflops": flops / ours / 1e9,
            "torch_tflops": flops / theirs / 1e9, "tensor_cores": bool(case["mma"]),
            "path": case.get("path", "")}  # fmt: skip


def run(directory: Path, repeats: int) -> int:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from stagegraph.errors import GpuUnavailableError
    from stagegraph.runtime.cuda import device_properties

    meta = json.loads((directory / "cases.json").read_text())
    try:
        props = device_properties(0)
    except GpuUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"GPU: {props['name']}; artifacts built for {meta['target']}", flush=True)
    rows = []
    for case in meta["cases"]:
        try:
            row = run_case(directory / case["name"], case, repeats)
        except Exception as error:  # a failing case is a row that says why
            row = {"case": case["name"], "ok": False, "failure": f"{type(error).__name__}: "
                   f"{error}"[:160]}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    best = max((r.get("torch_tflops", 0.0) for r in rows), default=0.0) or 1.0
    print(f"\n{'case':32} {'ok':3} {'ours ms':>9} {'cuBLAS ms':>9} {'ratio':>6} "
          f"{'TFLOP/s':>8} {'% peak':>7} {'% best cuBLAS':>13} path")  # fmt: skip
    for r in rows:
        if "ms" not in r:
            print(f"{r['case']:32} no  {r['failure']}")
            continue
        peak = meta["peak_tflops"][r["case"].split("_")[0]]
        print(f"{r['case']:32} {'yes' if r['ok'] else 'NO':3} {r['ms']:9.3f} "
              f"{r['torch_ms']:9.3f} {r['ratio']:6.2f} {r['tflops']:8.1f} "
              f"{100 * r['tflops'] / peak:6.1f}% {100 * r['tflops'] / best:12.1f}% "
              f"{r.get('path', '')}")  # fmt: skip
    return 0 if all(r.get("ok") for r in rows) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--build", type=Path, help="compile the cases into this folder")
    group.add_argument("--run", type=Path, help="run the cases of this folder on the GPU")
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument("--shapes", nargs="*", help="MxNxK shapes instead of the issue's")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--param", nargs="*", default=[],
                        help="cost-model params for --build, e.g. wgmma=false")  # fmt: skip
    parser.add_argument(
        "--compare-mma-sync",
        action="store_true",
        help="--build each case on mma.sync too (suffix _mmasync)",
    )
    args = parser.parse_args()
    if args.build:
        shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes
                  else list(SHAPES))  # fmt: skip
        return build(args.build, args.target, shapes, args.param, args.compare_mma_sync)
    return run(args.run, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
