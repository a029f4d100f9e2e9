"""A schedule stage that applies a transform-dialect module from a file or inline text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import model_validator

from stagegraph.core.ports import GRAPH_PATH, Config, Module, TensorModule
from stagegraph.core.stage import stage


class TransformConfig(Config):
    """Exactly one of ``file`` (a .mlir path) or ``text`` (the transform module)."""

    file: Annotated[str | None, GRAPH_PATH] = None  # relative to a graph file's folder
    text: str | None = None
    entry: str = "__transform_main"

    @model_validator(mode="after")
    def _one_source(self) -> TransformConfig:
        if (self.file is None) == (self.text is None):
            raise ValueError("give exactly one of 'file' or 'text'")
        return self

    def static_problems(self) -> list[str]:
        """The schedule file is missing, or the schedule does not parse or lacks its entry."""
        from stagegraph.mlir.pipelines import transform_problem

        if self.file is not None:
            path = Path(self.file)
            if not path.is_file():
                return []  # reported as a missing file (a GRAPH_PATH field)
            text, source = path.read_text(), str(path)
        else:
            text, source = self.text or "", "<transform text>"
        problem = transform_problem(text, source, self.entry)
        return [problem] if problem else []


ENTRY = "__transform_main"


def new_schedule() -> tuple[Any, Any]:
    """An empty transform module and its ``@__transform_main`` sequence on the payload root.

    Build inside the payload's context; end the sequence's body with ``transform.YieldOp``.
    """
    from stagegraph.mlir.bindings import ir

    module = ir.Module.create()
    module.operation.attributes["transform.with_named_sequence"] = ir.UnitAttr.get()
    return module, add_sequence(module, ENTRY)


def add_sequence(module: Any, name: str) -> Any:
    """Append a named sequence ``name`` on the payload root to the transform ``module`` (one
    from :func:`new_schedule`): a second step that a Python rewrite between the two applies
    (:func:`apply_schedule_module` with ``entry=name``). End its body with ``YieldOp``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.bindings import transform as t
    from stagegraph.stages.common.transform_build import any_op

    with ir.InsertionPoint(module.body):
        return t.NamedSequenceOp(
            name,
            [any_op()],
            [],
            arg_attrs=[{"transform.readonly": ir.UnitAttr.get()}],
        )


def apply_schedule_module(payload: Any, schedule: Any, entry: str = ENTRY) -> None:
    """Apply the named sequence ``entry`` of ``schedule`` to ``payload`` (in place)."""
    from stagegraph.mlir.bindings import interpreter

    payload = getattr(payload, "ir", payload)
    operation = getattr(payload, "operation", payload)
    interpreter.apply_named_sequence(operation, _named_sequence(schedule, entry), schedule)


def apply_transform_module(payload: Module, schedule_text: str, entry: str, source: str) -> None:
    """Parse a transform module into the payload's context and apply its named sequence."""
    from stagegraph.mlir.diagnostics import parse_module

    schedule = parse_module(schedule_text, payload.ir.context, source=source)
    apply_schedule_module(payload, schedule, entry)


def _named_sequence(schedule: Any, entry: str) -> Any:
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
