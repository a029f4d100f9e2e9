"""Reproducers: when a stage fails, write what it needs to fail again on its own.

A reproducer directory holds the stage's input IR (``input.mlir``), its spec and config
(``stage.json``), its non-module inputs such as params (``inputs.json``), the schedule or
pass pipeline it applied, a ``README`` and ``repro.sh``. ``stagegraph repro DIR`` rebuilds
exactly that stage, runs it on that input, and fails the same way.
"""

from __future__ import annotations

import importlib
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stagegraph.core.engine import Hook, StageEvent
from stagegraph.core.ports import Module, Schema
from stagegraph.core.stage import Stage, StageFactory, get_factory
from stagegraph.errors import StageFailed, StagegraphError


def default_directory() -> Path:
    return Path(tempfile.gettempdir()) / "stagegraph-repro"


def unique_folder(root: Path, stem: str) -> Path:
    """A new, empty folder ``root/STEM-YYYYmmdd-HHMMSS-XXXX``: the time says when, the random
    suffix (``mkdtemp``: created atomically) keeps two failures in one second, in one
    process or several, from sharing a folder and overwriting each other."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stem}-{stamp}-", dir=root))


class StageSpec(Schema):
    """Enough to rebuild a stage: its factory (by registry name and import path) and config."""

    graph: str
    stage: str
    kind: str
    factory: str
    factory_import: str
    config: dict[str, Any]
    module_port: str | None = None
    module_level: str | None = None
    error: str = ""


class ReproducerHook(Hook):
    """Remembers each stage's inputs before it runs; writes them out if it fails."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory else default_directory()
        self._pending: dict[str, Any] = {}
        self._as_left = False

    def before_stage(self, event: StageEvent) -> None:
        # Bytecode, not text: every stage pays for this snapshot, only a failing one needs
        # the text (printing a large module before each stage cost seconds). A stage that
        # does not change its module needs none: the module itself is its input.
        # Past SNAPSHOT_BYTES (a real-size model: writing its weights before every stage
        # cost more than most stages), the reproducer gets the module as the stage left it.
        size = getattr(event, "module_bytes", None) or 0  # a hand-made event may lack it
        snapshot = event.stage.factory.mutates and size <= SNAPSHOT_BYTES
        self._pending = {
            port: _Snapshot(value) if isinstance(value, Module) and snapshot else value
            for port, value in event.inputs.items()
        }
        self._as_left = event.stage.factory.mutates and not snapshot

    def on_failure(self, event: StageEvent, error: BaseException) -> str | None:
        stage = event.stage
        try:
            target = unique_folder(self.directory, f"{event.graph.name}-{stage.name}")
            note = AS_LEFT_NOTE if self._as_left else ""
            inputs = {
                port: note + value.text() if isinstance(value, _Snapshot | Module) else value
                for port, value in self._pending.items()
            }
            write_reproducer(target, event.graph.name, stage, inputs, str(error))
        except Exception:  # a module that does not print back (an empty blob), a full disk
            return None  # never hide the stage's own error behind a reproducer problem
        return str(target)


class _Snapshot:
    """A module as it was before a stage ran, kept as bytecode until a reproducer needs
    its text."""

    def __init__(self, module: Module) -> None:
        self.bytecode = module.bytecode()

    def text(self) -> str:
        """The module as MLIR assembly (parsed back in a context of its own)."""
        from stagegraph.mlir.bindings import ir, new_context

        context = new_context()
        return str(ir.Module.parse(self.bytecode, context))


#: Payload modules past this many bytes of bytecode are not snapshotted before each stage.
SNAPSHOT_BYTES = 256 * 2**20
#: The first line of a reproducer's input taken after the stage failed, not before it ran.
AS_LEFT_NOTE = (
    "// stagegraph: the module as the failing stage left it (a module this large is not\n"
    "// copied before every stage); rerun with the module of the stage before it to repeat.\n"
)


def _import_path(factory: StageFactory) -> str:
    fn = getattr(factory.fn, "__func__", factory.fn)
    return f"{fn.__module__}:{getattr(fn, '__qualname__', fn.__name__).split('.')[0]}"


def write_reproducer(
    target: Path, graph: str, stage: Stage, inputs: dict[str, Any], error: str
) -> None:
    module_port = next((p for p, v in inputs.items() if isinstance(v, str)), None)
    spec = StageSpec(
        graph=graph,
        stage=stage.name,
        kind=stage.kind,
        factory=stage.factory.name,
        factory_import=_import_path(stage.factory),
        config=stage.config.model_dump(mode="json"),
        module_port=module_port,
        module_level=stage.inputs[module_port].type.level if module_port else None,
        error=error,
    )
    (target / "stage.json").write_text(spec.model_dump_json(indent=2))
    if module_port:
        (target / "input.mlir").write_text(inputs[module_port])
    others = {
        port: {
            "class": f"{type(v).__module__}:{type(v).__qualname__}",
            "value": v.model_dump(mode="json"),
        }
        for port, v in inputs.items()
        if isinstance(v, Schema)
    }
    (target / "inputs.json").write_text(json.dumps(others, indent=2))
    applied = _applied(stage, inputs)
    if applied:
        (target / applied[0]).write_text(applied[1])
    script = f"#!/bin/sh\nexec stagegraph repro {shlex.quote(str(target))}\n"
    (target / "repro.sh").write_text(script)
    (target / "repro.sh").chmod(0o755)
    lines = [
        f"Stage {stage.name!r} ({stage.factory.name}, {stage.kind}) of graph {graph!r} failed:",
        "",
        error,
        "",
        "Re-run exactly this stage on its input:",
        f"    stagegraph repro {target}",
    ]
    pipeline = getattr(stage.config, "pipeline", None)
    if pipeline and module_port:
        lines += [
            "",
            "The same pass pipeline with the wheel's opt tool:",
            f"    {opt_command(pipeline, target / 'input.mlir')}",
        ]
    (target / "README").write_text("\n".join(lines) + "\n")


