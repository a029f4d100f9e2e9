"""An analytical (roofline + cache traffic) estimate of one matmul's run time under params.

No measurement: peak flops come from the target's vector width, cores and frequency; bytes
moved per cache level come from the tile sizes (how often A and B blocks are re-read, and
from where, given what fits). Good enough to rank candidates, not to predict absolute time.
"""

from __future__ import annotations

import math
from collections import defaultdict

from stagegraph.stages.target import Target
from stagegraph.stages.x86.matmul.params import MatmulParams

_FMA_LATENCY = 4
# Sustained bytes per cycle per core from each level (typical recent x86 cores).
_BYTES_PER_CYCLE = {"l1": 128.0, "l2": 48.0, "l3": 16.0, "mem": 4.0}


def _level(nbytes: float, target: Target) -> str:
    """The closest cache level a working set of ``nbytes`` fits in."""
    if nbytes <= target.l1d_bytes:
        return "l1"
    if nbytes <= target.l2_bytes:
        return "l2"
    if nbytes <= target.l3_bytes:
        return "l3"
    return "mem"


def peak_flops(target: Target, threads: int = 1, lanes: int | None = None) -> float:
    """FMA peak (flop/s) of ``threads`` cores at ``lanes`` f32 lanes (default: the target's
    vector width): the lanes the FMA units complete per cycle
    (:meth:`~stagegraph.stages.target.Target.fma_lanes_per_cycle`), two flops each."""
    ghz = target.frequency_ghz or 2.5
    per_cycle = target.fma_lanes_per_cycle(lanes)
    return ghz * 1e9 * per_cycle * 2 * max(1, min(threads, target.cores))


def estimate_seconds(p: MatmulParams, m: int, n: int, k: int, elem: int, target: Target) -> float:
    """Estimated seconds: max(compute, traffic) over the padded problem, per thread."""
    lanes = max(1, p.vector_width)
    threads = max(1, min(p.threads, target.cores))
    mp, np_ = math.ceil(m / p.reg_m) * p.reg_m, math.ceil(n / p.reg_n) * p.reg_n
    flops = 2.0 * mp * np_ * k
    accumulators = p.accumulator_registers
    # Independent FMA chains that keep the units busy: vector FMAs per cycle x latency.
    chains = target.fma_lanes_per_cycle(lanes) / lanes * _FMA_LATENCY
    efficiency = min(1.0, accumulators / chains)
    # Each k step of the micro-kernel loads reg_m broadcasts and reg_n/lanes vectors.
    loads = p.reg_m + p.reg_n / lanes
    efficiency *= min(1.0, accumulators / max(loads, 1.0))
    blocks = math.ceil(m / p.tile_m) * math.ceil(n / p.tile_n)
    balance = blocks / (math.ceil(blocks / threads) * threads)
    peak = peak_flops(target, threads, lanes) * balance
    compute = flops / (peak * max(efficiency, 1e-3))

    traffic = traffic_by_level(p, m, n, k, elem, target)
    ghz = target.frequency_ghz or 2.5
    memory = sum(b / (_BYTES_PER_CYCLE[lvl] * ghz * 1e9 * threads) for lvl, b in traffic.items())
    a_bytes, b_bytes = _operand_bytes(p, m, n, k, elem)
    packing = (a_bytes + b_bytes) * 2 / (_BYTES_PER_CYCLE["l2"] * ghz * 1e9 * threads)
    return max(compute, memory) + (packing if p.pack else 0.0)


def _operand_bytes(p: MatmulParams, m: int, n: int, k: int, elem: int) -> tuple[float, float]:
    """Bytes of A and of B read over the whole matmul: A is re-read once per column block,
    B once per row block."""
    a_bytes = m * k * elem * math.ceil(n / p.tile_n)
    b_bytes = k * n * elem * math.ceil(m / p.tile_m)
    return float(a_bytes), float(b_bytes)


def traffic_by_level(
    p: MatmulParams, m: int, n: int, k: int, elem: int, target: Target
) -> dict[str, float]:
    """Bytes each cache level serves, summed over every operand that streams from it.

    Every contribution is added, never assigned: A's block and B's panel often live at the
    same level, and the micro-kernel's loads always come from L1 on top of whatever else does,
    so keying one operand per level would silently drop the others' traffic from the ranking.
    """
    kc = p.tile_k or k
    a_bytes, b_bytes = _operand_bytes(p, m, n, k, elem)
    mp, np_ = math.ceil(m / p.reg_m) * p.reg_m, math.ceil(n / p.reg_n) * p.reg_n
    flops = 2.0 * mp * np_ * k
    inner = flops / (2 * p.reg_m * p.reg_n) * (p.reg_m + p.reg_n) * elem  # micro-kernel loads
    traffic: dict[str, float] = defaultdict(float)
    traffic[_level(p.tile_m * kc * elem, target)] += a_bytes  # the A block
    traffic[_level(kc * p.reg_n * elem, target)] += b_bytes  # the B panel
    traffic["l1"] += inner
    if not p.pack:  # strided panels: every micro-kernel load misses the packed layout
        traffic["l2"] += inner / 2
    if p.tile_k:  # C is re-read and re-written for each k block
        traffic[_level(p.tile_m * p.tile_n * elem, target)] += (
            2 * m * n * elem * math.ceil(k / p.tile_k)
        )
    return dict(traffic)
