"""Parsing and diagnostics over the MLIR bindings: located parse errors, payloads whose
unregistered ops are named, captured diagnostics, op counts (one place for each)."""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator, Sequence
from typing import Any

from stagegraph.errors import PayloadError, UnregisteredOpError, UnsupportedPayloadError

#: Whether pass managers verify the IR after every pass (``--verify-each`` turns it on, see
#: :class:`~stagegraph.instrument.ir_hooks.VerifyEach`: a pass that breaks the IR is then
#: named); off, each pipeline's result is verified once
#: (:func:`~stagegraph.stages.common.passes.run_pipeline`).
VERIFY_PASSES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "stagegraph_verify_passes", default=False
)


def count_ops(module: Any) -> int:
    """Number of operations nested in ``module`` (the module op itself excluded).

    A bare counting walk: the engine counts every stage's output, and collecting the ops
    into a list with a predicate costs several times as much on a large module."""
    from stagegraph.mlir.bindings import ir

    count = 0
    advance = ir.WalkResult.ADVANCE

    def visit(_op: Any) -> Any:
        nonlocal count
        count += 1
        return advance

    getattr(module, "operation", module).walk(visit, ir.WalkOrder.PRE_ORDER)
    return count - 1  # the module op itself


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


#: The first bytes of an MLIR bytecode file.
BYTECODE_MAGIC = b"ML\xefR"


def is_bytecode(path: Any) -> bool:
    """Whether the file at ``path`` holds MLIR bytecode (not assembly)."""
    with open(path, "rb") as file:
        return file.read(len(BYTECODE_MAGIC)) == BYTECODE_MAGIC


def parse_file_quietly(path: Any, context: Any) -> Any | None:
    """The module of the file at ``path`` (assembly or bytecode), parsed by MLIR from the
    file itself: no Python string of it is made (a model's weights print as hex, twice
    their size). None when it does not parse; the caller parses the text then, for
    located diagnostics (its diagnostics here are dropped)."""
    from stagegraph.mlir.bindings import ir

    handle = context.attach_diagnostic_handler(lambda _diag: True)
    try:
        with context:
            return ir.Module.parseFile(str(path))
    except ir.MLIRError:
        return None
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


# -- payload parsing: unregistered dialects named ----------------------------------------

# Parser message for an op whose dialect is not registered and that is written in its
# custom assembly form (then even allow_unregistered_dialects cannot parse it).
_CUSTOM_OP_DIAGNOSTIC = re.compile(r"Dialect `([\w.]+)' not found for custom op '([\w.]+)'")


def unregistered_ops(text: str) -> list[str]:
    """Names of the ops of ``text`` whose dialect these bindings do not register."""
    from stagegraph.mlir.bindings import new_context

    context = new_context()
    context.allow_unregistered_dialects = True
    module, diagnostics, _ = parse_capturing(text, context)
    if module is not None:
        from stagegraph.mlir.walk import collect

        unknown = collect(module, lambda op: not context.is_registered_operation(op.name))
        return list(dict.fromkeys(op.name for op in unknown))
    # Custom-form ops of unknown dialects do not parse even here: the parser's diagnostic
    # (an error message, not IR) is the only place that names them.
    found = (_CUSTOM_OP_DIAGNOSTIC.search(d) for d in diagnostics)
    names = [m.group(2) for m in found if m and not context.is_registered_operation(m.group(2))]
    return list(dict.fromkeys(names))


def explain_parse_error(
    text: str, error: Exception | None = None, diagnostics: Sequence[str] = ()
) -> UnsupportedPayloadError:
    """A clear error for payload text that failed to parse (``error``, the ``ir.MLIRError``):
    which unregistered op of which dialect, or else the parser's diagnostics.

    The text is needed because in these bindings a parse error carries no diagnostics: the
    op is found by reparsing with unregistered dialects allowed and walking the module.
    """
    diagnostics = [*diagnostics, *(format_diagnostic(d) for d in _error_diagnostics(error))]
    names = unregistered_ops(text)
    if names:
        op_name = names[0]
        dialect = op_name.partition(".")[0]
        others = f" (also {', '.join(names[1:])})" if names[1:] else ""
        return UnregisteredOpError(
            f"payload uses op '{op_name}'{others} of dialect '{dialect}', which these MLIR "
            f"bindings do not register; lower it to linalg before stagegraph "
            f"(e.g. with torch-mlir's own pipeline) or drop it from the payload",
            op_name=op_name,
            dialect=dialect,
        )
    detail = "; ".join(diagnostics) or (str(error) if error else "no diagnostic")
    return UnsupportedPayloadError(f"payload does not parse: {detail}")


def _error_diagnostics(error: Exception | None) -> list[Any]:
    return list(getattr(error, "error_diagnostics", None) or [])


def parse_payload(text: str, context: Any | None = None, source: str = "<payload>") -> Any:
    """Parse payload text into an ``ir.Module`` (``source`` names it in diagnostics).

    Raises:
        UnregisteredOpError: the text uses an op of an unregistered dialect (tm_tensor, ...).
        UnsupportedPayloadError: any other parse error, with the parser's diagnostics.
    """
    from stagegraph.mlir.bindings import new_context

    context = context or new_context()
    module, diagnostics, error = parse_capturing(text, context, source)
    if module is None:
        problem = explain_parse_error(text, error, diagnostics)
        if isinstance(problem, UnregisteredOpError):
            module = _parse_rewriting_scans(text, context, source)
            if module is not None:
                return module
        if isinstance(problem, UnregisteredOpError):
            raise UnregisteredOpError(
                f"{source}: {problem}", op_name=problem.op_name, dialect=problem.dialect
            ) from None
        raise problem from None
    return module


def _parse_rewriting_scans(text: str, context: Any, source: str) -> Any | None:
    """The payload with its ``tm_tensor.scan`` ops rewritten into upstream ops (see
    :mod:`stagegraph.mlir.scan`), or None when it has other unregistered ops or the
    torch-mlir-opt tool is not there to read the dialect."""
    from stagegraph.mlir.scan import REWRITTEN, generic_form, rewrite_scans

    if not set(unregistered_ops(text)) <= REWRITTEN:
        return None
    generic = generic_form(text)
    if generic is None:
        return None
    context.allow_unregistered_dialects = True
    try:
        module, _, _ = parse_capturing(generic, context, source)
        if module is None:
            return None
        rewrite_scans(module)
    finally:
        context.allow_unregistered_dialects = False
    return module if module.operation.verify() else None
