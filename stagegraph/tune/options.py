"""The ``stagegraph tune`` command line as data (:class:`TuneOptions`), apart from the tuner
so that declaring the options (CLI, API) loads none of it. Each field's
:class:`~stagegraph.core.options.Option` makes it a ``tune`` option and an ``sg.tune``
keyword; the default and help written here are the only ones."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from stagegraph.app.session import SessionRequest, parse_assignments
from stagegraph.core.options import Option
from stagegraph.core.ports import Schema
from stagegraph.stages.common.measure import DEFAULT_SAMPLES

GIB = 2**30


class TuneOptions(Schema):
    """The session to tune (graph, workload, target, the baseline's cost model, inspection)
    and how to search and measure."""

    session: SessionRequest
    budget: Annotated[int, Option("--budget")] = Field(
        12, ge=1, description="Candidates to consider (reused ones from --db count)."
    )
    jobs: Annotated[int, Option("--jobs")] = Field(
        1, ge=1, description="Isolated local workers measuring at once (without --cluster)."
    )
    cluster: Annotated[str | None, Option("--cluster", metavar="ADDRESS")] = Field(
        None, description="tcp://HOST:PORT (a Dask scheduler) or local:N."
    )
    db: Annotated[str, Option("--db", path="file")] = Field(
        "stagegraph-tune.db", description="Tuning database (SQLite; resumable)."
    )
    strategy: Annotated[Literal["random", "model", "evolve"], Option("--strategy")] = Field(
        "model", description="How candidates are proposed."
    )
    seed: Annotated[int, Option("--seed")] = Field(0, description="Seed of the search.")
    fixes: Annotated[
        dict[str, Any],
        Option("--fix", keyword="fix", metavar="FIELD=VALUE", parse=parse_assignments),
    ] = Field(default_factory=dict, description="Pin a tunable field in the space (repeatable).")
    per_op: Annotated[bool, Option("--per-op")] = Field(
        False,
        description="Give every distinct non-matmul op its own params (default: one set "
        "shared by all).",
    )
    measure: Annotated[str | None, Option("--measure", metavar="STAGE")] = Field(
        None,
        description="A registered stage of kind measure that times candidates (default: the "
        "interleaved timer); bring your own with --plugin.",
    )
    batch_size: Annotated[int | None, Option("--batch-size")] = Field(
        None, ge=1, description="Candidates per isolated child."
    )
    compile_timeout_s: Annotated[float, Option("--compile-timeout")] = Field(
        60.0, gt=0, description="Limit on compiling one candidate (s)."
    )
    run_timeout_s: Annotated[float, Option("--run-timeout")] = Field(
        60.0, gt=0, description="Limit on verifying and timing one candidate (s)."
    )
    memory_bytes: Annotated[int | None, Option("--memory", scale=GIB)] = Field(
        4 * GIB, gt=0, description="Address-space limit per worker child (GiB)."
    )
    samples: Annotated[int, Option("--samples")] = Field(
        DEFAULT_SAMPLES, ge=4, description="Timed samples of each candidate and its baseline."
    )
    faults: dict[str, str] = Field(default_factory=dict)
