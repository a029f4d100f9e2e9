"""A schedule stage that applies a transform-dialect module from a file or inline text."""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from stagegraph.ports import Config, Module, TensorModule
from stagegraph.stage import stage


class TransformConfig(Config):
    """Exactly one of ``file`` (a .mlir path) or ``text`` (the transform module)."""

    file: str | None = None
    text: str | None = None
    entry: str = "__transform_main"

    @model_validator(mode="after")
    def _one_source(self) -> TransformConfig:
        if (self.file is None) == (self.text is None):
            raise ValueError("give exactly one of 'file' or 'text'")
        return self


def apply_transform_module(payload: Module, schedule_text: str, entry: str, source: str) -> None:
    """Parse a transform module into the payload's context and apply its named sequence."""
    from stagegraph.irutil import parse_module
    from stagegraph.mlir import interpreter

    schedule = parse_module(schedule_text, payload.ir.context, source=source)
    interpreter.apply_named_sequence(
        payload.ir.operation, _named_sequence(schedule, entry), schedule
    )


def _named_sequence(schedule, entry: str):
    for op in schedule.body.operations:
        name = op.operation.name
        if name == "transform.named_sequence" and op.attributes["sym_name"].value == entry:
            return op
    raise ValueError(f"transform module has no named sequence @{entry}")


@stage("schedule", name="transform")
def transform(module: TensorModule, config: TransformConfig) -> TensorModule:
    """Apply a hand-written transform schedule with the transform interpreter."""
    if config.file is not None:
        path = Path(config.file)
        text, source = path.read_text(), str(path)
    else:
        text, source = config.text or "", "<transform text>"
    apply_transform_module(module, text, config.entry, source)
    return module
