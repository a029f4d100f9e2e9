"""Compile KernelBench payloads through the ``gpu`` graph, assemble every kernel with ptxas,
and (``--build``) leave artifact folders that ``benchmarks/gpu_check.py --run`` runs on a GPU.

    python benchmarks/gpu_compile.py ../shared/kernelbench --targets sm_90a,sm_80
    python benchmarks/gpu_compile.py ../shared/kernelbench --targets sm_90a --build build/gpu
    python benchmarks/gpu_compile.py ../shared/kernelbench --targets cpu   # schedule on CPU

Each payload compiles in its own process (time and memory limits), so one crash or hang
costs one row. Prints the fraction that compiled and assembled per target, and every
failure with its reason. ``--build DIR`` also copies each payload's ``.npz`` (inputs and
reference outputs), its KernelBench problem file (for the PyTorch eager baseline) and its
scaled init inputs into ``DIR/<stem>/``: the folder is all the GPU machine needs. The
pseudo-target ``cpu`` runs the GPU schedule serially on the CPU (graph ``gpu_cpu``) and
verifies it against the payload's ``.npz``: the tiling's correctness, without a GPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

MEMORY_BYTES = 6 * 1024**3


def payloads(root: Path, levels: list[str]) -> list[Path]:
    """Level-1 and (dev) level-2 payloads: every ``.mlir`` of the level folders."""
    return [p for level in levels for p in sorted((root / level).glob("*.mlir"))]


def check_on_cpu(path: Path) -> dict:
    """In this (child) process: the GPU schedule run serially on the CPU (``gpu_cpu``
    graph) and verified against the payload's reference."""
    import stagegraph as sg

    try:
        report = sg.run("gpu_cpu", str(path))
    except Exception as error:  # every failure is a row of the report
        return {"ok": False, "stage": "cpu-check", "reason": f"{type(error).__name__}: {error}"}
    reason = "" if report.verified else report.message[:300]
    return {"ok": bool(report.verified), "stage": "" if report.verified else "verify",
            "reason": reason}  # fmt: skip


def compile_one(path: Path, target: str, out: Path) -> dict:
    """In this (child) process: compile, write the artifact, ptxas every kernel (target
    ``cpu``: :func:`check_on_cpu` instead)."""
    import stagegraph as sg
    from stagegraph.stages.gpu.ptx import assemble

    if target == "cpu":
        return check_on_cpu(path)

    started = time.perf_counter()
    try:
        sg.run("gpu", str(path), target=target, emit="object", output=str(out))
    except Exception as error:  # every failure is a row of the report
        return {"ok": False, "stage": "compile", "reason": f"{type(error).__name__}: {error}"}
    manifest = json.loads((out / "manifest.json").read_text())
    reports = []
    arch = manifest["target"]["name"]
    for ptx in sorted(out.glob("*.ptx")):
        try:
            reports += [r.__dict__ for r in assemble(ptx.read_text(), arch)]
        except Exception as error:
            return {"ok": False, "stage": "ptxas", "reason": f"{ptx.name}: {error}"}
    spills = [r for r in reports if r["spill_stores"] or r["spill_loads"]]
    return {
        "ok": not spills,
        "stage": "spills" if spills else "",
        "reason": f"spills in {[r['kernel'] for r in spills]}" if spills else "",
        "kernels": len(reports),
        "seconds": round(time.perf_counter() - started, 2),
    }


