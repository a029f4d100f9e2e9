"""How long and how precisely a benchmark measures: part of every session request, so it
lives apart from the benchmarking code (which a session that only compiles need not load)."""

from __future__ import annotations

from stagegraph.core.ports import Schema


class BenchOptions(Schema):
    """How long and how precisely to measure."""

    warmup: int = 3
    repeat: int = 10  # minimum number of samples
    min_time_s: float = 0.0
    budget_s: float = 10.0
    rel_halfwidth: float = 0.02
    # Pause before each switch between multi-threaded variants: OpenBLAS and OpenMP workers
    # spin for ~0.1-0.2 s after a call and would steal the cores the other variant needs.
    settle_s: float = 0.3
