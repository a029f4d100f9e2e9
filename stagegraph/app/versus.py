"""The two sides of ``bench --vs``: the session's graph against another graph, numpy, IREE or
PyTorch (:mod:`.torch_peer`), each compiled (or prepared) and verified before
:func:`~stagegraph.app.bench.compare` times them interleaved."""

from __future__ import annotations

from typing import Any

from stagegraph.app.bench import Measurement, NumpyMeasurement, prepare


def versus_measurements(
    session: Any, versus: str, splice_at: str | None
) -> tuple[Measurement, Measurement | NumpyMeasurement]:
    """The two sides of ``bench --vs``: the session's graph, and ``versus`` (a graph name,
    ``numpy``, ``iree``, ``torch`` or ``torch-compile``) with the same ``--param``/``--threads``
    and (except ``naive``) target; both compiled and verified, to be timed with
    :func:`compare`."""
    from stagegraph.app.graph_options import params_stages, with_params, with_target
    from stagegraph.core.catalog import load_graph

    threads = session.request.threads
    first = prepare(session.engine, session.graph, session.workload, splice_at)
    if versus == "numpy":
        return first, NumpyMeasurement(session.workload, threads)
    if versus in ("torch", "torch-compile"):
        from stagegraph.app.torch_peer import TorchMeasurement

        return first, TorchMeasurement(session.workload, threads, versus)
    if versus == "iree":
        from stagegraph.app.iree import IreeMeasurement

        return first, IreeMeasurement(session.workload, threads, session.request.target)
    other = load_graph(versus)
    if params_stages(other) or session.request.params:
        other = with_params(other, session.request.params, threads)
    # else: a graph without a cost model (naive) runs on one thread whatever --threads says
    if session.request.target and versus != "naive":
        other = with_target(other, session.request.target)
    return first, prepare(session.engine, other, session.workload, splice_at)
