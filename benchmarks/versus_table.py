"""The real-size tables of ``benchmarks/kernelbench.py --vs``: the x86 graph against PyTorch
eager, ``torch.compile`` and IREE, payload by payload.

Each payload is a problem-file spec (:mod:`real_size`: the dev level-2 problems at their
shipped sizes or with every input ``--scale`` times larger, or the dev level-3 models at
batch 1 with 224x224 images). One isolated child per payload (time and memory limit: a
crash or a hang is a row, not the end) compiles and verifies the x86 graph once, then for
each peer does what ``stagegraph bench --vs PEER`` does: the peer is prepared and verified
on the same inputs and threads, and both are timed interleaved (paired rounds, so load on a
shared machine hits both alike). A peer's speedup is its time over x86's (above 1: x86 is
faster). Every finished row is written to the ``--save`` file (JSON, or CSV by suffix)
before the next payload starts, so an error or an interrupt loses nothing measured.

The table names the host CPU and its ISA tier, the threads granted to every side and those
the x86 code chose, each side's GFLOP/s and fraction of the FMA peak
(:func:`stagegraph.app.fma_peak.fma_peak_gflops` on the granted threads), the geometric
mean of the speedups per peer and how many are below 1.0.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

from stagegraph.app.child_process import Limits
from stagegraph.core.ports import Schema
from stagegraph.errors import StagegraphError

PEER_NAMES = ("torch", "torch-compile", "iree")

#: x86's time in a later pair that differs from the first by more than this is shown next
#: to the peer's (the machine's load changed between pairs; each speedup is from its pair).
DRIFT = 0.1


class PeerResult(Schema):
    """One peer on one payload."""

    seconds: float | None = None
    gflops: float | None = None
    speedup: float | None = None  # peer time / x86 time, paired rounds (above 1: x86 faster)
    x86_s: float | None = None  # x86's time in this pair (the load may change between pairs)
    trustworthy: bool | None = None
    error: str = ""


class VsRow(Schema):
    """One payload: the x86 side and each peer."""

    payload: str
    spec: str = ""
    verified: bool = False
    x86_s: float | None = None
    gflops: float | None = None
    compile_s: float | None = None
    payload_threads: int | None = None
    peers: dict[str, PeerResult] = Field(default_factory=dict)
    error: str = ""


def measure_versus(spec: str, peers: list[str], threads: int | None, budget_s: float) -> dict:
    """Compile and verify ``spec`` through the x86 graph, then time it against each peer
    interleaved (runs in the child; a peer's failure stays in its own entry)."""
    from stagegraph.app.bench import compare, prepare
    from stagegraph.app.bench_options import BenchOptions
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.app.versus import PEERS, check_versus
    from stagegraph.core.registry import import_entry

    options = BenchOptions(warmup=1, repeat=6, budget_s=budget_s)
    with Session(SessionRequest(graph="x86", workload=spec, threads=threads)) as session:
        session.prepare_workload()
        x86 = prepare(session.engine, session.graph, session.workload, None)
        own = x86.report(None, threads)
        host = own.host.model_dump(mode="json") if own.host else None
        out: dict[str, Any] = {"verified": own.verified, "message": own.message,
                               "compile_s": own.compile_seconds, "host": host,
                               "payload_threads": own.payload_threads, "peers": {}}  # fmt: skip
        if not own.verified:
            return out
        for peer in peers:
            try:
                check_versus(peer)
                other = import_entry(PEERS.get(peer).measurement)(session)
                if not other.verdict.ok:
                    out["peers"][peer] = {"error": f"not verified: {other.verdict.message}"}
                    continue
                result = compare(x86, other, options, threads)
            except StagegraphError as exc:
                out["peers"][peer] = {"error": " ".join(str(exc).split())[:300]}
                continue
            out["peers"][peer] = {
                "seconds": result.b.median_s, "gflops": result.b.gflops,
                "speedup": 1 / result.ratio if result.ratio else None,
                "trustworthy": result.trustworthy, "x86_s": result.a.median_s,
            }  # fmt: skip
            out.setdefault("x86_s", result.a.median_s)
            out.setdefault("gflops", result.a.gflops)
        if "x86_s" not in out:  # no peer asked for or none measured: x86 alone
            from stagegraph.app.bench import sample

            x86.measure(1, warmup=1)
            samples, _ = sample(x86.measure, options)
            timed = x86.report(samples, threads)
            out.update(x86_s=timed.median_s, gflops=timed.gflops)
    return out


def row_from(name: str, spec: str, result: dict) -> VsRow:
    """The row of one payload from its child's result."""
    peers = {p: PeerResult(**r) for p, r in result.get("peers", {}).items()}
    return VsRow(
        payload=name, spec=spec, verified=bool(result.get("verified")),
        x86_s=result.get("x86_s"), gflops=result.get("gflops"),
        compile_s=result.get("compile_s"), payload_threads=result.get("payload_threads"),
        peers=peers, error="" if result.get("verified") else result.get("message", ""),
    )  # fmt: skip


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(rows: list[VsRow], peers: list[str]) -> dict[str, dict[str, Any]]:
    """Per peer: the payloads both sides measured, the geometric-mean speedup, and the
    payloads where x86 is slower (speedup below 1.0)."""
    result = {}
    for peer in peers:
        pairs = [(r.payload, r.peers[peer].speedup) for r in rows
                 if r.verified and peer in r.peers and r.peers[peer].speedup]  # fmt: skip
        result[peer] = {
            "payloads": len(pairs),
            "geomean_speedup": geomean([s for _, s in pairs]),
            "below_1": sorted(name for name, s in pairs if s < 1.0),
        }
    return result


def _cell(value: float | None, spec: str) -> str:
    return spec.format(value) if value else "-"


def _peak_cell(gflops: float | None, peak: float | None) -> str:
    return f"{gflops / peak:.0%}" if gflops and peak else "-"


def table_lines(
    rows: list[VsRow], peers: list[str], header: list[str], peak: float | None
) -> list[str]:
    """The markdown table (one line per payload, then the geometric means) and the lines
    after it (per peer: how many payloads x86 is slower on, and which)."""
    head = "| payload | verified | thr | x86 ms | x86 GFLOP/s | x86 % peak |"
    rule = "|---|---|---|---|---|---|"
    for peer in peers:
        head += f" {peer} ms | {peer} % peak | {peer}/x86 time |"
        rule += "---|---|---|"
    lines = [f"{line}  " for line in header] + ["", head, rule]
    for r in rows:
        status = "yes" if r.verified else f"no ({r.error[:50]})"
        line = (f"| {r.payload} | {status} | {r.payload_threads or '-'} | "
                f"{_cell(r.x86_s and r.x86_s * 1e3, '{:.3f}')} | {_cell(r.gflops, '{:.1f}')} | "
                f"{_peak_cell(r.gflops, peak)} |")  # fmt: skip
        for peer in peers:
            p = r.peers.get(peer, PeerResult())
            speed = _cell(p.speedup, "{:.2f}") if not p.error else f"({p.error[:40]})"
            if p.speedup and p.trustworthy is False:
                speed += " (noisy)"
            ms = _cell(p.seconds and p.seconds * 1e3, "{:.3f}")
            if p.x86_s and r.x86_s and abs(p.x86_s / r.x86_s - 1) > DRIFT:
                ms += f" (x86 {p.x86_s * 1e3:.3f})"
            line += f" {ms} | {_peak_cell(p.gflops, peak)} | {speed} |"
        lines.append(line)
    totals = summary(rows, peers)
    verified = sum(r.verified for r in rows)
    line = f"| geometric mean | {verified} of {len(rows)} | | | | |"
    for peer in peers:
        line += f" | | {_cell(totals[peer]['geomean_speedup'], '{:.2f}')} |"
    lines += [line, ""]
    for peer in peers:
        t = totals[peer]
        below = ", ".join(t["below_1"]) or "none"
        lines.append(f"{peer}: geometric-mean speedup {_cell(t['geomean_speedup'], '{:.2f}')} "
                     f"over {t['payloads']} payloads; below 1.0: {len(t['below_1'])} "
                     f"({below})")  # fmt: skip
    return lines


def save(path: Path, rows: list[VsRow], meta: dict) -> None:
    """Write the rows so far: JSON (rows and ``meta``), or CSV (one flat line per row and
    peer columns) when ``path`` ends in ``.csv``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix != ".csv":
        data = {"meta": meta, "rows": [r.model_dump() for r in rows]}
        path.write_text(json.dumps(data, indent=1))
        return
    flat = []
    for r in rows:
        entry = r.model_dump(exclude={"peers"})
        for peer, p in r.peers.items():
            entry |= {f"{peer}_{k}": v for k, v in p.model_dump().items()}
        flat.append(entry)
    names = list(dict.fromkeys(k for entry in flat for k in entry))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows(flat)


def fma_peak(threads: int | None) -> float:
    """GFLOP/s of the FMA loop on the granted threads, the best of three sustained runs (a
    shared machine takes the core away now and then; the peak is what the core can do)."""
    from stagegraph.app.fma_peak import fma_peak_gflops
    from stagegraph.runtime.cores import usable_cores

    return max(fma_peak_gflops(threads or usable_cores(), seconds=0.3) for _ in range(3))


def run_tables(specs: list[tuple[str, str]], args: Any, mode: str) -> int:
    """Measure every spec in its own child, save each row as it finishes, print the table."""
    from stagegraph.app.host import HostInfo, describe
    from stagegraph.runtime.cores import usable_cores

    peers = list(dict.fromkeys(args.vs or []))
    limits = Limits(timeout_s=args.timeout, memory_bytes=int(args.memory * 2**30))
    save_path = Path(args.save)
    threads = args.threads or usable_cores()
    peak = None
    try:
        peak = limits.run(fma_peak, args.threads, label="fma peak")
    except StagegraphError as exc:
        print(f"FMA peak not measured: {exc}", file=sys.stderr)
    meta: dict[str, Any] = {"mode": mode, "threads": threads, "fma_peak_gflops": peak,
                            "peers": peers, "host": None}  # fmt: skip
    rows: list[VsRow] = []
    for name, spec in specs:
        try:
            result = limits.run(measure_versus, spec, peers, args.threads, args.budget,
                                label=name)  # fmt: skip
        except StagegraphError as exc:
            result = {"verified": False, "message": " ".join(str(exc).split())[:300]}
        meta["host"] = meta["host"] or result.get("host")
        rows.append(row_from(name, spec, result))
        save(save_path, rows, meta)
        print(f"... {name}: {'ok' if rows[-1].verified else rows[-1].error[:100]}",
              file=sys.stderr, flush=True)  # fmt: skip
    host = describe(HostInfo.model_validate(meta["host"])) if meta["host"] else "host: not measured"
    header = [
        host,
        f"{mode}; threads granted to every side: {threads} (thr: what the x86 code chose); "
        f"FMA peak on {threads} threads: {_cell(peak, '{:.1f}')} GFLOP/s",
        "speedup = peer time / x86 time, timed interleaved in one process (above 1: x86 "
        "is faster); (x86 ms) after a peer's time: x86's time in that pair, where the load "
        f"changed it by over {DRIFT:.0%}; results saved to {save_path}",
    ]
    print("\n".join(table_lines(rows, peers, header, peak)))
    return 0


def add_versus_arguments(parser: Any) -> None:
    """``kernelbench.py``'s options for the real-size tables."""
    parser.add_argument(
        "--vs", nargs="*", choices=PEER_NAMES, help="real-size table against these peers"
    )
    parser.add_argument(
        "--scale", type=int, default=1, help="every input of a problem this many times larger"
    )
    parser.add_argument(
        "--models",
        action="store_true",
        help="the dev level-3 models at batch 1, 224x224 (FOLDER: the kernelbench root)",
    )
    parser.add_argument("--only", default="", help="payloads whose name contains this")
    parser.add_argument("--memory", type=float, default=16.0, help="GiB per child")
    parser.add_argument(
        "--save", default="kernelbench_vs.json", help="rows saved here (.json or .csv)"
    )


def refuse(message: str) -> None:
    """Bad arguments: the message on stderr and exit status 2, no traceback."""
    print(f"kernelbench.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def main_specs(args: Any) -> tuple[list[tuple[str, str]], Any, str]:
    """``(specs, args, mode)`` for :func:`run_tables` from ``kernelbench.py``'s arguments:
    the level-3 models (``--models``; the folder is the kernelbench root or its level3) or
    the problem files of the folder's payloads at ``--scale``."""
    from kernelbench_torch_coverage import problem_file
    from real_size import LEVEL3_MODELS, model_specs, scaled_problem_spec

    folder = args.folder.resolve()
    if args.scale < 1:
        refuse(f"--scale {args.scale}: give a whole factor of 1 or more")
    if args.models:
        root = folder if (folder / "src").is_dir() else folder.parent
        specs = model_specs(root, args.only)
        mode = "dev level-3 models at batch 1, 224x224"
        where = f"{root / 'src' / 'level3'} (problem numbers {', '.join(LEVEL3_MODELS)})"
    else:
        specs = []
        for path in sorted(folder.glob("*.mlir")):
            if args.only in path.stem and problem_file(path) is not None:
                specs.append((path.stem, scaled_problem_spec(path, args.scale)))
        sizes = "shipped sizes" if args.scale == 1 else f"every input {args.scale}x larger"
        mode = f"{folder.name} problem files at {sizes}"
        where = f"{folder} (payloads with a problem file in ../src/{folder.name})"
    if not specs:
        named = f" whose name contains {args.only!r}" if args.only else ""
        refuse(f"nothing to measure: no problem files found for {where}{named}")
    return specs, args, mode
