"""Tensor-core matmuls of the gpu graph against ``torch.matmul`` (cuBLAS), side by side.

On the CPU machine (compiles; needs the MLIR bindings; for ``sm_90a`` the matmuls that
split into 128-row blocks take the wgmma + TMA path, the others ``mma.sync``: the build
passes ``wgmma=true``, which the cost model leaves off by default, unless ``--param``
sets ``wgmma`` itself):

    python benchmarks/gpu_matmul.py --build build/gpu-mm [--target sm_90a] [--shapes 1000x1000x1000]
        [--linear ../shared/kernelbench/src/level2 [--only 'l2_0[0-5]*']] [--batch 1024]
        [--features 1024]

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

``--linear DIR`` adds the Linear + epilogue problems of KernelBench level 2 found in DIR
(``*Gemm*``/``*Matmul*`` problem files), in bf16, at ``--batch`` rows (1024) and
``--features`` in and out features: each is exported once (``torch.export``), compiled by
the gpu graph (the epilogue in the matmul's kernel) and saved beside it (``model.pt2``, the
inputs), so the run side times PyTorch CUDA eager on the same program (the epilogue as
separate kernels) against the artifact and checks the outputs against each other. A case
is about 8 MiB at 1024 features (weights in the artifact and in ``model.pt2``, the
inputs), so build a few per folder (``--only`` patterns) to stay under what a device call
carries (64 MiB); the MLIR sources go to ``DIR-src``, beside the folder.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

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


def sources(directory: Path) -> Path:
    """Where the build writes the cases' MLIR (beside the folder: the run side needs none)."""
    return directory.with_name(directory.name + "-src")


