"""The functions of a payload and which one is the entry: one rule, used by the analysis, the
schedules, the benchmark wrapper and ``.mlir`` workloads alike."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from stagegraph.errors import UnsupportedPayloadError

#: Marks the functions stagegraph inserted (benchmark wrappers): never payload functions.
WRAPPER_ATTR = "stagegraph.wrapper"


def payload_functions(module: Any) -> list[Any]:
    """Top-level ``func.func`` ops, without the ones stagegraph inserted (wrappers)."""
    return [
        op.operation
        for op in module.body.operations
        if op.operation.name == "func.func" and WRAPPER_ATTR not in op.operation.attributes
    ]


def function_name(fn: Any) -> str:
    return fn.attributes["sym_name"].value


def visibility(fn: Any) -> str:
    attrs = fn.attributes
    return attrs["sym_visibility"].value if "sym_visibility" in attrs else "public"


def select_entry(functions: Sequence[Any], entry: str | None = None) -> Any:
    """The entry function: ``entry`` if given, else the single public function with a body,
    else ``@main``.

    Raises:
        UnsupportedPayloadError: no such function, or no way to choose one.
    """
    names = [function_name(fn) for fn in functions]
    if not functions:
        raise UnsupportedPayloadError("payload has no func.func to analyse")
    listing = ", ".join(f"@{n}" for n in names)
    if entry is not None:
        for fn in functions:
            if function_name(fn) == entry:
                return fn
        close = difflib.get_close_matches(entry, names, n=1)
        hint = f" (did you mean @{close[0]}?)" if close else ""
        raise UnsupportedPayloadError(
            f"payload has no function @{entry}{hint}; its functions are {listing}"
        )
    public = [fn for fn in functions if visibility(fn) == "public" and fn.regions[0].blocks]
    if len(public) == 1:
        return public[0]
    if "main" in names:
        return functions[names.index("main")]
    raise UnsupportedPayloadError(
        f"payload has no entry function: {len(public)} public functions with a body and no "
        f"@main among {listing}; name the entry explicitly"
    )


def find_function(module: Any, name: str) -> Any:
    """The top-level ``func.func`` or ``llvm.func`` named ``name`` (at any IR level, wrappers
    included), or None."""
    from stagegraph.mlir.walk import children

    for op in children(module.operation):  # iterating the body imports the llvm module
        if (
            op.name in ("func.func", "llvm.func")
            and "sym_name" in op.attributes
            and op.attributes["sym_name"].value == name
        ):
            return op
    return None


def entry_function(module: Any, entry: str | None = None) -> Any:
    """:func:`select_entry` over the module's payload functions."""
    return select_entry(payload_functions(module), entry)
