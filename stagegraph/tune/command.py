"""``tune`` as one function, called identically by the command line and the Python API:
its options (declared once, on :class:`~stagegraph.tune.options.TuneOptions` and the
session request), its refusals, and the choice between explaining the space and tuning."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stagegraph.app.session import SessionRequest
from stagegraph.core.options import OptionSpec, model_values, option_specs, select
from stagegraph.errors import ConfigError
from stagegraph.tune.options import TuneOptions

#: The options of ``stagegraph tune`` / ``sg.tune``, in help order.
TUNE = (
    "budget", "jobs", "cluster", "db", "strategy", "seed", "threads", "cost_model", "fix",
    "per_op", "measure", "batch_size", "samples", "compile_timeout", "run_timeout", "memory",
    "dump_ir", "print_ir_after", "verify_each", "repro_dir", "target", "cache", "trace",
)  # fmt: skip
#: Test-only: ``KIND@HASH,...`` (KIND segfault|hang|oom|wrong; HASH a params-hash prefix or
#: ``*``) makes those candidates fail that way in the worker.
FAULT_ENV = "STAGEGRAPH_TUNE_FAULT"


def tune_options() -> dict[str, OptionSpec]:
    """``tune``'s options by keyword: fields of TuneOptions and of its session request (a
    keyword both declare, such as ``db`` or ``compile_timeout``, is the tuner's)."""
    return select(option_specs(TuneOptions), TUNE)


def build(graph: str, workload: str, values: Mapping[str, Any]) -> TuneOptions:
    """The :class:`TuneOptions` of ``values`` (keywords of :func:`tune_options`).

    Raises:
        ConfigError: ``print_ir_after`` without ``dump_ir`` (each candidate's IR is written).
    """
    if values.get("print_ir_after") and not values.get("dump_ir"):
        raise ConfigError("tune --print-ir-after writes each candidate's IR to "
                          "DIR/<params hash>/printed.mlir: give --dump-ir DIR")  # fmt: skip
    fields = model_values(tune_options(), values)
    request = SessionRequest(graph=graph, workload=workload, **fields.pop("session", {}))
    return TuneOptions(session=request, faults=faults(), **fields)


def faults() -> dict[str, str]:
    """The injected faults of ``$STAGEGRAPH_TUNE_FAULT`` by params-hash prefix."""
    found = {}
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, _, key = item.partition("@")
        found[key or "*"] = kind
    return found


def tune(
    graph: str, workload: str, values: Mapping[str, Any], *, explain: bool = False,
    progress: bool = False,
) -> Any:  # fmt: skip
    """``stagegraph tune`` / ``sg.tune``: the search space as a dict (``explain``), or the
    :class:`~stagegraph.tune.runner.TuneReport` of a search."""
    from stagegraph.app.commands import merged_trace
    from stagegraph.tune.runner import explain as explain_space
    from stagegraph.tune.runner import tune as run_tune

    options = build(graph, workload, values)
    with merged_trace(values):
        if explain:
            return explain_space(options)
        return run_tune(options, progress=progress)
