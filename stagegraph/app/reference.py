"""Where a run's reference result comes from, and what a verdict against it is worth.

A workload brings its own reference (the ``.npz`` beside a payload, numpy for Python
workloads, eager PyTorch for PyTorch workloads); a payload without one is checked against
another graph's compiled code, the naive graph by default (differential testing).
``--reference GRAPH`` picks that graph (and replaces a stored reference), ``--reference
none`` runs without verifying. Reports name the source (``npz``, ``pytorch``, ``numpy``,
``graph:NAME``, ``none``) because a verdict means little without it: the naive graph checked
against itself, or bf16 code against bf16 naive loops, proves far less than a float64
reference, and saying VERIFIED there would overstate it.
"""

from __future__ import annotations

from typing import Any

from stagegraph.errors import ReferenceFailedError, StagegraphError, VerificationError

DEFAULT_GRAPH = "naive"
NONE = "none"
REDUCED_PRECISION = ("f16", "bf16")


class GraphReference:
    """The reference of last resort: what graph ``graph`` computes for the workload.

    A failure to compile or run it is the reference's failure, not the graph under test's:
    it is raised as :class:`ReferenceFailedError` naming the reference graph.
    """

    def __init__(self, graph: str = DEFAULT_GRAPH) -> None:
        self.graph = graph
        self.__name__ = f"graph:{graph}"

    def __call__(self, workload: Any) -> list[Any]:
        from stagegraph.core.catalog import load_graph
        from stagegraph.core.engine import Engine

        try:
            result = Engine().run(load_graph(self.graph), workload)
            return result.binary.call(workload.entry, workload.inputs())
        except StagegraphError as exc:
            raise ReferenceFailedError(
                f"the reference failed, not the graph under test: graph {self.graph!r} "
                f"computes the reference for {workload.spec!r} and could not: {exc}\n"
                "Choose another reference (--reference GRAPH), run unverified (--reference "
                "none), or store the expected outputs in an .npz beside the payload"
            ) from exc


def attach_reference(workload: Any, choice: str | None) -> None:
    """Give ``workload`` the reference ``choice`` asks for: None keeps its own and falls
    back to the naive graph; a graph name replaces it; ``none`` leaves it unverified
    (:func:`verifies` is then False)."""
    if choice == NONE:
        workload.reference_runner = None
        workload.prefer_runner = False
        return
    if choice is not None:
        from stagegraph.core.catalog import load_graph
        from stagegraph.errors import UnknownGraphError

        try:
            load_graph(choice)  # an unknown name is refused now, not after compiling
        except UnknownGraphError as exc:
            raise UnknownGraphError(f"--reference: {exc}") from None
    workload.reference_runner = GraphReference(choice or DEFAULT_GRAPH)
    workload.prefer_runner = choice is not None


def verifies(choice: str | None) -> bool:
    return choice != NONE


def check_verifiable(workload: Any) -> None:
    """Refuse to "verify" a payload that returns nothing: every check would pass vacuously.

    Raises:
        VerificationError: the entry has no results (``--reference none`` runs it anyway).
    """
    if not workload.output_specs():
        raise VerificationError(
            f"workload {workload.spec!r}: @{workload.entry} returns no results, so there is "
            "nothing to verify; return the outputs, or run it unverified with --reference none"
        )


def trivial_reference(workload: Any, graph_name: str) -> str | None:
    """Why a verdict against this reference would prove nothing (None: it proves something).

    The graph under test checked against its own code compares a result with itself.
    """
    if workload.reference_source != f"graph:{graph_name}":
        return None
    why = (
        f"--reference {graph_name}"
        if workload.prefer_runner
        else f"no stored reference for {workload.spec!r}"
    )
    return (
        f"not verified: the reference is graph {graph_name!r} itself ({why}), so its outputs "
        "would be compared with themselves; pass --reference GRAPH or store the expected "
        "outputs in an .npz beside the payload"
    )


def caveat(workload: Any) -> str:
    """What the reference cannot vouch for: reduced-precision results checked against
    another graph's code in the same precision test the lowering, not the arithmetic."""
    if not workload.reference_source.startswith("graph:"):
        return ""
    reduced = sorted({s.dtype for s in workload.output_specs() if s.dtype in REDUCED_PRECISION})
    if not reduced:
        return ""
    return (
        f"; compared with {workload.reference_source}'s code at the payload's own precision "
        f"({', '.join(reduced)}): both round alike, so this checks the lowering, not the "
        "accuracy of the arithmetic (store a higher-precision reference in an .npz for that)"
    )
