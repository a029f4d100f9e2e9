"""How long and how precisely a benchmark measures: part of every session request, so it
lives apart from the benchmarking code (which a session that only compiles need not load).
Each field's :class:`~stagegraph.core.options.Option` makes it a ``bench`` option and an
``sg.bench`` keyword; the default and help written here are the only ones."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from stagegraph.core.options import Option
from stagegraph.core.ports import Schema


class BenchOptions(Schema):
    """How long and how precisely to measure."""

    warmup: Annotated[int, Option("--warmup")] = Field(
        3, ge=0, description="Untimed calls before sampling."
    )
    repeat: Annotated[int, Option("--repeat")] = Field(
        10, ge=2, description="Minimum number of timed samples."
    )
    min_time_s: Annotated[float, Option("--min-time")] = Field(
        0.0, ge=0, description="Keep sampling at least this long (seconds)."
    )
    budget_s: Annotated[float, Option("--budget")] = Field(
        10.0,
        ge=0,
        description="Stop sampling after this long (seconds) even if the interval is wider "
        "than ±2%.",
    )
    rel_halfwidth: float = 0.02
    # Pause before each switch between multi-threaded variants: OpenBLAS and OpenMP workers
    # spin for ~0.1-0.2 s after a call and would steal the cores the other variant needs.
    settle_s: float = 0.3
