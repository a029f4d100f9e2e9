"""``stagegraph compile`` and ``stagegraph exec``: an artifact folder written from a session,
and run again from the folder alone.

Compiling swaps the graph's emit stage for ``artifact`` (library, object file, header), then
writes ``manifest.json`` from what the stage exported and what the session knows (graph,
workload, params, threads, versions). Executing reads the folder with
:class:`~stagegraph.artifact.runner.CpuArtifact`; nothing on that path imports MLIR.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from stagegraph.core.ports import Schema
from stagegraph.errors import ArtifactError

if TYPE_CHECKING:
    from stagegraph.app.session import SessionRequest
    from stagegraph.core.graph import Graph


class ArtifactReport(Schema):
    """What ``stagegraph compile`` wrote (its ``--json`` output)."""

    directory: str
    files: list[str]
    entry_symbol: str
    ciface_symbol: str
    graph: str
    workload: str
    target: str
    threads: int
    compile_seconds: float
    warnings: list[str] = Field(default_factory=list)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def with_artifact_emit(graph: Graph, directory: Path, symbol: str) -> Graph:
    """The graph with its emit stage writing an artifact folder."""
    from stagegraph.stages.common.emit import artifact

    name = graph.one_stage_of_kind("emit").name
    return graph.replace(name, artifact(name, directory=str(directory), symbol=symbol))


def prepare_directory(directory: str | Path) -> Path:
    """The output folder, created if its parent exists.

    Raises:
        ArtifactError: the parent is missing, or the path is a file.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ArtifactError(f"cannot write an artifact to {path}: it is a file")
    if not path.parent.is_dir():
        raise ArtifactError(f"cannot write {path}: directory {path.parent} does not exist")
    path.mkdir(exist_ok=True)
    return path


def build_artifact(
    request: SessionRequest,
    directory: str | Path,
    *,
    entry_symbol: str | None = None,
    graph: Graph | None = None,
) -> ArtifactReport:
    """Compile the request's workload through its graph into the folder ``directory``.

    ``entry_symbol``: the exported C name (default: ``stagegraph_`` + the workload's name,
    see :func:`~stagegraph.artifact.cabi.default_symbol`); ``graph``: a Graph object to use
    instead of loading ``request.graph`` by name.

    Raises:
        ArtifactError, ConfigError, ToolchainError: what the session and the export refuse.
    """
    from stagegraph.app.run import check_single_process, compile_recording_warnings
    from stagegraph.app.session import Session, open_workload
    from stagegraph.artifact.cabi import default_symbol
    from stagegraph.artifact.manifest import write_manifest
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.plugins import load_plugins
    from stagegraph.stages.common.export import check_symbol

    folder = prepare_directory(directory)
    load_plugins(request.plugins)
    workload = open_workload(request.workload)
    check_single_process(workload)
    symbol = check_symbol(entry_symbol or default_symbol(workload.spec))
    base = graph if graph is not None else load_graph(request.graph)
    request = request.model_copy(update={"emit": "jit", "output": None})
    with Session(request, graph=with_artifact_emit(base, folder, symbol)) as session:
        result, warned = compile_recording_warnings(session)
    exported = result.binary.exported
    manifest = cpu_manifest(exported, session, result.params)
    write_manifest(folder, manifest)
    return ArtifactReport(
        directory=str(folder),
        files=sorted(p.name for p in folder.iterdir()),
        entry_symbol=exported.symbol,
        ciface_symbol=exported.ciface,
        graph=session.graph.name,
        workload=session.workload.spec,
        target=exported.target.name,
        threads=manifest.threads,
        compile_seconds=result.trace.compile_seconds(),
        warnings=warned,
    )


def cpu_manifest(exported: Any, session: Any, params: Any) -> Any:
    """The manifest of what :func:`~stagegraph.stages.common.export.export_module` wrote."""
    from stagegraph.artifact.manifest import CpuEntry, CpuManifest, Producer
    from stagegraph.stages.target import effective_threads

    parallel = any(r.purpose == "openmp" for r in exported.runtime)
    chosen = getattr(params, "payload_threads", None)  # the x86 params: the widest loop's
    threads = chosen() if callable(chosen) else effective_threads(session.request.threads)
    files = exported.files
    return CpuManifest(
        name=exported.symbol,
        producer=Producer(
            stagegraph=_version("stagegraph"),
            mlir=f"torch-mlir {_version('torch-mlir')}",
            graph=session.graph.name,
            workload=session.workload.spec,
            params=params.model_dump(mode="json") if params is not None else None,
        ),
        arguments=exported.arguments,
        results=exported.results,
        library=files["library"].name,
        object=files["object"].name,
        header=files["header"].name,
        entry=CpuEntry(symbol=exported.symbol, ciface_symbol=exported.ciface),
        target=exported.target,
        threads=threads if parallel else 1,
        runtime=exported.runtime,
        reduction_length=max(1, session.workload.reduction_length),
    )
