"""Compile time and peak memory of the x86 graph next to ``iree-compile``, per payload.

Each compile runs in a child process of its own (a fresh interpreter), so its wall time
includes nothing of the others and its peak resident memory is that child's (``wait4``
reports the largest resident set of the child and of the processes it waited for: IREE's
compiler runs as a grandchild). The x86 side compiles from the payload file to a JIT
binary (every stage of the x86 graph but the run); IREE compiles the same text for the same
host with the flags ``bench --vs iree`` uses (``stagegraph.app.iree.compile_vmfb``).

Three modes::

    python benchmarks/compile_time.py [FOLDER] [--timeout S] [--no-iree]
    python benchmarks/compile_time.py --models [--only ResNet18] [--threads 1]
    python benchmarks/compile_time.py --curve [--sizes 250,500,1000,2000,4000]

The first compiles every ``.mlir`` of FOLDER (default: ``shared/kernelbench/level3``,
found beside the repository or in a parent folder, as the tests find it) and prints a
table: ops, x86 seconds and peak MiB, IREE seconds and peak MiB, and x86 time / IREE time.
``--models`` compiles the dev level-3 models at batch 1 with 224x224 images (the problem
files with the overrides of ``benchmarks/real_size.py``) and prints, per model, the seconds
of each stage of the x86 graph, its total (wall and CPU) and ``iree-compile``'s on the same
imported text. ``--curve`` compiles synthetic unrolled recurrent networks (a matmul and an
elementwise cell per step) of about N ops each and prints seconds and seconds per op for
each N: a linear compile time shows as a flat seconds-per-op column.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 2**20
#: Threads the x86 side compiles for (``--threads``; passed to the children by the
#: environment, as their command line names only the job).
THREADS = int(os.environ.get("STAGEGRAPH_COMPILE_TIME_THREADS", "1"))


def find_shared() -> Path | None:
    """``shared/`` holding ``kernelbench``, beside the repository or in a parent folder."""
    here = Path(__file__).resolve().parent
    for parent in [here, *here.parents]:
        candidate = parent / "shared"
        if (candidate / "kernelbench").is_dir():
            return candidate
    return None


# ----------------------------------------------------------------------------- children


def count_ops(text: str) -> int:
    """Operations in the payload (every op, nested ones included)."""
    from stagegraph.mlir.bindings import ir, new_context

    context = new_context()
    with context:
        module = ir.Module.parse(text)
    count = 0

    def visit(_op: object) -> object:
        nonlocal count
        count += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return count - 1  # not the module itself


def cpu_seconds(who: int) -> float:
    """User + system CPU seconds of this process (``RUSAGE_SELF``) or of the children it
    waited for (``RUSAGE_CHILDREN``: ``iree-compile``)."""
    import resource

    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def child_x86(path: str) -> dict:
    """Compile ``path`` (a payload file or a problem-file spec) through the x86 graph to a
    JIT binary (in this child): wall and CPU seconds, per stage too. A PyTorch model's
    import is timed apart (``import_s``): IREE gets the imported text."""
    import resource

    from stagegraph.app.session import Session, SessionRequest

    start = time.perf_counter()
    with Session(SessionRequest(graph="x86", workload=path, threads=THREADS)) as session:
        before = time.perf_counter()
        session.prepare_workload()
        imported = time.perf_counter() - before
        cpu = cpu_seconds(resource.RUSAGE_SELF)
        result = session.compile()
        cpu = cpu_seconds(resource.RUSAGE_SELF) - cpu
    return {"seconds": time.perf_counter() - start - imported, "cpu_s": cpu,
            "import_s": imported,
            "stages": {r.name: r.seconds for r in result.trace.records}}  # fmt: skip


def child_iree(path: str) -> dict:
    """Compile ``path`` with IREE for this host (in this child; IREE in a grandchild)."""
    import resource

    from stagegraph.app.iree import compile_vmfb, payload_text
    from stagegraph.app.session import open_workload

    text = payload_text(open_workload(path))
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) + cpu_seconds(resource.RUSAGE_SELF)
    start = time.perf_counter()
    compile_vmfb(text, None, source=Path(path.partition(":")[0]).name)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) + cpu_seconds(resource.RUSAGE_SELF) - cpu
    return {"seconds": seconds, "cpu_s": cpu}


def child_ops(path: str) -> dict:
    return {"ops": count_ops(Path(path).read_text())}


CHILDREN = {"x86": child_x86, "iree": child_iree, "ops": child_ops}


def measure(kind: str, path: Path | str, timeout_s: float) -> dict:
    """Run ``kind`` on ``path`` in a fresh child: its result, wall seconds, peak MiB, and
    an ``error`` when it failed or ran out of time."""
    command = [sys.executable, __file__, "--child", kind, str(path)]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": f"timeout after {timeout_s:.0f} s", "wall": time.perf_counter() - start}
    # The child reports its own peak (this process's RUSAGE_CHILDREN only ever grows: it
    # is the maximum over every child so far, not this one's).
    wall = time.perf_counter() - start
    lines = out.decode().strip().splitlines()
    if process.returncode != 0 or not lines:
        tail = err.decode().strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {process.returncode}: {tail[0][:100]}", "wall": wall}
    result = json.loads(lines[-1])
    result["wall"] = wall
    return result


def run_child(kind: str, path: str) -> None:
    """Child entry: run the job, then print its result with this process's peak memory
    (including the children it waited for, e.g. ``iree-compile``) as one JSON line."""
    import resource

    result = CHILDREN[kind](path)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result["peak_mib"] = max(own, children) * 1024 / MiB  # ru_maxrss is in KiB on Linux
    print(json.dumps(result))


# ----------------------------------------------------------------------------- table


def host_line() -> str:
    from stagegraph.app.host import describe, host_info

    return describe(host_info())


def fmt(value: float | None, spec: str = "{:.2f}") -> str:
    return spec.format(value) if value is not None else "-"


def cache_bytecode() -> str:
    """Compile stagegraph's own Python modules to bytecode before any timing, and say so.

    An installed package has its ``.pyc`` files; a checkout run with
    ``PYTHONDONTWRITEBYTECODE=1`` (as some sandboxes and CI images set) never writes them,
    so every fresh child would first compile the project's sources (0.1-0.2 s, a tenth of
    a small model's compile) and time Python rather than the x86 graph. ``compileall``
    writes them explicitly; the children only read them."""
    import compileall

    import stagegraph

    package = Path(stagegraph.__file__).parent
    for folder in (package, package.parent / "graphs"):  # the graph files of a checkout too
        if folder.is_dir():
            compileall.compile_dir(str(folder), quiet=1)
    return "stagegraph's bytecode compiled first (as an installed package has it)"


def table(folder: Path, timeout_s: float, with_iree: bool) -> int:
    print(f"{host_line()}  ")
    print(f"payloads: {folder}; each compile in a fresh child process, limit {timeout_s:.0f} s; "
          f"{cache_bytecode()}")  # fmt: skip
    print()
    print("| model | ops | x86 compile s | x86 peak MiB | IREE compile s | IREE peak MiB "
          "| x86/IREE |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for path in sorted(folder.glob("*.mlir")):
        ops = measure("ops", path, timeout_s).get("ops")
        x86 = measure("x86", path, timeout_s)
        iree = measure("iree", path, timeout_s) if with_iree else {"error": "skipped"}
        x86_s = None if "error" in x86 else x86["seconds"]
        iree_s = None if "error" in iree else iree["seconds"]
        ratio = x86_s / iree_s if x86_s and iree_s else None
        x86_cell = fmt(x86_s) if x86_s is not None else x86["error"]
        iree_cell = fmt(iree_s) if iree_s is not None else iree["error"]
        print(f"| {path.stem} | {ops if ops is not None else '-'} | {x86_cell} | "
              f"{fmt(x86.get('peak_mib'), '{:.0f}')} | {iree_cell} | "
              f"{fmt(iree.get('peak_mib'), '{:.0f}')} | {fmt(ratio)} |")  # fmt: skip
        sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------- models


def stage_table(results: list[tuple[str, dict, dict]]) -> list[str]:
    """Markdown lines: per model, the import, each x86 stage's seconds, the x86 total (wall
    and CPU), IREE's (wall and CPU) and x86 wall / IREE wall. A failed side shows its error."""
    stages = list(dict.fromkeys(n for _, x86, _ in results for n in x86.get("stages", {})))
    head = ["model", "import s", *stages, "x86 s", "x86 CPU s", "IREE s", "IREE CPU s",
            "x86/IREE"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, x86, iree in results:
        x86_s, iree_s = x86.get("seconds"), iree.get("seconds")
        cells = [name, fmt(x86.get("import_s"))]
        cells += [fmt(x86.get("stages", {}).get(n)) for n in stages]
        cells += [fmt(x86_s) if "error" not in x86 else x86["error"], fmt(x86.get("cpu_s"))]
        cells += [fmt(iree_s) if "error" not in iree else iree["error"], fmt(iree.get("cpu_s"))]
        cells.append(fmt(x86_s / iree_s if x86_s and iree_s and "error" not in x86 else None))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def models(only: str, timeout_s: float, with_iree: bool) -> int:
    """Compile time per stage of the dev level-3 models at batch 1 with 224x224 images
    (``benchmarks/real_size.py``) next to ``iree-compile`` on the same imported text."""
    from real_size import model_specs

    shared = find_shared()
    if shared is None:
        print("no shared/kernelbench found beside the repository", file=sys.stderr)
        return 2
    print(f"{host_line()}  ")
    print(f"dev level-3 models at batch 1, 224x224; x86 compiled for {THREADS} thread(s); "
          f"each compile in a fresh child process, limit {timeout_s:.0f} s; the PyTorch "
          f"import (import s) is not counted on either side; CPU s: user + system seconds "
          f"(IREE's compiler uses several threads); {cache_bytecode()}")  # fmt: skip
    print()
    results = []
    for name, spec in model_specs(shared / "kernelbench", only):
        x86 = measure("x86", spec, timeout_s)
        iree = measure("iree", spec, timeout_s) if with_iree else {"error": "skipped"}
        results.append((name, x86, iree))
        print(f"... {name}: x86 {fmt(x86.get('seconds'))} s, IREE {fmt(iree.get('seconds'))} s",
              file=sys.stderr, flush=True)  # fmt: skip
    print("\n".join(stage_table(results)))
    return 0


# ----------------------------------------------------------------------------- curve


def recurrent_payload(steps: int, batch: int = 8, hidden: int = 32) -> str:
    """An unrolled recurrent network: per step ``h = tanh(h @ W + x) * sigmoid(h) + h``
    (a matmul, then elementwise ops, some with two users), as a tensor-level payload."""
    t = f"tensor<{batch}x{hidden}xf32>"
    w = f"tensor<{hidden}x{hidden}xf32>"
    lines = [
        "#id = affine_map<(d0, d1) -> (d0, d1)>",
        f"func.func @main(%h0: {t}, %w: {w}, %x: {t}) -> {t} {{",
        "  %zero = arith.constant 0.0 : f32",
        "  %one = arith.constant 1.0 : f32",
        f"  %e = tensor.empty() : {t}",
        f"  %acc = linalg.fill ins(%zero : f32) outs(%e : {t}) -> {t}",
    ]

    def generic(name: str, ins: list[str], body: list[str]) -> None:
        maps = ", ".join(["#id"] * (len(ins) + 1))
        args = ", ".join(f"%a{i}: f32" for i in range(len(ins)))
        lines.extend([
            f"  {name} = linalg.generic {{indexing_maps = [{maps}], iterator_types = "
            f'["parallel", "parallel"]}} ins({", ".join(ins)} : {", ".join([t] * len(ins))}) '
            f"outs(%e : {t}) {{",
            f"  ^bb0({args}, %o: f32):",
            *[f"    {line}" for line in body],
            f"  }} -> {t}",
        ])  # fmt: skip

    h = "%h0"
    for s in range(steps):
        lines.append(f"  %m{s} = linalg.matmul ins({h}, %w : {t}, {w}) outs(%acc : {t}) -> {t}")
        add = ["%r = arith.addf %a0, %a1 : f32", "linalg.yield %r : f32"]
        mul = ["%r = arith.mulf %a0, %a1 : f32", "linalg.yield %r : f32"]
        sigmoid = [
            "%n = arith.negf %a0 : f32",
            "%x1 = math.exp %n : f32",
            "%d = arith.addf %x1, %one : f32",
            "%r = arith.divf %one, %d : f32",
            "linalg.yield %r : f32",
        ]
        generic(f"%p{s}", [f"%m{s}", "%x"], add)
        generic(f"%t{s}", [f"%p{s}"], ["%r = math.tanh %a0 : f32", "linalg.yield %r : f32"])
        generic(f"%g{s}", [h], sigmoid)
        generic(f"%q{s}", [f"%t{s}", f"%g{s}"], mul)
        generic(f"%h{s + 1}", [f"%q{s}", h], add)
        h = f"%h{s + 1}"
    lines += [f"  return {h} : {t}", "}"]
    return "\n".join(lines)


def curve(sizes: list[int], timeout_s: float) -> int:
    print(f"{host_line()}  ")
    print("synthetic unrolled recurrent payloads (matmul + elementwise cell per step); "
          f"each compile in a fresh child process; {cache_bytecode()}")  # fmt: skip
    print()
    print("| N (ops) | steps | x86 compile s | s per 1000 ops | peak MiB |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            # Every op of the payload (bodies included) counts, as in the table mode.
            steps = max(1, (n - 7) // 22)  # 22 ops per step, 7 around them
            path = Path(tmp) / f"rnn_{n}.mlir"
            text = recurrent_payload(steps)
            path.write_text(text)
            ops = count_ops(text)
            result = measure("x86", path, timeout_s)
            if "error" in result:
                print(f"| {ops} | {steps} | {result['error']} | - | - |")
                continue
            seconds = result["seconds"]
            print(f"| {ops} | {steps} | {seconds:.2f} | {seconds / ops * 1e3:.3f} | "
                  f"{result['peak_mib']:.0f} |")  # fmt: skip
            sys.stdout.flush()
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--curve", action="store_true")
    parser.add_argument("--sizes", default="250,500,1000,2000,4000")
    parser.add_argument("--timeout", type=float, default=600.0, help="per compile (s)")
    parser.add_argument("--no-iree", action="store_true")
    parser.add_argument("--models", action="store_true",
                        help="the dev level-3 models at batch 1, 224x224, per stage")  # fmt: skip
    parser.add_argument("--only", default="", help="--models: names containing this")
    parser.add_argument("--threads", type=int, default=1, help="x86: compile for this many")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.environ["STAGEGRAPH_COMPILE_TIME_THREADS"] = str(args.threads)
    global THREADS
    THREADS = args.threads
    if args.models:
        return models(args.only, args.timeout, not args.no_iree)
    if args.curve:
        return curve([int(s) for s in args.sizes.split(",")], args.timeout)
    folder = args.folder
    if folder is None:
        shared = find_shared()
        if shared is None:
            parser.error("no shared/kernelbench found beside the repository; give FOLDER")
        folder = shared / "kernelbench" / "level3"
    return table(folder, args.timeout, not args.no_iree)


if __name__ == "__main__":
    sys.exit(main())
