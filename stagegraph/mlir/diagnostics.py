"""Small helpers over the MLIR bindings that the core needs (parsing, op counts, diagnostics)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from stagegraph.errors import PayloadError


def count_ops(module: Any) -> int:
    """Number of operations nested in ``module`` (the module op itself excluded)."""
    from stagegraph.mlir.bindings import ir

    count = 0

    def visit(_op: Any) -> Any:
        nonlocal count
        count += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return count - 1


def format_diagnostic(diag: Any, source: str = "-") -> str:
    text = f"{location_text(diag.location, source)}: {diag.message}"
    for note in getattr(diag, "notes", []):
        text += f"\n    note: {location_text(note.location, source)}: {note.message}"
    return text


@contextlib.contextmanager
def capture_diagnostics(context: Any) -> Iterator[list[str]]:
    """Collect every diagnostic the context emits while the block runs."""
    collected: list[str] = []

    def handler(diag: Any) -> bool:
        collected.append(format_diagnostic(diag))
        return True

    handle = context.attach_diagnostic_handler(handler)
    try:
        yield collected
    finally:
        handle.detach()


def error_diagnostics(exc: BaseException) -> list[str]:
    """The diagnostics an ``ir.MLIRError`` carries (empty for other exceptions)."""
    return [format_diagnostic(d) for d in getattr(exc, "error_diagnostics", [])]


def parse_capturing(
    text: str, context: Any, source: str = "<payload>"
) -> tuple[Any, list[str], Exception | None]:
    """Parse ``text``; return the module (or None), the located diagnostics and the error.

    A handler collects the diagnostics: in these bindings a parse ``MLIRError`` carries none.
    """
    from stagegraph.mlir.bindings import ir

    diagnostics: list[str] = []

    def keep(diag: Any) -> bool:
        diagnostics.append(format_diagnostic(diag, source).strip())
        return True

    handle = context.attach_diagnostic_handler(keep)
    try:
        with context:
            return ir.Module.parse(text), diagnostics, None
    except ir.MLIRError as exc:
        return None, diagnostics, exc
    finally:
        handle.detach()


def parse_module(text: str, context: Any, source: str = "<payload>") -> Any:
    """Parse MLIR assembly, turning parse errors into a PayloadError with file:line:col."""
    module, diagnostics, error = parse_capturing(text, context, source)
    if module is None:
        details = "; ".join(diagnostics) or str(error)
        raise PayloadError(f"cannot parse MLIR in {source}: {details}")
    return module


def location_text(loc: Any, source: str = "-") -> str:
    """``file:line:col`` for a file location (``-`` means ``source``), else the location."""
    if hasattr(loc, "start_line") and hasattr(loc, "filename"):
        name = source if loc.filename == "-" else loc.filename
        return f"{name}:{loc.start_line}:{loc.start_col}"
    return str(loc)
