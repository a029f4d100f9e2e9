"""Verify and time GPU-graph artifacts on a GPU, against PyTorch CUDA eager.

On the CPU machine (compiles; needs the MLIR bindings):

    python benchmarks/gpu_check.py --build build/gpu-l1 --levels level1 [--target sm_90a]
    python benchmarks/gpu_check.py --build build/gpu-l2 --levels level2

On the GPU machine (needs numpy, cuda-bindings and, for the baseline, torch; no pydantic,
no MLIR):

    python benchmarks/gpu_check.py --run build/gpu-l1

Each artifact folder holds the manifest (the ``cuda`` kind of the versioned artifact format,
read without pydantic), PTX and constants, the payload's ``data.npz``
(inputs ``in*`` and reference outputs ``out*``) and, when found, its KernelBench problem file
and scaled init inputs. A level's folder is 24-38 MiB (the ``.npz`` files are most of it):
build one level per folder so each fits what a device call carries (64 MiB with the
repository). Every payload is run once on fresh copies of its inputs and checked
by ``||out - ref|| / ||ref||`` (NaN never passes); then both it and PyTorch eager are timed
with CUDA events (median of repeats after warm-up). The whole run stops taking new payloads
after ``--budget`` seconds (default 450: under 8 minutes with start-up).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: ||out - ref|| / ||ref|| allowed, by output dtype.
TOLERANCE = {"float32": 1e-4, "float64": 1e-9, "float16": 1e-2, "uint16": 1e-2}


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf on NaN or a shape mismatch)."""
    if out.shape != ref.shape:
        return float("inf")
    a, b = out.astype(np.float64), ref.astype(np.float64)
    if not np.all(np.isfinite(a) == np.isfinite(b)):
        return float("inf")
    finite = np.isfinite(b)
    denominator = np.linalg.norm(b[finite]) or 1.0
    return float(np.linalg.norm(a[finite] - b[finite]) / denominator)


def load_artifact(folder: Path) -> tuple[dict, dict, dict]:
    """Manifest, PTX by module and constants of one artifact folder, read without pydantic
    (:func:`stagegraph.artifact.cuda_folder.load_cuda_folder`: another schema version or
    kind, or a missing file, is an ``ArtifactError`` naming the folder)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from stagegraph.artifact.cuda_folder import load_cuda_folder

    loaded = load_cuda_folder(folder)
    return loaded.manifest, loaded.ptx, loaded.constants


def check_one(folder: Path, repeats: int) -> dict:
    """Verify one artifact and time it (and PyTorch eager, when its problem file is there)."""
    from stagegraph.runtime.cuda import CudaProgram

    manifest, ptx, constants = load_artifact(folder)
    data = np.load(folder / "data.npz")
    inputs = [data[k] for k in sorted(data.files) if k.startswith("in")]
    refs = [data[k] for k in sorted(data.files) if k.startswith("out")]
    program = CudaProgram(manifest, ptx, constants)
    try:
        outputs = program.run(inputs)
        errors = [relative_error(o, r) for o, r in zip(outputs, refs, strict=False)]
        tolerance = max(TOLERANCE.get(str(r.dtype), 1e-4) for r in refs) if refs else 0
        ok = bool(refs) and len(outputs) == len(refs) and max(errors) <= tolerance
        ours = statistics.median(program.time_ms(repeats))
    finally:
        program.close()
    row = {"payload": folder.name, "ok": ok, "error": max(errors, default=float("inf")),
           "ms": ours, "torch_ms": None}  # fmt: skip
    if (folder / "problem.py").exists():
        try:
            row["torch_ms"] = torch_eager_ms(folder, inputs, repeats)
        except Exception as error:  # the baseline is best effort; the row says why
            row["torch_error"] = f"{type(error).__name__}: {error}"[:120]
    return row


def torch_eager_ms(folder: Path, inputs: list[np.ndarray], repeats: int) -> float:
    """Median milliseconds of the KernelBench model in PyTorch CUDA eager (same inputs)."""
    import torch

    spec = importlib.util.spec_from_file_location(f"problem_{folder.name}", folder / "problem.py")
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    init_file = folder / "init.json"
    init = (
        [ast.literal_eval(x) for x in json.loads(init_file.read_text())]
        if init_file.exists()
        else []
    )
    model = problem.Model(*init).cuda().eval()
    args = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in inputs]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.no_grad():
        for i in range(3 + repeats):
            start.record()
            model(*args)
            stop.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(stop))
    return statistics.median(times)


def run(directory: Path, budget_s: float, repeats: int) -> int:
    sys.path.insert(0, str(ROOT))
    from stagegraph.errors import GpuUnavailableError
    from stagegraph.runtime.cuda import device_properties

    try:
        props = device_properties(0)
    except GpuUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"GPU: {props['name']} (sm_{props['capability'][0]}{props['capability'][1]}, "
          f"{props['sm_count']} SMs)", flush=True)  # fmt: skip
    rows, started = [], time.perf_counter()
    folders = sorted(p.parent for p in directory.rglob("manifest.json"))
    for folder in folders:
        if time.perf_counter() - started > budget_s:
            print(f"budget of {budget_s:.0f} s spent: {len(folders) - len(rows)} left unrun")
            break
        try:
            row = check_one(folder, repeats)
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"[:160]
            row = {"payload": folder.name, "ok": False, "error": float("inf"), "ms": None,
                   "torch_ms": None, "failure": failure}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    table(rows)
    return 0


def table(rows: list[dict]) -> None:
    """The verdicts and times, then the fraction verified and the geometric-mean speedup."""
    print(f"\n{'payload':58} {'ok':>3} {'rel.err':>9} {'ours ms':>9} {'torch ms':>9} {'x':>6}")
    speedups = []
    for r in rows:
        ms, torch_ms = r.get("ms"), r.get("torch_ms")
        ratio = torch_ms / ms if ms and torch_ms else None
        if ratio and r["ok"]:
            speedups.append(ratio)
        print(f"{r['payload'][:58]:58} {'yes' if r['ok'] else 'NO':>3} {r['error']:9.2e} "
              f"{ms or float('nan'):9.4f} {torch_ms or float('nan'):9.4f} "
              f"{ratio or float('nan'):6.2f}")  # fmt: skip
    ok = sum(r["ok"] for r in rows)
    print(f"\nverified {ok}/{len(rows)}")
    if speedups:
        geo = float(np.exp(np.mean(np.log(speedups))))
        print(f"speedup over PyTorch CUDA eager (geomean of {len(speedups)}): {geo:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, help="compile artifacts into this folder (CPU)")
    parser.add_argument("--run", type=Path, help="verify and time the artifacts here (GPU)")
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument("--root", default=str(ROOT.parent / "shared" / "kernelbench"))
    parser.add_argument("--levels", default="level1,level2", help="for --build")
    parser.add_argument("--budget", type=float, default=450.0)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.build:
        script = Path(__file__).with_name("gpu_compile.py")
        command = [sys.executable, str(script), args.root, "--targets", args.target,
                   "--levels", args.levels, "--build", str(args.build)]  # fmt: skip
        return subprocess.run(command, check=False).returncode
    if args.run:
        return run(args.run, args.budget, args.repeats)
    parser.error("give --build DIR or --run DIR")
    return 2


if __name__ == "__main__":
    sys.exit(main())
