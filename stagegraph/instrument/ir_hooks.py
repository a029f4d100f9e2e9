"""Instrumentation hooks: IR dumps, IR printing and per-stage verification.

All of them plug into the engine's one seam (:class:`~stagegraph.core.engine.Hook`); the CLI's
``--dump-ir``, ``--print-ir-after`` and ``--verify-each`` only choose which hooks to pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stagegraph.core.engine import Hook, StageEvent
from stagegraph.core.graph import Graph
from stagegraph.core.ports import Module
from stagegraph.errors import StagegraphError


def output_module(event: StageEvent) -> Module | None:
    return next((v for v in event.outputs.values() if isinstance(v, Module)), None)


class DumpIR(Hook):
    """Write the IR after every stage that changed it, numbered in execution order.

    ``index.json`` lists each file with the stage, its kind, level and op-count delta.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise StagegraphError(
                f"cannot write IR dumps to {self.directory}: {exc.strerror or exc}"
            ) from None
        self.count = 0
        self.index: list[dict] = []
        self._before: str | None = None

    def before_stage(self, event: StageEvent) -> None:
        # A hash, not the text: a model's text (its weights in hex) is not held per stage.
        module = next((v for v in event.inputs.values() if isinstance(v, Module)), None)
        self._before = module.content_hash() if module is not None else None

    def after_stage(self, event: StageEvent) -> None:
        module = output_module(event)
        if module is None or module.content_hash() == self._before:
            return
        self.count += 1
        name = f"{self.count:02d}-{event.stage.name}.mlir"
        with open(self.directory / name, "w") as file:  # printed into the file as it goes
            module.ir.operation.print(file=file)
        record = event.record
        self.index.append(
            {
                "file": name,
                "stage": event.stage.name,
                "kind": event.stage.kind,
                "level": module.level,
                "ops": record.ops_out if record else None,
                "ops_delta": (record.ops_out - record.ops_in)
                if record and record.ops_in is not None and record.ops_out is not None
                else None,
            }
        )
        (self.directory / "index.json").write_text(json.dumps(self.index, indent=1))


class PrintIR(Hook):
    """Print the IR after the stages named (by name or tag; ``all`` for every stage)."""

    def __init__(self, selectors: list[str], write: Callable[[str], None]) -> None:
        self.selectors = set(selectors)
        self.write = write

    def after_stage(self, event: StageEvent) -> None:
        stage = event.stage
        wanted = "all" in self.selectors or stage.name in self.selectors
        if not (wanted or self.selectors & stage.tags):
            return
        module = output_module(event)
        if module is not None:
            self.write(f"// ----- IR after {stage.name} ({stage.kind}, {module.level}) -----\n")
            self.write(module.text())


class VerifyEach(Hook):
    """Run the MLIR verifier on every module a stage produces, and have the stage's pass
    pipelines verify after every pass (see ``diagnostics.VERIFY_PASSES``); fail at the culprit."""

    def __init__(self) -> None:
        self._token: Any = None

    def before_stage(self, event: StageEvent) -> None:
        from stagegraph.mlir.diagnostics import VERIFY_PASSES

        self._token = VERIFY_PASSES.set(True)

    def _restore(self) -> None:
        if self._token is not None:
            from stagegraph.mlir.diagnostics import VERIFY_PASSES

            VERIFY_PASSES.reset(self._token)
            self._token = None

    def on_failure(self, event: StageEvent, error: BaseException) -> str | None:
        self._restore()
        return None

    def after_stage(self, event: StageEvent) -> None:
        self._restore()
        module = output_module(event)
        if module is not None:
            from stagegraph.errors import StageFailed
            from stagegraph.mlir.diagnostics import error_diagnostics

            try:
                module.ir.operation.verify()
            except Exception as exc:
                raise StageFailed(
                    event.graph.name,
                    event.stage.name,
                    "output does not verify",
                    error_diagnostics(exc) or [str(exc)],
                ) from None


def check_selectors(graph: Graph, selectors: list[str]) -> None:
    """Reject --print-ir-after names that are neither a stage, a tag nor ``all``."""
    from stagegraph.errors import UnknownStageError, unknown_name_message

    known = set(graph.stages) | set(graph.tags) | {"all"}
    for name in selectors:
        if name not in known:
            raise UnknownStageError(
                f"--print-ir-after: graph {graph.name!r}: "
                + unknown_name_message("stage or tag", name, known)
            )
