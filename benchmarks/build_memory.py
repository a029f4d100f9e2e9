"""Peak resident memory of a whole-model build, per stage, next to the model's weights.

Each model is built in a child process of its own (a fresh interpreter, under an
address-space limit: ``--limit-gb``), the way ``stagegraph run`` builds it: a Session with
the stage memo and the reproducer hook on, from the problem file at batch 1 with 224x224
images (``benchmarks/real_size.py``) through the PyTorch import to a JIT binary. The child
reads its resident set (``VmRSS``) and its peak (``VmHWM``, reset before each stage through
``/proc/self/clear_refs``) around the import and every stage, so each stage's peak is its
own. ``weights MB``: the bytes of the model's parameters and buffers.

    python benchmarks/build_memory.py [--only VGG16] [--limit-gb 12]

Run one model at a time on a shared machine: VGG-16's build held 10 GB before this
measurement existed. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

MiB = 2**20


def _status() -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of this process in MiB."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            values[line[:5]] = int(line.split()[1]) // 1024
    return values["VmRSS"], values["VmHWM"]


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def child(spec: str) -> dict:
    """Build ``spec`` with the x86 graph; the import's and each stage's memory."""
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.core.engine import Hook

    rows: list[dict] = []
    overall = [0]

    class Memory(Hook):
        def before_stage(self, event) -> None:
            self.rss, peak = _status()
            overall[0] = max(overall[0], peak)
            _reset_peak()
            self.start = time.perf_counter()

        def after_stage(self, event) -> None:
            rss, peak = _status()
            overall[0] = max(overall[0], peak)
            rows.append({"stage": event.stage.name, "seconds": time.perf_counter() - self.start,
                         "before": self.rss, "peak": peak, "after": rss})  # fmt: skip

    request = SessionRequest(graph="x86", workload=spec, threads=1)
    with Session(request, extra_hooks=[Memory()]) as session:
        model = session.workload.problem.model
        weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        _reset_peak()
        start = time.perf_counter()
        session.prepare_workload()
        rss, peak = _status()
        overall[0] = max(overall[0], peak)
        imported = {"seconds": time.perf_counter() - start, "peak": peak, "after": rss}
        session.compile()
    overall[0] = max(overall[0], _status()[1])
    return {"weights_mib": weights / MiB, "import": imported, "stages": rows,
            "peak": overall[0]}  # fmt: skip


def measure(spec: str, limit_gb: float, timeout_s: float) -> dict:
    """Run :func:`child` in a fresh process under the address-space limit."""

    def limit() -> None:  # never above a limit this process is under (ulimit -v)
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        size = int(limit_gb * 2**30)
        size = size if hard == resource.RLIM_INFINITY else min(size, hard)
        resource.setrlimit(resource.RLIMIT_AS, (size, hard))

    command = [sys.executable, __file__, "--child", spec]
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:.0f} s"}
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.decode().strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:120]}"}
    return json.loads(lines[-1])


def report(name: str, result: dict) -> list[str]:
    """Markdown lines for one model: a summary row, then its stages."""
    if "error" in result:
        return [f"**{name}**: {result['error']}", ""]
    weights = result["weights_mib"]
    imported = result["import"]
    summary = (f"**{name}**: weights {weights:.0f} MiB; peak {result['peak']} MiB "
               f"({result['peak'] / weights:.1f}x the weights); import "
               f"{imported['seconds']:.1f} s, peak {imported['peak']} MiB")  # fmt: skip
    head = "| stage | s | MiB before | MiB peak | MiB after |"
    lines = [summary, "", head, "|---|---|---|---|---|"]
    for row in result["stages"]:
        lines.append(f"| {row['stage']} | {row['seconds']:.2f} | {row['before']} | "
                     f"{row['peak']} | {row['after']} |")  # fmt: skip
    return [*lines, ""]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="models whose names contain this")
    parser.add_argument("--limit-gb", type=float, default=12.0, help="address space per build")
    parser.add_argument("--timeout", type=float, default=900.0, help="per build (s)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compile_time import find_shared, host_line
    from real_size import model_specs

    shared = find_shared()
    if shared is None:
        print("no shared/kernelbench found beside the repository", file=sys.stderr)
        return 2
    print(f"{host_line()}  ")
    print(
        f"x86 graph, 1 thread, batch 1 at 224x224, each build in a fresh child under a "
        f"{args.limit_gb:g} GB address-space limit; MiB: resident memory\n"
    )
    for name, spec in model_specs(shared / "kernelbench", args.only):
        print("\n".join(report(name, measure(spec, args.limit_gb, args.timeout))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
