"""Run KernelBench problem files from their ``.py`` through a graph and verify them against
eager PyTorch: the PyTorch front door's coverage.

Each problem file ``src/levelN/<stem>.py`` runs at the sizes its shipped payload was scaled
to (``scaled_constants`` of ``levelN/manifest.json``); a file with no shipped payload (the
large level-3 models) runs at the sizes of :data:`LEVEL3_SIZES`. The scaler also changed
literals inside some functions (``lit:get_inputs@68:48`` in the manifest: line 68, column
48 of ``get_inputs``); the spec passes those on as they are. Every problem is
imported, compiled, run and verified in an isolated child process with a time and memory
limit, so a crash or a hang is a row, not the end. Usage:

    python benchmarks/kernelbench_torch_coverage.py ../shared/kernelbench [--levels 1 2 3]
        [--timeout S] [--memory GB] [--json] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from stagegraph.app.child_process import Limits
from stagegraph.errors import StagegraphError

#: Sizes of the level-3 models that have no shipped payload (by problem number): batch 1 and,
#: where the model does not fix its input size (a final 7x7 pool, a classifier sized for
#: 224x224), smaller images and sequences.
LEVEL3_SIZES: dict[str, dict[str, Any]] = {
    "l3_003": {"batch_size": 8, "input_size": 256, "output_size": 256},
    "l3_005": {"batch_size": 1},
    "l3_007": {"batch_size": 1, "height": 64, "width": 64},
    "l3_009": {"batch_size": 1, "input_shape": [1, 3, 64, 64]},
    "l3_011": {"batch_size": 1},
    "l3_015": {"batch_size": 1, "height": 64, "width": 64},
    "l3_019": {"batch_size": 1},
    "l3_023": {"batch_size": 1},
    "l3_029": {"batch_size": 1},
    "l3_035": {"batch_size": 2, "sequence_length": 16},
    "l3_045": {"batch_size": 1, "height": 32, "width": 64, "features": 16},
    "l3_049": {"batch_size": 2},
}


def format_value(value: Any) -> str:
    """A manifest constant in the spec syntax (lists as ``AxB``)."""
    if isinstance(value, list | tuple):
        return "x".join(str(int(v)) for v in value)
    return str(value)


def problem_spec(path: Path, constants: dict[str, Any]) -> str:
    """``path:name=value,...``; a manifest key ``height=width`` (a chained assignment)
    sets each name, and a later key for one of them (``height``) wins."""
    values: dict[str, Any] = {}
    for key, value in constants.items():
        values.update(dict.fromkeys(key.split("="), value))
    items = [f"{name}={format_value(value)}" for name, value in values.items()]
    return f"{path}:{','.join(items)}" if items else str(path)


def manifest_sizes(root: Path, level: int) -> dict[str, dict[str, Any]]:
    """Problem number (``l2_011``) -> the constants its shipped payload was scaled to."""
    manifest = root / f"level{level}" / "manifest.json"
    if not manifest.is_file():
        return {}
    entries = json.loads(manifest.read_text())
    return {
        e["stem"][:6]: e.get("scaled_constants") or {}  # lit: keys too (literals in functions)
        for e in entries
    }  # fmt: skip


def problem_specs(root: Path, levels: list[int], only: str = "") -> list[tuple[str, str]]:
    """``(name, spec)`` of every problem file of ``levels`` (see the module docstring)."""
    specs = []
    for level in levels:
        sizes = manifest_sizes(root, level)
        for path in sorted((root / "src" / f"level{level}").glob("*.py")):
            if only and only not in path.stem:
                continue
            constants = {**sizes.get(path.stem[:6], {}), **LEVEL3_SIZES.get(path.stem[:6], {})}
            specs.append((path.stem, problem_spec(path.resolve(), constants)))
    return specs


def problem_file(payload: Path) -> Path | None:
    """The problem file of a shipped payload (``levelN/lN_XXX_*.mlir``): its file in
    ``src/levelN``; None when there is none."""
    if not payload.parent.name.removeprefix("level").isdigit():
        return None
    found = sorted((payload.parent.parent / "src" / payload.parent.name).glob(
        f"{payload.stem[:6]}_*.py"))  # fmt: skip
    return found[0].resolve() if found else None


def payload_problem_spec(payload: Path) -> str | None:
    """The problem-file spec of a shipped payload: its file in ``src/levelN`` at the
    payload's ``scaled_constants``; None when there is none."""
    source = problem_file(payload)
    if source is None:
        return None
    level = int(payload.parent.name.removeprefix("level"))
    return problem_spec(source, manifest_sizes(payload.parent.parent, level).get(
        payload.stem[:6], {}))  # fmt: skip


def check(graph: str, spec: str) -> dict[str, Any]:
    """Import, compile, run and verify one problem (runs in the child)."""
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session, SessionRequest

    with Session(SessionRequest(graph=graph, workload=spec)) as session:
        report = run_report(session)
    return {"verified": bool(report.verified), "message": report.message}


def run_all(specs: list[tuple[str, str]], graph: str, limits: Limits) -> list[dict[str, Any]]:
    rows = []
    for name, spec in specs:
        start = time.perf_counter()
        try:
            result = limits.run(check, graph, spec, label=name)
        except StagegraphError as exc:
            result = {"verified": False, "message": " ".join(str(exc).split())[:400]}
        result.update(problem=name, spec=spec, seconds=round(time.perf_counter() - start, 1))
        rows.append(result)
        status = "ok" if result["verified"] else f"FAIL {result['message'][:160]}"
        print(f"{name}: {status} ({result['seconds']} s)", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the kernelbench folder (src/, levelN/)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--graph", default="x86")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--memory", type=float, default=6.0, help="GiB per problem")
    parser.add_argument("--only", default="", help="problems whose name contains this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    limits = Limits(timeout_s=args.timeout, memory_bytes=int(args.memory * 2**30))
    rows = run_all(problem_specs(args.root, args.levels, args.only), args.graph, limits)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for level in args.levels:
        mine = [r for r in rows if r["problem"].startswith(f"l{level}_")]
        passed = sum(r["verified"] for r in mine)
        print(f"level {level}: {passed} of {len(mine)} verified")
        for r in mine:
            if not r["verified"]:
                print(f"  {r['problem']}: {r['message']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
