"""Pass pipelines as text, and checks that need the MLIR bindings but no payload: does a
pass pipeline parse (pass names and options known to this build), does a transform module
parse and hold its entry?

``stagegraph validate`` uses them so that a misspelled pass (``func.func(csee)``) or a
broken schedule file is reported when the graph is checked, not after a payload has been
compiled up to that stage. Parsing builds nothing: a pipeline is parsed by
``PassManager.parse`` in a fresh context, exactly as a stage would run it.
"""

from __future__ import annotations

from stagegraph.errors import PayloadError


def anchored(pipeline: str) -> str:
    """The pipeline as ``PassManager.parse`` takes it: nested in ``builtin.module(...)``
    unless it is already anchored there (``builtin.module(...)``)."""
    text = pipeline.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        depth = 0
        for i, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0 and i >= len("builtin.module"):
                if i == len(text) - 1:
                    return text  # one anchor around the whole pipeline
                break
    return f"builtin.module({text})"


def pipeline_problem(anchored_pipeline: str) -> str | None:
    """Why ``anchored_pipeline`` (``builtin.module(...)``) does not parse; None when it does."""
    from stagegraph.mlir.bindings import new_context, passmanager

    try:
        passmanager.PassManager.parse(anchored_pipeline, context=new_context())
    except ValueError as exc:
        lines = [line.strip() for line in str(exc).splitlines()]
        # drop the parser's echo of the pipeline and its caret line under the error
        kept = [line for line in lines if line and not line.startswith("^")
                and line not in anchored_pipeline]  # fmt: skip
        return "; ".join(kept)
    return None


def transform_problem(text: str, source: str, entry: str) -> str | None:
    """Why the transform module ``text`` cannot serve as a schedule (it does not parse, or
    has no named sequence ``entry``); None when it can."""
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.diagnostics import parse_module

    context = new_context()
    try:
        module = parse_module(text, context, source=source)
    except PayloadError as exc:
        return str(exc)
    names = [
        op.attributes["sym_name"].value
        for op in module.body.operations
        if op.operation.name == "transform.named_sequence"
    ]
    if entry not in names:
        found = ", ".join(f"@{n}" for n in names) or "none"
        return f"{source} has no named sequence @{entry} (found: {found})"
    return None