def opt_command(pipeline: str, path: Path) -> str:
    """The ``torch-mlir-opt``/``mlir-opt`` command line running ``pipeline`` on ``path``."""
    import shutil

    from stagegraph.mlir.pipelines import anchored

    beside = Path(sys.executable).parent / "torch-mlir-opt"  # the wheel's, in this venv
    tool = (
        shutil.which("mlir-opt")
        or shutil.which("torch-mlir-opt")
        or (str(beside) if beside.is_file() else "torch-mlir-opt")
    )
    return f"{tool} --pass-pipeline={shlex.quote(anchored(pipeline))} {shlex.quote(str(path))}"


def _applied(stage: Stage, inputs: dict[str, Any]) -> tuple[str, str] | None:
    """The schedule or pipeline the stage applies, for humans reading the reproducer."""
    config = stage.config
    if getattr(config, "pipeline", None):
        from stagegraph.mlir.pipelines import anchored

        return "pipeline.txt", anchored(config.pipeline) + "\n"
    if getattr(config, "text", None):
        return "schedule.mlir", config.text
    describe = stage.factory.describe
    if describe is not None:
        try:
            return "schedule.mlir", describe(inputs, config)
        except Exception:  # describing is best effort
            return None
    return None


def _load_class(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def replay(directory: str | Path) -> dict[str, Any]:
    """Re-run the stage recorded in ``directory``; raises the same StageFailed if it fails."""
    from stagegraph.core.engine import Engine
    from stagegraph.core.graph import Graph, GraphInput
    from stagegraph.core.ports import Module as ModulePort

    directory = Path(directory)
    try:
        spec = StageSpec.model_validate_json((directory / "stage.json").read_text())
        others = json.loads((directory / "inputs.json").read_text())
    except (OSError, ValueError) as exc:
        raise StagegraphError(f"{directory} is not a stagegraph reproducer: {exc}") from None
    try:
        factory = get_factory(spec.factory)
    except StagegraphError:
        factory = get_factory(spec.factory_import)
    stage = factory(spec.stage, config=spec.config)
    inputs: list[GraphInput] = []
    values: dict[str, Any] = {}
    edges = []
    if spec.module_port:
        inputs.append(GraphInput("payload", ModulePort[spec.module_level or "any"]))
        values["payload"] = (directory / "input.mlir").read_text()
        edges.append(f"payload -> {spec.stage}.{spec.module_port}")
    for port, entry in others.items():
        cls = _load_class(entry["class"])
        inputs.append(GraphInput(f"in_{port}", cls))
        values[f"in_{port}"] = cls.model_validate(entry["value"])
        edges.append(f"in_{port} -> {spec.stage}.{port}")
    graph = Graph(spec.graph, [stage], edges, inputs)
    engine = Engine([ReproducerHook(directory / "replays")], cache=False)
    try:
        result = engine.run(graph, values)
    except StageFailed:
        raise
    return {"stage": spec.stage, "ok": True, "outputs": sorted(p for _, p in result.values)}


class CrashBreadcrumb(Hook):
    """For isolated runs: keep a reproducer of the stage *about to run* on disk.

    If the child dies (signal, timeout, memory), the parent still knows which stage was
    running and has its input; :func:`claim_breadcrumb` turns it into a reproducer.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def before_stage(self, event: StageEvent) -> None:
        inputs = {
            port: value.text() if isinstance(value, Module) else value
            for port, value in event.inputs.items()
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        write_reproducer(self.directory, event.graph.name, event.stage, inputs, "in progress")


def claim_breadcrumb(
    breadcrumb: Path, reason: str, root: str | Path | None, diagnostics: list[str] | None = None
) -> StageFailed | None:
    """A StageFailed naming the stage that was running when an isolated child died."""
    if not (breadcrumb / "stage.json").exists():
        return None
    spec = StageSpec.model_validate_json((breadcrumb / "stage.json").read_text())
    target = unique_folder(Path(root) if root else default_directory(),
                           f"{spec.graph}-{spec.stage}")  # fmt: skip
    breadcrumb.rename(target)  # onto the new empty folder: POSIX rename replaces it
    spec = spec.model_copy(update={"error": reason})
    (target / "stage.json").write_text(spec.model_dump_json(indent=2))
    readme = (target / "README").read_text().replace("\nin progress\n", f"\n{reason}\n")
    (target / "README").write_text(readme)
    return StageFailed(spec.graph, spec.stage, reason, diagnostics, reproducer=str(target))
