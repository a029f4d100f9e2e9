"""The two sides of ``bench --vs``: the session's graph against another graph or a peer
(numpy, IREE, and whatever registers in :data:`PEERS`), each compiled (or prepared) and
verified before :func:`~stagegraph.app.bench.compare` times them interleaved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagegraph.app.bench import Measurement, NumpyMeasurement, prepare
from stagegraph.core.registry import Registry, import_entry


@dataclass(frozen=True)
class Peer:
    """Another implementation ``bench --vs NAME`` measures against.

    Args:
        measurement: ``"module:attr"`` of ``(session) -> measurement`` (the interface of
            :class:`~stagegraph.app.bench.NumpyMeasurement`: ``measure``, ``report``,
            ``verdict``), built with the session's workload, threads and target.
        check: ``"module:attr"`` of ``() -> None`` run before anything compiles (a missing
            extra fails fast; a misleading environment warns).
        about: one line for ``stagegraph list peers``.
    """

    measurement: str
    check: str | None = None
    about: str = ""


#: ``--vs`` names that are not graphs.
PEERS: Registry[Peer] = Registry("peer")


def numpy_measurement(session: Any) -> NumpyMeasurement:
    """numpy (OpenBLAS) on the session's thread count."""
    return NumpyMeasurement(session.workload, session.request.threads)


def warn_openblas_overrides() -> None:
    """Warn when OpenBLAS runs forced kernels: ``--vs numpy`` then undersells numpy."""
    import warnings

    from stagegraph.app.host import openblas_overrides
    from stagegraph.errors import StagegraphWarning

    found = openblas_overrides()
    if found:
        names = ", ".join(f"{k}={v}" for k, v in found.items())
        warnings.warn(
            f"{names} set: OpenBLAS runs those kernels instead of the ones for this CPU, so "
            "the numpy numbers are not representative (unset it to compare fairly)",
            StagegraphWarning,
            stacklevel=2,
        )


def iree_measurement(session: Any) -> Any:
    """The payload compiled by IREE for llvm-cpu, on the session's threads and target."""
    from stagegraph.app.iree import IreeMeasurement

    return IreeMeasurement(session.workload, session.request.threads, session.request.target)


def check_iree() -> None:
    from stagegraph.app.iree import import_iree

    import_iree()


PEERS.register(
    "numpy",
    Peer(f"{__name__}:numpy_measurement", f"{__name__}:warn_openblas_overrides", "numpy (BLAS)"),
    origin=__name__,
)
PEERS.register(
    "iree",
    Peer(
        f"{__name__}:iree_measurement",
        f"{__name__}:check_iree",
        "IREE llvm-cpu (pip install 'stagegraph[peers]')",
    ),
    origin=__name__,
)
PEERS.register(
    "torch",
    Peer("stagegraph.app.torch_peer:eager_measurement", "stagegraph.app.torch_peer:check_torch",
         "PyTorch eager (a PyTorch workload; pip install 'stagegraph[torch]')"),
    origin=__name__,
)  # fmt: skip
PEERS.register(
    "torch-compile",
    Peer("stagegraph.app.torch_peer:inductor_measurement",
         "stagegraph.app.torch_peer:check_torch",
         "torch.compile, inductor (a PyTorch workload; pip install 'stagegraph[torch]')"),
    origin=__name__,
)  # fmt: skip


def check_versus(versus: str) -> None:
    """Before anything compiles: an unknown name fails (with a "did you mean" over graphs
    and peers), and a peer's check runs (a missing extra fails, a misleading environment
    warns).

    Raises:
        UnknownGraphError: ``versus`` is neither a peer, a graph name nor a graph file.
        PeerUnavailableError: the peer's optional packages are missing.
    """
    from pathlib import Path

    from stagegraph.core.catalog import GRAPH_SUFFIXES, GRAPHS
    from stagegraph.errors import UnknownGraphError, unknown_name_message

    if versus in PEERS:
        peer = PEERS.get(versus)
        if peer.check:
            import_entry(peer.check)()
    elif versus not in GRAPHS and Path(versus).suffix not in (".py", *GRAPH_SUFFIXES):
        known = [*GRAPHS.names(), *PEERS.names()]
        raise UnknownGraphError(unknown_name_message("--vs graph or peer", versus, known))


def versus_measurements(
    session: Any, versus: str, splice_at: str | None
) -> tuple[Measurement, Any]:
    """The two sides of ``bench --vs``: the session's graph, and ``versus`` (a peer name or
    a graph name) with the same ``--param``/``--threads`` and (except ``naive``) target;
    both compiled and verified, to be timed with :func:`compare`."""
    from stagegraph.app.graph_options import with_params, with_target
    from stagegraph.core.catalog import load_graph

    threads = session.request.threads
    first = prepare(session.engine, session.graph, session.workload, splice_at)
    if versus in PEERS:
        return first, import_entry(PEERS.get(versus).measurement)(session)
    other = load_graph(versus)
    if other.stages_of_kind("params") or session.request.params:
        other = with_params(other, session.request.params, threads)
    # else: a graph without a cost model (naive) runs on one thread whatever --threads says
    if session.request.target and versus != "naive":
        other = with_target(other, session.request.target)
    return first, prepare(session.engine, other, session.workload, splice_at)
