"""Instrumentation hooks: IR dumps (more land here: printing, verification, reproducers)."""

from __future__ import annotations

import json
from pathlib import Path

from stagegraph.engine import Hook, StageEvent
from stagegraph.errors import StagegraphError
from stagegraph.ports import Module


class DumpIR(Hook):
    """Write the IR after every stage that outputs a module, numbered in execution order.

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

    def after_stage(self, event: StageEvent) -> None:
        module = next((v for v in event.outputs.values() if isinstance(v, Module)), None)
        if module is None:
            return
        self.count += 1
        name = f"{self.count:02d}-{event.stage.name}.mlir"
        (self.directory / name).write_text(module.text())
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
