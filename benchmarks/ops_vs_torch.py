"""Pools, scans and small elementwise ops: the x86 graph against PyTorch eager, side by side.

For each payload (KernelBench level-1 problem files under ``--src``, sized by the manifest's
``scaled_constants``) the script compiles the shipped ``.mlir`` through the x86 graph,
verifies it against the ``.npz`` beside it, and times it interleaved with PyTorch eager
running the problem's ``Model`` on the same inputs with the same thread count
(``torch.set_num_threads``): rounds alternate one batch of x86 calls with one batch of
PyTorch calls, and each side's time is the median of its per-round means, so load on a
shared machine hits both sides alike. A ratio is PyTorch time / x86 time (above 1: x86 is
faster); ``min r`` is the same ratio of the fastest rounds (the least disturbed on a loaded
machine). A row whose per-round spread (interquartile range over median) passes
``--noisy`` is flagged ``noisy``. The x86 graph picks its own thread count (``--threads``
grants cores; an op without a large matmul or convolution runs on one).

With ``--scale 16`` the problem's batch constant is multiplied by 16, the model exported
through torch-mlir's FX importer (the shipped payloads were made the same way) into a
temporary folder with PyTorch's outputs as the reference ``.npz``, and measured alike.

Memory-bound ops also get GB/s (input + output bytes per call) next to a measured copy
bandwidth (numpy copying a 64 MiB array, read + write, at one thread), so "at memory speed"
is a number. The header names the host CPU and its ISA tier. Usage:

    python benchmarks/ops_vs_torch.py [--scale 1 16] [--threads 1 2] [--only 043 089]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from real_size import scale_constants

# Payload stems (level 1) this benchmark owns: pools, scans, the exp/erf/tanh activations.
PAYLOADS = (
    "l1_026_GELU", "l1_027_SELU", "l1_031_ELU", "l1_088_MinGPTNewGelu", "l1_025_Swish",
    "l1_029_Softplus",
    "l1_041_Max_Pooling_1D", "l1_042_Max_Pooling_2D", "l1_043_Max_Pooling_3D",
    "l1_044_Average_Pooling_1D", "l1_045_Average_Pooling_2D", "l1_046_Average_Pooling_3D",
    "l1_089_cumsum", "l1_090_cumprod", "l1_091_cumsum_reverse", "l1_092_cumsum_exclusive",
    "l1_093_masked_cumsum",
)  # fmt: skip


def copy_bandwidth_gbs(megabytes: int = 64, repeats: int = 7) -> float:
    """Read + write GB/s of a numpy copy far larger than the caches (the memory's speed)."""
    source = np.ones(megabytes * (1 << 20) // 4, dtype=np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best / 1e9


def load_problem(path: Path, constants: dict[str, Any], scale: int) -> Any:
    """The problem module with its constants set (the batch constant times ``scale``)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in scale_constants(constants, scale).items():
        setattr(module, name, tuple(value) if isinstance(value, list) else value)
    return module


def payload_files(entry: dict, level: Path, src: Path, scale: int, tmp: Path) -> tuple:
    """(mlir path, torch model, torch inputs) at ``scale`` (1: the shipped files)."""
    import torch

    source = next(src.glob(entry["stem"] + "*.py"))
    problem = load_problem(source, entry["scaled_constants"], scale)
    torch.manual_seed(0)
    model = problem.Model(*problem.get_init_inputs()).eval()
    if scale == 1:
        path = level / entry["mlir"]
        with np.load(path.with_suffix(".npz")) as data:
            inputs = [torch.from_numpy(data[f"in{i}"]) for i in range(len(entry["inputs"]))]
        return path, model, inputs
    inputs = problem.get_inputs()
    from torch_mlir import fx

    with torch.no_grad():
        outputs = model(*inputs)
    outputs = outputs if isinstance(outputs, tuple | list) else [outputs]
    module = fx.export_and_import(model, *inputs, output_type="linalg-on-tensors",
                                  func_name="main")  # fmt: skip
    path = tmp / f"{entry['stem']}_x{scale}.mlir"
    path.write_text(str(module))
    arrays = {f"in{i}": x.numpy() for i, x in enumerate(inputs)}
    arrays |= {f"out{i}": y.numpy() for i, y in enumerate(outputs)}
    np.savez(path.with_suffix(".npz"), **arrays)
    return path, model, inputs


def torch_timer(model: Any, inputs: list) -> Any:
    """``measure(count)`` for PyTorch eager: the mean seconds of ``count`` calls."""
    import torch

    def measure(count: int) -> float:
        with torch.no_grad():
            start = time.perf_counter()
            for _ in range(count):
                model(*inputs)
            return (time.perf_counter() - start) / count

    return measure


def interleaved(x86: Any, peer: Any, rounds: int, target_s: float = 0.02) -> dict:
    """Median per-call seconds of both sides over alternating rounds, and their spreads."""
    one = max(float(np.median(x86.measure(3, warmup=1))), peer(3), 1e-7)
    count = max(1, int(target_s / one))
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(float(np.mean(x86.measure(count))))
        theirs.append(peer(count))

    def spread(values: list[float]) -> float:
        q1, _, q3 = statistics.quantiles(values, n=4)
        return (q3 - q1) / statistics.median(values)

    return {"x86_s": statistics.median(ours), "torch_s": statistics.median(theirs),
            "min_ratio": min(theirs) / min(ours),
            "spread": max(spread(ours), spread(theirs))}  # fmt: skip


def measure_one(path: Path, model: Any, inputs: list, threads: int, rounds: int) -> dict:
    """Compile + verify ``path`` through x86, then time it against ``model`` (in process)."""
    import torch

    from stagegraph.app.bench import prepare
    from stagegraph.app.session import Session, SessionRequest

    torch.set_num_threads(threads)
    session = Session(SessionRequest(graph="x86", workload=str(path), threads=threads))
    measurement = prepare(session.engine, session.graph, session.workload, None)
    if not measurement.verdict.ok:
        return {"verified": False, "message": measurement.verdict.message}
    row = interleaved(measurement, torch_timer(model, inputs), rounds)
    moved = sum(x.numel() * x.element_size() for x in inputs)
    with torch.no_grad():
        out = model(*inputs)
    moved += out.numel() * out.element_size()
    return {"verified": True, "bytes": moved, **row}


def parse(argv: list[str] | None) -> argparse.Namespace:
    kb = Path(__file__).resolve().parents[2] / "shared" / "kernelbench"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=Path, default=kb / "level1")
    parser.add_argument("--src", type=Path, default=kb / "src" / "level1")
    parser.add_argument("--scale", type=int, nargs="+", default=[1])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--only", nargs="*", default=[], help="payload stems containing these")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--noisy", type=float, default=0.15)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from stagegraph.app.host import host_info

    host = host_info()
    bandwidth = copy_bandwidth_gbs()
    manifest = {e["stem"]: e for e in json.loads((args.level / "manifest.json").read_text())}
    stems = [s for s in PAYLOADS if s in manifest]
    stems = [s for s in stems if not args.only or any(o in s for o in args.only)]
    import torch

    print(f"# host: {host.cpu_model}; {host.target}; peer: PyTorch eager {torch.__version__}; "
          f"copy bandwidth {bandwidth:.1f} GB/s (1 thread)")  # fmt: skip
    print(f"{'payload':34} {'scale':>5} {'thr':>3} {'x86 us':>9} {'torch us':>9} "
          f"{'ratio':>6} {'min r':>6} {'GB/s':>6} {'%copy':>5}  note")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem in stems:
            for scale in args.scale:
                path, model, inputs = payload_files(manifest[stem], args.level, args.src, scale,
                                                    Path(tmp))  # fmt: skip
                for threads in args.threads:
                    row = {"payload": stem, "scale": scale, "threads": threads}
                    row |= measure_one(path, model, inputs, threads, args.rounds)
                    rows.append(row)
                    print(format_row(row, bandwidth, args.noisy), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    ratios = [r["torch_s"] / r["x86_s"] for r in rows if r.get("verified")]
    if ratios:
        print(f"# geomean ratio {float(np.exp(np.mean(np.log(ratios)))):.2f} over {len(ratios)}; "
              f"below 1.0: {sum(r < 1.0 for r in ratios)}")  # fmt: skip
    return 0 if all(r.get("verified") for r in rows) else 1


def format_row(row: dict, bandwidth: float, noisy: float) -> str:
    head = f"{row['payload']:34} {row['scale']:>5} {row['threads']:>3}"
    if not row.get("verified"):
        return f"{head} NOT VERIFIED: {row.get('message', '')[:200]}"
    gbs = row["bytes"] / row["x86_s"] / 1e9
    note = "noisy" if row["spread"] > noisy else ""
    ratio = row["torch_s"] / row["x86_s"]
    return (f"{head} {row['x86_s'] * 1e6:9.1f} {row['torch_s'] * 1e6:9.1f} {ratio:6.2f} "
            f"{row['min_ratio']:6.2f} {gbs:6.1f} {100 * gbs / bandwidth:5.0f}  {note}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
