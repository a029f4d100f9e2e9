"""The x86 graph's convolutions against PyTorch eager (oneDNN) on the KernelBench payloads.

For each convolution payload of a KernelBench folder (``l1_*conv*``, or ``--match``), the
x86 graph compiles and verifies the ``.mlir`` (its ``.npz`` reference) and PyTorch runs the
same module: the problem file (``src/levelN/<stem>.py``) executed with the manifest's
``scaled_constants`` in place of its own, so both sides compute the same shapes (PyTorch
with its own random weights: the values do not change a convolution's time). The two are
timed interleaved in one process (``stagegraph.app.bench.compare``), PyTorch on exactly as
many threads as the x86 code (``torch.set_num_threads``); above one thread both OpenMP
runtimes' idle workers sleep (``KMP_BLOCKTIME=0``, ``OMP_WAIT_POLICY=PASSIVE``) so neither
spins on the other's cores. Per payload the table gives both
medians, PyTorch time / x86 time (above 1: x86 is faster), and each side's GFLOP/s and
fraction of the FMA peak (``stagegraph.app.fma_peak``, measured in the same process before
and after the payloads: the best of the two). The first lines name the CPU, the ISA tier
and PyTorch's version. On a shared, loaded machine the ratios are noisy: a row marked
``~`` had samples too spread to quote. Usage:

    python benchmarks/conv_vs_torch.py ../shared/kernelbench/level1 [--threads 1]
        [--match l1_06] [--budget 2] [--target x86-64-v3] [--direct] [--conv KEY=VALUE] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np


class TorchMeasurement:
    """A KernelBench problem's ``Model`` in PyTorch eager, timed from Python (the same
    protocol as :class:`stagegraph.app.bench.NumpyMeasurement`)."""

    def __init__(self, problem: Path, constants: dict, threads: int, workload):
        import torch

        self.torch, self.threads, self.workload = torch, threads, workload
        scope: dict = {"__name__": f"kernelbench_{problem.stem}"}
        exec(compile(problem.read_text(), str(problem), "exec"), scope)
        scope.update({k: tuple(v) if isinstance(v, list) else v for k, v in constants.items()})
        torch.manual_seed(0)
        self.model = scope["Model"](*scope["get_init_inputs"]()).eval()
        self.inputs = [torch.from_numpy(np.array(x)) for x in workload.inputs()]

    def measure(self, count: int, warmup: int = 0) -> np.ndarray:
        torch = self.torch
        torch.set_num_threads(self.threads)
        out = np.empty(count)
        with torch.inference_mode():
            for _ in range(warmup):
                self.model(*self.inputs)
            for i in range(count):
                start = time.perf_counter()
                self.model(*self.inputs)
                out[i] = time.perf_counter() - start
        return out

    def report(self, samples: np.ndarray, threads: int | None = None):
        from stagegraph.app.bench import BenchReport, timing_fields
        from stagegraph.app.host import host_info

        return BenchReport(
            graph="torch", workload=self.workload.spec, splice_at="-", verified=True,
            threads=self.threads, payload_threads=self.threads, host=host_info(),
            **timing_fields(samples, self.workload.complexity),
        )  # fmt: skip


def conv_payloads(folder: Path, match: str | None) -> list[dict]:
    """The manifest entries of ``folder`` whose stem names a convolution (or ``match``)."""
    entries = json.loads((folder / "manifest.json").read_text())
    keep = [e for e in entries if e.get("mlir") and (folder / e["mlir"]).exists()]
    if match:
        return [e for e in keep if any(part in e["stem"] for part in match.split(","))]
    return [e for e in keep if "conv" in e["stem"].lower()]


def problem_file(folder: Path, stem: str) -> Path:
    """The problem file of payload ``stem`` (``src/levelN/<prefix>_*.py``: the file keeps
    the problem's own spelling, the stem a normalized one, so only the number is matched)."""
    prefix = "_".join(stem.split("_")[:2])
    found = sorted((folder.parent / "src" / folder.name).glob(f"{prefix}_*.py"))
    if not found:
        raise FileNotFoundError(f"no problem file {prefix}_*.py for {stem}")
    return found[0]


def measure_row(entry: dict, folder: Path, threads: int, budget: float, target, conv: dict) -> dict:
    """Compile, verify and compare one payload against PyTorch."""
    from stagegraph.app.bench import BenchOptions, compare, prepare
    from stagegraph.app.session import Session, SessionRequest

    path = folder / entry["mlir"]
    problem = problem_file(folder, entry["stem"])
    row: dict = {"payload": entry["stem"], "flops": entry.get("flops")}
    request = SessionRequest(graph="x86", workload=str(path), threads=threads, target=target)
    session = Session(request)
    graph = session.graph
    if conv:  # ConvGemmConfig fields (--direct: conv_gemm=False, the path before the GEMMs)
        graph = graph.with_config("normalize", **conv)
    fast = prepare(session.engine, graph, session.workload, None)
    row["verified"] = fast.verdict.ok
    row["compile_s"] = fast.result.trace.compile_seconds()
    if not fast.verdict.ok:
        row["error"] = fast.verdict.message
        return row
    peer = TorchMeasurement(problem, entry.get("scaled_constants") or {}, threads, fast.workload)
    options = BenchOptions(warmup=2, repeat=10, budget_s=budget, min_time_s=budget / 2)
    vs = compare(fast, peer, options, threads)
    row |= {"x86_s": vs.a.median_s, "torch_s": vs.b.median_s, "ratio": 1 / vs.ratio,
            "trustworthy": vs.trustworthy, "warning": vs.warning}  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--match", help="only payloads whose stem contains one of these (comma-separated)"
    )
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per comparison")
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument(
        "--direct", action="store_true", help="x86 without the implicit GEMM (the baseline)"
    )
    parser.add_argument(
        "--conv", action="append", default=[], metavar="KEY=VALUE",
        help="a ConvGemmConfig field for x86.normalize (ranks=1,2,3; col2im_max_useful=1)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON line per payload")
    args = parser.parse_args()
    if args.threads > 1:
        # Two OpenMP runtimes share this process (PyTorch's libgomp, the x86 code's
        # libiomp5): a side's idle workers must sleep, not spin on the cores the other side
        # is measured on (spinning, PyTorch at 2 threads read 20-100x its 1-thread time).
        # Set before either runtime loads; the user's own settings win.
        os.environ.setdefault("KMP_BLOCKTIME", "0")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch

    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.app.host import describe, host_info
    from stagegraph.stages.target import resolve_target

    target = resolve_target(args.target) if args.target else None
    conv = dict(item.split("=", 1) for item in args.conv)
    if "ranks" in conv:
        conv["ranks"] = frozenset(int(r) for r in conv["ranks"].split(","))
    if args.direct:
        conv["conv_gemm"] = False
    peak = fma_peak_gflops(args.threads, target)
    rows = []
    for entry in conv_payloads(args.folder, args.match):
        try:
            row = measure_row(entry, args.folder, args.threads, args.budget, args.target, conv)
        except Exception as error:
            row = {"payload": entry["stem"], "verified": False, "error": str(error)[:200]}
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    peak = max(peak, fma_peak_gflops(args.threads, target))
    print(f"{describe(host_info())}; PyTorch {torch.__version__} eager (oneDNN)  ")
    waits = f"; KMP_BLOCKTIME={os.environ.get('KMP_BLOCKTIME')}, OMP_WAIT_POLICY=" + str(
        os.environ.get("OMP_WAIT_POLICY")
    )
    print(f"threads {args.threads}; FMA peak {peak:.1f} GFLOP/s{waits}; shared machine: noisy  \n")
    print(table(rows, peak))


def table(rows: list[dict], peak: float) -> str:
    """A markdown table and the geometric mean of the ratios of verified rows."""
    head = "| payload | x86 ms | torch ms | torch/x86 | x86 GFLOP/s (peak) | torch GFLOP/s (peak) |"
    lines = [head, "|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        if not r.get("verified") or r.get("x86_s") is None:
            lines.append(f"| {r['payload']} | FAILED: {r.get('error', '')[:80]} | | | | |")
            continue
        ratios.append(r["ratio"])
        mark = "" if r.get("trustworthy") else "~"
        cells = [f"{r['x86_s'] * 1e3:.3f}", f"{r['torch_s'] * 1e3:.3f}", f"{mark}{r['ratio']:.2f}"]
        for side in ("x86_s", "torch_s"):
            rate = (r["flops"] or 0) / r[side] / 1e9
            cells.append(f"{rate:.1f} ({rate / peak:.0%})")
        lines.append(f"| {r['payload']} | " + " | ".join(cells) + " |")
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        slower = sum(x < 1 for x in ratios)
        lines.append(f"\ngeomean torch/x86 {geo:.2f} over {len(ratios)}; below 1.0: {slower}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
