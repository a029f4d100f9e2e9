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
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


#: Driver errors after which the context is unusable: every later call fails too, so the
#: process ends (status 3) and a rerun with ``--save`` goes on after the payload.
STICKY_ERRORS = ("ILLEGAL_ADDRESS", "MISALIGNED_ADDRESS", "LAUNCH_FAILED",
                 "ILLEGAL_INSTRUCTION", "HARDWARE_STACK_ERROR", "INVALID_PC", "ASSERT",
                 "INVALID_ADDRESS_SPACE", "TMA_ERROR")  # fmt: skip


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


def check_one(folder: Path, repeats: int, graph: bool = False) -> dict:
    """Verify one artifact and time it (and PyTorch eager, when its problem file is there).

    A payload folder brings its inputs and reference outputs (``data.npz``); a problem-file
    case (``problem.json``, sizes that fill the GPU) builds them here: the inputs and the
    model from the problem file with the compile side's seed, the reference by the model in
    float64 on the GPU."""
    from stagegraph.runtime.cuda import CudaProgram

    manifest, ptx, constants = load_artifact(folder)
    if (folder / "data.npz").exists():
        data = np.load(folder / "data.npz")
        inputs = [data[f"in{i}"] for i in range(len(data.files)) if f"in{i}" in data.files]
        # A training-mode norm returns its updated statistics (mut0..) before its outputs.
        refs = [data[f"{prefix}{i}"] for prefix in ("mut", "out")
                for i in range(len(data.files)) if f"{prefix}{i}" in data.files]  # fmt: skip
        model = None
    else:
        model, inputs, refs = problem_case(folder)
    program = CudaProgram(manifest, ptx, constants)
    try:
        outputs = program.run(inputs)
        ratio = verdict(outputs, refs, inputs, manifest) if refs else float("inf")
        errors = [relative_error(o, r) for o, r in zip(outputs, refs, strict=False)]
        ratio, ok = float(ratio), bool(ratio <= 1.0)
        ours = statistics.median(program.time_ms(repeats))
        graph_ms = replay_ms(program, repeats) if graph else None
    finally:
        program.close()
    moved = sum(np.asarray(x).nbytes for x in inputs) + sum(o.nbytes for o in outputs)
    row = {"payload": folder.name, "ok": ok, "error": max(errors, default=float("inf")),
           "ratio": ratio, "ms": ours, "graph_ms": graph_ms, "torch_ms": None,
           "bytes": int(moved),
           "big": model is not None}  # fmt: skip
    try:
        if model is None and (folder / "problem.py").exists():
            model = problem_model(folder)
        if model is not None:
            row["torch_ms"] = torch_eager_ms(model, inputs, repeats)
    except Exception as error:  # the baseline is best effort; the row says why
        row["torch_error"] = f"{type(error).__name__}: {error}"[:120]
    return row


def replay_ms(program: Any, repeats: int) -> float:
    """Median milliseconds of the launches replayed as one CUDA graph."""
    from stagegraph.runtime.cuda_graph import GraphReplay

    replay = GraphReplay(program)
    try:
        return statistics.median(replay.time_ms(repeats))
    finally:
        replay.close()