def run_child(path: Path, target: str, out: Path, timeout_s: float) -> dict:
    """:func:`compile_one` in a child process with a time and a memory limit."""

    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    command = [sys.executable, __file__, "--one", str(path), target, str(out)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=limit, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"ok": False, "stage": "timeout", "reason": f"over {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"ok": False, "stage": "crash", "reason": tail[0][:300]}
    return json.loads(lines[-1])


def copy_inputs(path: Path, root: Path, folder: Path) -> None:
    """The payload's .npz, problem file and scaled init inputs, next to its artifact."""
    shutil.copy(path.with_suffix(".npz"), folder / "data.npz")
    level = path.parent.name
    stem = path.stem
    sources = sorted((root / "src" / level).glob(stem[:6] + "*.py"))
    if sources:
        shutil.copy(sources[0], folder / "problem.py")
    manifest = json.loads((path.parent / "manifest.json").read_text())
    entry = next((m for m in manifest if m["stem"] == stem), None)
    if entry is not None:
        (folder / "init.json").write_text(json.dumps(entry.get("init_inputs", [])))
        (folder / "constants.json").write_text(json.dumps(entry.get("scaled_constants", {})))


def problem_folder_name(spec: str) -> str:
    """``l1_019_ReLU.py:batch_size=8192,dim=16384`` -> ``l1_019_ReLU-batch_size8192-dim16384``
    (letters, digits, ``.``, ``_`` and ``-`` only)."""
    path, _, params = spec.partition(":")
    tag = "-".join(p.replace("=", "") for p in params.split(",") if p)
    name = Path(path).stem + (f"-{tag}" if tag else "")
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def copy_problem(spec: str, folder: Path) -> None:
    """A problem-file case carries no ``.npz``: its problem file and overrides (as written)
    go beside the artifact, and ``gpu_check --run`` builds the model, its inputs and the
    reference on the GPU machine from them (the same seed, so the same weights)."""
    path, _, params = spec.partition(":")
    overrides = dict(item.split("=", 1) for item in params.split(",") if item)
    seed = int(overrides.pop("seed", 0))
    shutil.copy(path, folder / "problem.py")
    (folder / "problem.json").write_text(json.dumps({"overrides": overrides, "seed": seed}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("../shared/kernelbench"))
    parser.add_argument("--targets", default="sm_90a,sm_80")
    parser.add_argument("--levels", default="level1,level2")
    parser.add_argument("--build", type=Path, help="keep artifacts here (for gpu_check --run)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", default="", help="substring of the payload stems to keep")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--problem", action="append", default=[], metavar="FILE.py[:k=v,..]",
                        help="also compile this PyTorch problem file at these sizes (no .npz: "
                        "gpu_check --run makes its inputs and reference on the GPU)")  # fmt: skip
    args = parser.parse_args()
    scratch = args.build or Path("/tmp/stagegraph-gpu-sweep")
    rows = []
    for path in payloads(args.root, [lv for lv in args.levels.split(",") if lv]):
        if args.only and args.only not in path.stem:
            continue
        for target in args.targets.split(","):
            folder = scratch / target / path.stem
            shutil.rmtree(folder, ignore_errors=True)
            row = {"payload": path.stem, "target": target,
                   **run_child(path, target, folder, args.timeout)}  # fmt: skip
            if row["ok"] and args.build:
                copy_inputs(path, args.root, folder)
            elif not args.build:
                shutil.rmtree(folder, ignore_errors=True)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for spec in args.problem:
        for target in args.targets.split(","):
            folder = scratch / target / problem_folder_name(spec)
            shutil.rmtree(folder, ignore_errors=True)
            row = {"payload": folder.name, "target": target,
                   **run_child(spec, target, folder, args.timeout)}  # fmt: skip
            if row["ok"] and args.build:
                copy_problem(spec, folder)
            rows.append(row)
            print(json.dumps(row), flush=True)
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def report(rows: list[dict]) -> None:
    """The fraction per target, then each failure with its reason."""
    for target in sorted({r["target"] for r in rows}):
        mine = [r for r in rows if r["target"] == target]
        ok = sum(r["ok"] for r in mine)
        share = 100 * ok / max(1, len(mine))
        what = "verified on the CPU" if target == "cpu" else "compiled and assembled"
        print(f"{target}: {ok}/{len(mine)} {what} ({share:.0f}%)")
    for r in rows:
        if not r["ok"]:
            print(f"  {r['target']} {r['payload']}: [{r['stage']}] {r['reason'][:200]}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        out = Path(sys.argv[4])
        print(json.dumps(compile_one(Path(sys.argv[2]), sys.argv[3], out)))
        sys.exit(0)
    sys.exit(main())
