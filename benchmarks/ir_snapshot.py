"""Snapshot the scheduled and lowered IR of every dev payload, and compare two snapshots.

A refactoring that must not change what the compiler produces is checked by taking a
snapshot before and after and comparing them byte for byte::

    python benchmarks/ir_snapshot.py --target x86-64-v4 --out /tmp/ir-before [FOLDER ...]
    python benchmarks/ir_snapshot.py --compare /tmp/ir-before /tmp/ir-after

The first form compiles every ``.mlir`` of each FOLDER (default: ``shared/kernelbench/
level1..3``, found beside the repository or in a parent folder) through ``--graph``
(default ``x86``) for the pinned ``--target``, stopping after the ``lower`` stage, and
writes per payload ``NAME.scheduled.mlir`` (the output of the stage tagged ``scheduled``)
and ``NAME.lowered.mlir`` (the LLVM-dialect module ``lower`` produced). A payload that
fails writes ``NAME.error.txt`` (the error's first line) instead, so a changed failure shows
up in the comparison too. Each payload compiles in a child process of its own with a time
limit and an address-space limit (``--timeout``, ``--memory-gb``): one payload that hangs
or blows up costs its own entry, not the run.

``--compare A B`` lists the files only in A, only in B and those whose bytes differ, and
exits 1 when there is any difference (0 when the snapshots are identical).

To snapshot other code (a checkout of an earlier commit), run this script from that
checkout: each child puts the script's repository first on ``PYTHONPATH``. With an
editable install, ``stagegraph.graphs`` still resolves to the installed repository's
``graphs/`` unless the checkout has ``stagegraph/graphs`` (a link to ``../graphs``).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from compile_time import find_shared  # this folder is on sys.path when run as a script

SCHEDULED_TAG = "scheduled"
LOWERED_STAGE = "lower"


def snapshot_one(payload: Path, target: str, out: Path, graph: str, threads: int | None) -> None:
    """Compile ``payload`` (in this process) and write its scheduled and lowered IR."""
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.core.engine import Hook, StageEvent
    from stagegraph.core.ports import Module

    texts: dict[str, str] = {}

    class Capture(Hook):
        """Print a stage's module output when it is made: later stages mutate it in place."""

        def __init__(self, wanted: dict[str, str]) -> None:
            self.wanted = wanted

        def after_stage(self, event: StageEvent) -> None:
            label = self.wanted.get(event.stage.name)
            if label is None:
                return
            for value in event.outputs.values():
                if isinstance(value, Module):
                    texts[label] = value.text()

    request = SessionRequest(graph=graph, workload=str(payload), target=target, threads=threads)
    stem = payload.stem
    try:
        with Session(request, cache=False) as session:
            wanted = {
                session.graph.node_for_tag(SCHEDULED_TAG): "scheduled",
                LOWERED_STAGE: "lowered",
            }
            session.hooks.append(Capture(wanted))
            session.engine.hooks = session.hooks
            session.compile(until=LOWERED_STAGE)
    except Exception as exc:  # recorded, so that a changed failure shows in the comparison
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        (out / f"{stem}.error.txt").write_text(f"{type(exc).__name__}: {first}\n")
        return
    for label, text in texts.items():
        (out / f"{stem}.{label}.mlir").write_text(text)


def _limits(memory_gb: float):
    def apply() -> None:
        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def snapshot(args: argparse.Namespace) -> int:
    """Compile every payload of the folders in a child process each; print one line each."""
    folders = [Path(f) for f in args.folders]
    if not folders:
        shared = find_shared()
        if shared is None:
            print("no shared/kernelbench found; name the payload folders", file=sys.stderr)
            return 2
        folders = [shared / "kernelbench" / f"level{n}" for n in (1, 2, 3)]
    payloads = sorted(p for folder in folders for p in folder.glob("*.mlir"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(repo))
    for index, payload in enumerate(payloads, 1):
        command = [sys.executable, __file__, "--one", str(payload), "--target", args.target]
        command += ["--out", str(out), "--graph", args.graph]
        if args.threads:
            command += ["--threads", str(args.threads)]
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command, env=env, timeout=args.timeout, capture_output=True, text=True,
                preexec_fn=_limits(args.memory_gb),
            )  # fmt: skip
            status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                (out / f"{payload.stem}.error.txt").write_text(f"child {status}: {tail}\n")
        except subprocess.TimeoutExpired:
            status = "timeout"
            (out / f"{payload.stem}.error.txt").write_text(f"timeout after {args.timeout}s\n")
        if (out / f"{payload.stem}.error.txt").exists() and status == "ok":
            status = "error"
        seconds = time.perf_counter() - start
        print(f"[{index}/{len(payloads)}] {payload.name}: {status} ({seconds:.1f} s)", flush=True)
    return 0


def compare(first: Path, second: Path) -> int:
    """Print the files that differ between two snapshots; 1 when any does."""
    names_a = {p.name for p in first.iterdir()}
    names_b = {p.name for p in second.iterdir()}
    only_a, only_b = sorted(names_a - names_b), sorted(names_b - names_a)
    common = sorted(names_a & names_b)
    differ = [n for n in common if not filecmp.cmp(first / n, second / n, shallow=False)]
    for name in only_a:
        print(f"only in {first}: {name}")
    for name in only_b:
        print(f"only in {second}: {name}")
    for name in differ:
        print(f"differs: {name}")
    same = len(common) - len(differ)
    print(f"{same} identical, {len(differ)} differ, {len(only_a)} + {len(only_b)} unmatched")
    return 1 if differ or only_a or only_b else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", help="folders of .mlir payloads")
    parser.add_argument("--target", default="x86-64-v4", help="pinned target name")
    parser.add_argument("--out", help="snapshot folder to write")
    parser.add_argument("--graph", default="x86")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per payload")
    parser.add_argument("--memory-gb", type=float, default=6.0, help="address space per child")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    if not args.out:
        parser.error("--out is required to take a snapshot")
    if args.one:
        snapshot_one(Path(args.one), args.target, Path(args.out), args.graph, args.threads)
        return 0
    return snapshot(args)


if __name__ == "__main__":
    sys.exit(main())