def problem_case(folder: Path) -> tuple[Any, list[np.ndarray], list[np.ndarray]]:
    """The float32 model, its inputs and its float64-on-GPU reference outputs, from the
    folder's problem file and ``problem.json`` (overrides as written, seed)."""
    import copy

    import torch

    source = torch_source()
    spec = json.loads((folder / "problem.json").read_text())
    overrides = {k: source.parse_value(v) for k, v in spec["overrides"].items()}
    problem = source.load_problem_file(folder / "problem.py", overrides, int(spec["seed"]))
    inputs = [t.numpy() if isinstance(t, torch.Tensor) else t for t in problem.inputs]

    def wide(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return (t.double() if t.is_floating_point() else t).cuda()
        return t

    reference = copy.deepcopy(problem.model).double().cuda().eval()
    with torch.no_grad():
        outs = reference(*[wide(t) for t in problem.inputs])
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    refs = [(o.float() if o.is_floating_point() else o).cpu().numpy() for o in outs]
    del reference, outs
    torch.cuda.empty_cache()
    return problem.model, inputs, refs


def torch_source() -> Any:
    """``stagegraph.workload.torch_source``: numpy and the standard library only (torch
    when called), so it imports on the GPU machine, which lacks pydantic (the
    ``stagegraph.workload`` package imports its modules lazily)."""
    from stagegraph.workload import torch_source as module

    return module


def verdict(outputs: list[np.ndarray], refs: list[np.ndarray], inputs: list[Any],
            manifest: dict) -> float:  # fmt: skip
    """The project's verification criterion (:mod:`stagegraph.workload.criterion`, as
    ``stagegraph exec --check`` applies it to an artifact): each output within
    ``u * sqrt(n)`` bounds, n the manifest's reduction length, its scale floored by the
    largest RMS of the float inputs. Returns the worst error over what is allowed (<= 1
    passes; inf for a count, shape or NaN/inf placement mismatch). A plain relative error
    fails correct code whose output cancels to rounding noise (the mean of a GroupNorm
    output is ~1e-8 in PyTorch's reference as in ours)."""
    from stagegraph.dtypes import decode, is_float
    from stagegraph.workload import criterion

    results = sorted(manifest["results"], key=lambda v: v["position"])
    specs = sorted(manifest["arguments"], key=lambda v: v["position"])
    floats = [(a, v["dtype"]) for a, v in zip(inputs, specs, strict=False) if is_float(v["dtype"])]
    floor = max((criterion.rms(decode(np.asarray(a), dtype)) for a, dtype in floats), default=0.0)
    if len(outputs) != len(refs):
        return float("inf")
    worst = 0.0
    for out, ref, spec in zip(outputs, refs, results, strict=True):
        got = decode(np.asarray(out), spec["dtype"])
        want = decode(ref, spec["dtype"]) if ref.dtype == out.dtype else ref.astype(np.float64)
        if got.shape != want.shape or criterion.nonfinite_mismatch(got, want) is not None:
            return float("inf")
        judged = criterion.judge(got, want, spec["dtype"], manifest.get("reduction_length", 1),
                                 floor)  # fmt: skip
        worst = max(worst, judged.ratio)
    return worst


def problem_model(folder: Path) -> Any:
    """The KernelBench model of a payload folder at the payload's (scaled) sizes, for
    timing: the problem file run with the manifest's scaled constants (``constants.json``)
    when the folder has them, else built from its scaled init inputs (``init.json``)."""
    constants = folder / "constants.json"
    if constants.exists():
        values = {name: tuple(v) if isinstance(v, list) else v  # "height=width": a chain
                  for k, v in json.loads(constants.read_text()).items()
                  for name in k.split("=")}  # fmt: skip
        return torch_source().load_problem_file(folder / "problem.py", values, 0).model
    spec = importlib.util.spec_from_file_location(f"problem_{folder.name}", folder / "problem.py")
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    init_file = folder / "init.json"
    init = (
        [ast.literal_eval(x) for x in json.loads(init_file.read_text())]
        if init_file.exists()
        else []
    )
    return problem.Model(*init)


def torch_eager_ms(model: Any, inputs: list[np.ndarray], repeats: int) -> float:
    """Median milliseconds of the model in PyTorch CUDA eager (same inputs)."""
    import torch

    model = model.cuda().eval()
    args = [torch.from_numpy(np.ascontiguousarray(x)).cuda() if isinstance(x, np.ndarray)
            else x for x in inputs]  # fmt: skip
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


def copy_bandwidth_gbps() -> float | None:
    """Device-to-device copy bandwidth of this GPU (bytes read plus written), the ceiling
    the memory-bound rows are set against; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    source = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    target = torch.empty_like(source)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(13):
        start.record()
        target.copy_(source)
        stop.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(stop))
    del source, target
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / statistics.median(times) / 1e6


def run(directory: Path, budget_s: float, repeats: int, save: Path | None = None,
        hang_s: float = 60.0, graph: bool = False) -> int:  # fmt: skip
    """Check every artifact folder under ``directory`` until the budget is spent; each row
    is printed (and appended to ``save``) as soon as it is measured.

    With ``save``, rows already there are kept and their payloads skipped, so a run that
    ended early is resumed by running the same command again. A payload that takes over
    ``hang_s`` (a kernel that never finishes cannot be interrupted from the host) is saved
    as a failed row and the process exits with status 3 at once: the rerun goes on after
    it."""
    sys.path.insert(0, str(ROOT))
    from stagegraph.errors import GpuUnavailableError
    from stagegraph.runtime.cuda import device_properties

    try:
        props = device_properties(0)
    except GpuUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth_gbps()
    print(f"GPU: {props['name']} (sm_{props['capability'][0]}{props['capability'][1]}, "
          f"{props['sm_count']} SMs); device-to-device copy "
          f"{bandwidth or float('nan'):.0f} GB/s (read + write)", flush=True)  # fmt: skip
    rows = (
        [json.loads(line) for line in save.read_text().splitlines()]
        if save and save.exists()
        else []
    )
    done = {r["payload"] for r in rows}
    started = time.perf_counter()
    folders = sorted(p.parent for p in directory.rglob("manifest.json"))
    for folder in [f for f in folders if f.name not in done]:
        if time.perf_counter() - started > budget_s:
            print(f"budget of {budget_s:.0f} s spent: {len(folders) - len(rows)} left unrun")
            break
        watchdog = threading.Timer(hang_s, _hung, (folder.name, hang_s, save))
        watchdog.start()
        try:
            row = check_one(folder, repeats, graph)
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"[:160]
            row = {"payload": folder.name, "ok": False, "error": float("inf"), "ms": None,
                   "torch_ms": None, "failure": failure}  # fmt: skip
        finally:
            watchdog.cancel()
        rows.append(row)
        _save(row, save)
        if any(name in row.get("failure", "") for name in STICKY_ERRORS):
            print("the CUDA context is lost (a sticky error): exit 3, rerun to go on")
            sys.stdout.flush()
            os._exit(3)
    table(rows, bandwidth)
    return 0


def _save(row: dict, save: Path | None) -> None:
    print(json.dumps(row), flush=True)
    if save:
        with save.open("a") as stream:
            stream.write(json.dumps(row) + "\n")


def _hung(payload: str, hang_s: float, save: Path | None) -> None:
    """The watchdog: save the payload as failed and end the process (status 3)."""
    failure = f"no result after {hang_s:.0f} s (hung)"
    _save({"payload": payload, "ok": False, "error": float("inf"), "ms": None,
           "torch_ms": None, "failure": failure}, save)  # fmt: skip
    sys.stdout.flush()
    os._exit(3)


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def table(rows: list[dict], bandwidth: float | None = None, brief: bool = False) -> None:
    """The verdicts, times and achieved bandwidth, then the fraction verified, the
    geometric-mean speedup per level and the share of the copy bandwidth of the
    problem-file (GPU-filling) rows (``brief``: the verified payload rows left out)."""
    print(f"\n{'payload':52} {'ok':>3} {'err/tol':>9} {'ours ms':>9} {'torch ms':>9} "
          f"{'x':>6} {'GB/s':>6} {'%copy':>5}")  # fmt: skip
    speedups: dict[str, list[float]] = {}
    graphed: dict[str, list[float]] = {}
    shares = []
    for r in rows:
        ms, torch_ms = r.get("ms"), r.get("torch_ms")
        ratio = torch_ms / ms if ms and torch_ms else None
        group = "big" if r.get("big") else r["payload"][:2]
        if ratio and r["ok"]:
            speedups.setdefault(group, []).append(ratio)
        if r.get("graph_ms") and torch_ms and r["ok"]:
            graphed.setdefault(group, []).append(torch_ms / r["graph_ms"])
        gbps = r.get("bytes", 0) / ms / 1e6 if ms else float("nan")
        share = 100 * gbps / bandwidth if bandwidth and ms else float("nan")
        if r.get("big") and r["ok"] and ms:
            shares.append(share)
        if brief and r["ok"] and not r.get("big"):
            continue
        judged = r.get("ratio", r["error"])  # rows saved before the criterion: rel. error
        print(f"{r['payload'][:52]:52} {'yes' if r['ok'] else 'NO':>3} {judged:9.2e} "
              f"{ms or float('nan'):9.4f} {torch_ms or float('nan'):9.4f} "
              f"{ratio or float('nan'):6.2f} {gbps:6.0f} {share:5.0f}")  # fmt: skip
        for why in ("failure", "torch_error"):
            if r.get(why):
                print(f"    {why}: {r[why]}")
    ok = sum(r["ok"] for r in rows)
    print(f"\nverified {ok}/{len(rows)}")
    for group, values in sorted(speedups.items()):
        print(f"speedup over PyTorch CUDA eager, {group} (geomean of {len(values)}): "
              f"{geomean(values):.2f}x")  # fmt: skip
    for group, values in sorted(graphed.items()):
        print(f"  same, our launches replayed as one CUDA graph, {group}: "
              f"{geomean(values):.2f}x")  # fmt: skip
    if shares:
        print(f"problem-file rows: {min(shares):.0f}%..{max(shares):.0f}% of the copy "
              f"bandwidth (geomean {geomean(shares):.0f}%)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, help="compile artifacts into this folder (CPU)")
    parser.add_argument("--run", type=Path, help="verify and time the artifacts here (GPU)")
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument("--root", default=str(ROOT.parent / "shared" / "kernelbench"))
    parser.add_argument("--levels", default="level1,level2", help="for --build")
    parser.add_argument("--problem", action="append", default=[], metavar="FILE.py[:k=v,..]",
                        help="for --build: a problem file at sizes of your choice")  # fmt: skip
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        metavar="ROWS.jsonl",
        help="print the table of rows saved by --save (no GPU needed)",
    )
    parser.add_argument("--bandwidth", type=float, help="for --table: copy GB/s measured")
    parser.add_argument(
        "--brief",
        action="store_true",
        help="for --table: rows that failed and problem-file rows only",
    )
    parser.add_argument("--budget", type=float, default=450.0)
    parser.add_argument("--graph", action="store_true",
                        help="also time the launches replayed as one CUDA graph")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--save",
        type=Path,
        help="append each row (JSON lines) here; "
        "rows already there are kept and their payloads skipped",
    )
    parser.add_argument("--hang", type=float, default=60.0,
                        help="seconds after which a payload counts as hung (exit 3)")  # fmt: skip
    args = parser.parse_args()
    if args.build:
        script = Path(__file__).with_name("gpu_compile.py")
        command = [sys.executable, str(script), args.root, "--targets", args.target,
                   "--levels", args.levels, "--build", str(args.build)]  # fmt: skip
        command += [f"--problem={spec}" for spec in args.problem]
        return subprocess.run(command, check=False).returncode
    if args.table:
        rows = [json.loads(line) for path in args.table for line in path.read_text().splitlines()]
        table(rows, args.bandwidth, args.brief)
        return 0
    if args.run:
        return run(args.run, args.budget, args.repeats, args.save, args.hang, args.graph)
    parser.error("give --build DIR, --run DIR or --table ROWS.jsonl")
    return 2


if __name__ == "__main__":
    sys.exit(main())