def build(directory: Path, target: str, shapes: list[tuple[int, int, int]],
          params: list[str] | None = None, compare_mma_sync: bool = False,
          linear: Path | None = None, batch: int = 1024, features: int = 1024,
          only: list[str] | None = None) -> int:  # fmt: skip
    """Compile every case for ``target`` into ``directory`` (one folder per case), with
    the cost model's ``params`` overridden (``wgmma=false``: the sm_90a matmuls on
    ``mma.sync``); ``compare_mma_sync`` builds each case a second time that way (suffix
    ``_mmasync``), so one run times both paths. ``linear``: the level-2 Linear + epilogue
    problem files to build too (``only``: glob patterns), in bf16 at ``batch`` rows."""
    sys.path.insert(0, str(ROOT))
    from stagegraph.stages.gpu.target import resolve_gpu_target

    facts = resolve_gpu_target(target)
    params = with_wgmma(params)
    variants = [("", params)]
    if compare_mma_sync:
        variants.append(("_mmasync", [*params, "wgmma=false"]))
    cases = []
    for m, n, k in shapes:
        for dtype in DTYPES:
            source = sources(directory) / f"{dtype}_{m}x{n}x{k}.mlir"
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(matmul_payload(m, n, k, dtype))
            for suffix, chosen in variants:
                name = f"{dtype}_{m}x{n}x{k}{suffix}"
                case = _build_case(directory / name, source, target, chosen)
                cases.append({"name": name, "m": m, "n": n, "k": k, "dtype": dtype, **case})
                print(f"built {name}: {case['path']}", flush=True)
    for problem in sorted(linear.glob("*.py")) if linear else []:
        wanted = not only or any(fnmatch.fnmatch(problem.stem, p) for p in only)
        if wanted and ("Gemm" in problem.name or "Matmul" in problem.name):
            cases.append(build_linear(directory, target, problem, batch, features, params))
    peaks = {d: facts.peak_tflops(d, tensor_cores=True) for d in DTYPES}
    meta = {"target": target, "cases": cases, "peak_tflops": peaks}
    (directory / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


def with_wgmma(params: list[str] | None) -> list[str]:
    """``params`` with ``wgmma=true`` unless they set ``wgmma`` themselves (the cost model's
    default, stated so that a case's path does not depend on the default)."""
    params = list(params or [])
    if not any(p.split("=", 1)[0].strip() == "wgmma" for p in params):
        params.append("wgmma=true")
    return params


def _build_case(folder: Path, source: Path, target: str, params: list[str]) -> dict:
    """Emit one artifact; returns what the cost model chose for its matmul."""
    import stagegraph as sg

    sg.run("gpu", str(source), target=target, emit="object", output=str(folder),
           param=params or None)  # fmt: skip
    chosen = sg.run("gpu", str(source), target=target, until="select",
                    param=params or None).value("select")  # fmt: skip
    plan = chosen.kernels[-1]  # the matmul (after its fill)
    return {"mma": list(plan.mma), "tile": [plan.tile_m, plan.tile_n], "path": _path(plan),
            "stages": plan.stages}  # fmt: skip


def _path(plan: Any) -> str:
    """The kernel path a matmul's plan takes (the table's last column)."""
    return ("wgmma-ws" if plan.warp_specialized else "wgmma") if plan.stages else (
        "mma.sync" if plan.mma else "simt")  # fmt: skip


#: Problem-file constants set for the Linear cases (those a file has): rows, then features.
BATCH_NAMES = ("batch_size",)
FEATURE_NAMES = ("in_features", "out_features", "input_size", "hidden_size", "output_size")


def build_linear(directory: Path, target: str, problem: Path, batch: int,
                 features: int, params: list[str] | None = None) -> dict:  # fmt: skip
    """One Linear + epilogue problem in bf16: exported, compiled (the cost model's
    ``params`` overridden, e.g. ``epilogues=false`` or ``wgmma=false`` to compare), saved
    with its inputs."""
    import torch

    import stagegraph as sg
    from stagegraph.mlir.torch_import import import_program
    from stagegraph.workload.torch_eager import export
    from stagegraph.workload.torch_source import constant_names, load_problem_file

    names = constant_names(ast.parse(problem.read_text()))
    overrides = {n: batch for n in BATCH_NAMES if n in names}
    overrides |= {n: features for n in FEATURE_NAMES if n in names}
    loaded = load_problem_file(problem, overrides, seed=0)
    loaded.model = loaded.model.to(torch.bfloat16).eval()
    loaded.inputs = [x.to(torch.bfloat16) if x.is_floating_point() else x for x in loaded.inputs]
    program = export(loaded)
    text, _ = import_program(program, loaded.what)
    name = f"linear_{problem.stem}"
    source = sources(directory) / f"{name}.mlir"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    sg.run("gpu", str(source), target=target, emit="object", output=str(directory / name),
           param=params or None)  # fmt: skip
    chosen = sg.run("gpu", str(source), target=target, until="select",
                    param=params or None).value("select")  # fmt: skip
    torch.export.save(program, directory / name / "model.pt2")
    raw = [x.view(torch.int16).numpy().view(np.uint16) for x in loaded.inputs]
    np.savez(directory / name / "inputs.npz", *raw)
    matmuls = [p for p in chosen.kernels if p.name == "linalg.matmul"]
    kernels = sum(p.mapped for p in chosen.kernels)
    path = _path(matmuls[0]) if matmuls else "none"
    print(f"built {name}: {kernels} kernels, {path}", flush=True)
    flops = 2.0 * batch * features * features
    return {"name": name, "linear": True, "dtype": "bf16", "flops": flops,
            "mma": list(matmuls[0].mma) if matmuls else [], "kernels": kernels,
            "path": path}  # fmt: skip


def run_linear_case(folder: Path, case: dict, repeats: int) -> dict:
    """PyTorch CUDA eager on the exported program against the artifact, outputs compared."""
    import torch
    from gpu_check import load_artifact, relative_error

    from stagegraph.runtime.cuda import CudaProgram

    arrays = np.load(folder / "inputs.npz")
    raw = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
    inputs = [torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda() for x in raw]
    model = torch.export.load(folder / "model.pt2").module().to("cuda")
    with torch.no_grad():
        ref = model(*inputs)
        ref = ref[0] if isinstance(ref, tuple | list) else ref
        theirs = _events_ms(lambda: model(*inputs), repeats)
    program = CudaProgram(*load_artifact(folder))
    try:
        outs = program.run(raw)
        ours = statistics.median(program.time_ms(repeats))
    finally:
        program.close()
    out = outs[-1]
    if out.dtype == np.uint16:  # bf16 bit patterns
        out = (out.astype(np.uint32) << 16).view(np.float32)
    error = relative_error(out, ref.float().cpu().numpy())
    return {"case": case["name"], "ok": error <= TOLERANCE, "error": error, "ms": ours,
            "torch_ms": theirs, "ratio": theirs / ours, "tflops": case["flops"] / ours / 1e9,
            "torch_tflops": case["flops"] / theirs / 1e9, "tensor_cores": bool(case["mma"]),
            "kernels": case["kernels"]}  # fmt: skip


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
    pattern = error_pattern(out, ref) if error > TOLERANCE else ""
    return {"case": case["name"], "ok": error <= TOLERANCE, "error": error, "ms": ours,
            "torch_ms": theirs, "ratio": theirs / ours, "tflops": flops / ours / 1e9,
            "torch_tflops": flops / theirs / 1e9, "tensor_cores": bool(case["mma"]),
            "path": case.get("path", ""), "pattern": pattern}  # fmt: skip


def error_pattern(out: np.ndarray, ref: np.ndarray, tile: int = 64) -> str:
    """Where a wrong result is wrong, for a kernel that cannot be stepped through: the
    share of unwritten (NaN: the runtime poisons results) and of wrong elements, the first
    wrong (row, col), and one character per ``tile x tile`` block of C for up to 16 x 16
    blocks ('.' right, 'N' any NaN, 'x' wrong)."""
    bad = ~np.isclose(out, ref, rtol=TOLERANCE, atol=TOLERANCE * (np.abs(ref).max() or 1))
    nan = np.isnan(out)
    rows, cols = np.nonzero(bad | nan)
    first = f"({rows[0]}, {cols[0]})" if len(rows) else "-"
    lines = []
    for i in range(min(16, -(-out.shape[0] // tile))):
        line = ""
        for j in range(min(16, -(-out.shape[1] // tile))):
            block = np.s_[i * tile : (i + 1) * tile, j * tile : (j + 1) * tile]
            line += "N" if nan[block].any() else "x" if bad[block].any() else "."
        lines.append(line)
    return f"nan {nan.mean():.3f} wrong {bad.mean():.3f} first {first} blocks " + "/".join(lines)


#: Driver errors after which the CUDA context is unusable (see gpu_check.STICKY_ERRORS).
STICKY = (
    "ILLEGAL_ADDRESS",
    "MISALIGNED_ADDRESS",
    "LAUNCH_FAILED",
    "ILLEGAL_INSTRUCTION",
    "illegal memory access",
    "misaligned address",
    "unspecified launch failure",
)


def run(directory: Path, repeats: int, save: Path | None = None) -> int:
    """Run every case; with ``save``, rows are appended there as measured and cases
    already there skipped, and a sticky CUDA error (the context is lost) ends the process
    with status 3 so that a rerun goes on after the case that caused it."""
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
    rows = [json.loads(x) for x in save.read_text().splitlines()] if save and save.exists() else []
    done = {r["case"] for r in rows}
    for case in [c for c in meta["cases"] if c["name"] not in done]:
        try:
            runner = run_linear_case if case.get("linear") else run_case
            row = runner(directory / case["name"], case, repeats)
        except Exception as error:  # a failing case is a row that says why
            row = {"case": case["name"], "ok": False, "failure": f"{type(error).__name__}: "
                   f"{error}"[:160]}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
        if save:
            with save.open("a") as stream:
                stream.write(json.dumps(row) + "\n")
        if any(word in row.get("failure", "") for word in STICKY):
            print("the CUDA context is lost (a sticky error): exit 3, rerun to go on")
            sys.stdout.flush()
            os._exit(3)
    print_table(rows, meta)
    return 0 if all(r.get("ok") for r in rows) else 1


def print_table(rows: list[dict], meta: dict) -> None:
    """Ratio, TFLOP/s and the share of the datasheet peak and of the best cuBLAS rate."""
    best = max((r.get("torch_tflops", 0.0) for r in rows), default=0.0) or 1.0
    print(f"\n{'case':40} {'ok':3} {'ours ms':>9} {'cuBLAS ms':>9} {'ratio':>6} "
          f"{'TFLOP/s':>8} {'% peak':>7} {'% best cuBLAS':>13} path")  # fmt: skip
    for r in rows:
        if "ms" not in r:
            print(f"{r['case']:40} no  {r['failure']}")
            continue
        peak = meta["peak_tflops"]["bf16" if r["case"].startswith("linear") else
                                   r["case"].split("_")[0]]  # fmt: skip
        print(f"{r['case']:40} {'yes' if r['ok'] else 'NO':3} {r['ms']:9.3f} "
              f"{r['torch_ms']:9.3f} {r['ratio']:6.2f} {r['tflops']:8.1f} "
              f"{100 * r['tflops'] / peak:6.1f}% {100 * r['tflops'] / best:12.1f}% "
              f"{r.get('path', '')}")  # fmt: skip
        if r.get("pattern"):
            print(f"    {r['pattern']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--build", type=Path, help="compile the cases into this folder")
    group.add_argument("--run", type=Path, help="run the cases of this folder on the GPU")
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument(
        "--shapes", nargs="*", help="MxNxK shapes instead of the issue's (none: only --linear)"
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--param", nargs="*", default=[],
                        help="cost-model params for --build, e.g. wgmma=false")  # fmt: skip
    parser.add_argument(
        "--compare-mma-sync",
        action="store_true",
        help="--build each case on mma.sync too (suffix _mmasync)",
    )
    parser.add_argument("--linear", type=Path, help="KernelBench level-2 problem files")
    parser.add_argument("--only", nargs="*", help="glob patterns of the problems to build")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--save", type=Path, help="for --run: append rows here (JSON lines); "
                        "cases already there are skipped")  # fmt: skip
    args = parser.parse_args()
    if args.build:
        shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes]
                  if args.shapes is not None else list(SHAPES))  # fmt: skip
        return build(args.build, args.target, shapes, args.param, args.compare_mma_sync,
                     args.linear, args.batch, args.features, args.only)  # fmt: skip
    return run(args.run, args.repeats, args.save)


if __name__ == "__main__":
    sys.exit(main())
