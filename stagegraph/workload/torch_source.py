"""Where a PyTorch workload's model and inputs come from: a KernelBench problem file
(``FILE.py`` with ``Model``, ``get_inputs()`` and ``get_init_inputs()``, its module-level
constants overridable from the spec) or an importable factory (``package.module:factory``
returning ``(model, example_inputs)``).

Overrides are applied to the file's source before it runs: the value of the top-level
assignment of each overridden name is replaced, then the module executes, so assignments
derived from it (``bias_shape = (out_channels, 1, 1)``) see the new value. In a chained
assignment (``height = width = 128``) either name sets both. Seeding follows KernelBench:
``torch.manual_seed(seed)`` before ``get_init_inputs()`` and the model, again before
``get_inputs()``. Importing this module does not import torch.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagegraph.errors import PayloadError, UnknownWorkloadError, WorkloadParamError

#: An override value: an integer, a float, or integers joined by ``x`` (a tuple).
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)$")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass
class TorchProblem:
    """A model, the inputs to call it with, and a name for messages."""

    model: Any
    inputs: list[Any]
    what: str


def require_torch(feature: str) -> Any:
    """The ``torch`` module.

    Raises:
        TorchUnavailableError: torch is not installed (names the ``torch`` extra).
    """
    try:
        import torch
    except ImportError as exc:
        from stagegraph.errors import TorchUnavailableError

        raise TorchUnavailableError(
            f"{feature} needs PyTorch, which cannot be imported ({exc}); install the torch "
            f"extra: pip install 'stagegraph[torch]' (torch==2.13.0, the CPU build)"
        ) from None
    return torch


def is_factory_spec(text: str) -> bool:
    """Whether ``text`` looks like ``package.module:factory`` (no ``key=value`` after)."""
    return bool(_FACTORY.match(text)) and "." in text.partition(":")[0]


# ---------------------------------------------------------------- problem files


def parse_value(text: str) -> int | float | tuple[int, ...]:
    """``16`` -> 16, ``0.5`` -> 0.5, ``16x1x1`` -> (16, 1, 1).

    Raises:
        ValueError: anything else.
    """
    text = text.strip()
    if "x" in text:
        items = text.split("x")
        if all(re.fullmatch(r"\d+", item) for item in items):
            return tuple(int(item) for item in items)
        raise ValueError(f"{text!r}: a tuple is integers joined by 'x', e.g. 16x1x1")
    if not _NUMBER.match(text):
        raise ValueError(f"{text!r} is no integer, float or tuple written like 16x1x1")
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)


def split_unpacking(tree: ast.Module) -> ast.Module:
    """``height, width = (224, 224)`` at the top level becomes one assignment per name, so
    each name can be overridden (only where no item reads a name being assigned)."""
    body: list[ast.stmt] = []
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        items = getattr(node, "value", None)
        if (
            isinstance(target, ast.Tuple) and len(node.targets) == 1
            and isinstance(items, ast.Tuple | ast.List) and len(items.elts) == len(target.elts)
            and all(isinstance(t, ast.Name) for t in target.elts)
        ):  # fmt: skip
            bound = {t.id for t in target.elts}
            read = {n.id for n in ast.walk(items) if isinstance(n, ast.Name)}
            if not bound & read:
                body += [ast.copy_location(ast.Assign(targets=[t], value=v), node)
                         for t, v in zip(target.elts, items.elts, strict=True)]  # fmt: skip
                continue
        body.append(node)
    tree.body = body
    return ast.fix_missing_locations(tree)


def constant_names(tree: ast.Module) -> list[str]:
    """Names bound by the file's top-level assignments, in order."""
    names: list[str] = []
    for node in split_unpacking(tree).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
        )  # fmt: skip
        for target in targets:
            if isinstance(target, ast.Name) and target.id not in names:
                names.append(target.id)
    return names


def apply_overrides(tree: ast.Module, overrides: dict[str, Any], source: str) -> ast.Module:
    """``tree`` with each overridden name's top-level assignment given the new value (a
    chained assignment is split so every name of the chain gets its value: its own
    override, else the first override given in the chain).

    Raises:
        WorkloadParamError: a name the file does not assign (the names it does are listed).
    """
    literals = {k: v for k, v in overrides.items() if k.startswith(LITERAL_PREFIX)}
    overrides = {k: v for k, v in overrides.items() if k not in literals}
    for key, value in literals.items():
        _override_literal(tree, key, value, source)
    known = constant_names(tree)  # (unpacking split: tree.body is the split one now)
    unknown = [name for name in overrides if name not in known]
    if unknown:
        raise WorkloadParamError(
            f"{source}: no module-level constant {unknown[0]!r} to override; its constants: "
            f"{', '.join(known) or '(none)'} (and seed)"
        )
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            node = ast.Assign(targets=[node.target], value=node.value or ast.Constant(None))
        if not isinstance(node, ast.Assign):
            body.append(node)
            continue
        chain = [t.id for t in node.targets if isinstance(t, ast.Name)]
        given = [overrides[name] for name in chain if name in overrides]
        if not given:
            body.append(node)
            continue
        for target in node.targets:
            name = target.id if isinstance(target, ast.Name) else None
            value = overrides.get(name, given[0]) if name else None
            new = ast.Assign(
                targets=[target], value=_literal(_like(value, node.value)) if name else node.value
            )
            body.append(ast.copy_location(new, node))
    tree.body = body
    return ast.fix_missing_locations(tree)


# A number written inside a function (``torch.rand(b, c, 224, 224)`` in ``get_inputs``) is
# named by where it stands: ``lit:get_inputs@68:48`` (line 68, column 48), as KernelBench's
# manifests name the literals they scaled.
LITERAL_PREFIX = "lit:"


def _override_literal(tree: ast.Module, key: str, value: Any, source: str) -> None:
    """Give the number literal that ``key`` (``lit:FUNCTION@LINE:COLUMN``) names ``value``.

    Raises:
        WorkloadParamError: a malformed key, or no number literal at that place.
    """
    match = re.fullmatch(r"lit:(\w+)@(\d+):(\d+)", key)
    if match is None:
        raise WorkloadParamError(
            f"{source}: {key!r}: a literal is named lit:FUNCTION@LINE:COLUMN, e.g. "
            "lit:get_inputs@68:48"
        )
    function, line, column = match[1], int(match[2]), int(match[3])
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name != function:
            continue
        for literal in ast.walk(node):
            if (
                isinstance(literal, ast.Constant) and type(literal.value) in (int, float)
                and (literal.lineno, literal.col_offset) == (line, column)
            ):  # fmt: skip
                literal.value = _like(value, literal)
                return
    raise WorkloadParamError(
        f"{source}: {key!r}: no number literal at line {line}, column {column} of a "
        f"function {function!r}"
    )


def _like(value: Any, original: ast.expr) -> Any:
    """The override shaped like the literal it replaces: a list for a list, a 1-tuple for
    a scalar given to a tuple, a float for a float."""
    if isinstance(original, ast.List | ast.Tuple):
        items = list(value) if isinstance(value, tuple) else [value]
        return items if isinstance(original, ast.List) else tuple(items)
    if isinstance(original, ast.Constant) and isinstance(original.value, float):
        return float(value) if isinstance(value, int) else value
    return value


def _literal(value: Any) -> ast.expr:
    return ast.parse(repr(value), mode="eval").body


def load_problem_file(path: Path, overrides: dict[str, Any], seed: int) -> TorchProblem:
    """Run a KernelBench problem file with ``overrides``, then build its model and inputs.

    Raises:
        WorkloadParamError: an unknown constant.
        PayloadError: the file does not parse or run, or lacks ``Model``/``get_inputs``/
            ``get_init_inputs``, or building the model or its inputs fails.
    """
    torch = require_torch(f"the workload {path}")
    source = str(path)
    try:
        tree = ast.parse(path.read_text(), filename=source)
    except SyntaxError as exc:
        raise PayloadError(f"{source}:{exc.lineno}: {exc.msg}") from None
    tree = apply_overrides(tree, overrides, source)
    namespace: dict[str, Any] = {"__name__": f"stagegraph_problem_{path.stem}", "__file__": source}
    _guarded(source, "running the file", lambda: exec(compile(tree, source, "exec"), namespace))
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in namespace]
    if missing:
        raise PayloadError(
            f"{source}: a PyTorch problem file defines Model, get_inputs() and "
            f"get_init_inputs(); it lacks {', '.join(missing)}"
        )
    torch.manual_seed(seed)
    init = _guarded(source, "get_init_inputs()", namespace["get_init_inputs"])
    model = _guarded(source, "Model(*get_init_inputs())", lambda: namespace["Model"](*init))
    torch.manual_seed(seed)
    inputs = _guarded(source, "get_inputs()", namespace["get_inputs"])
    return TorchProblem(model, list(inputs), f"{source}:Model")


def _guarded(source: str, what: str, call: Any) -> Any:
    try:
        return call()
    except Exception as exc:
        raise PayloadError(f"{source}: {what} failed: {type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------- factories


def load_factory(target: str, seed: int) -> TorchProblem:
    """Call ``package.module:factory`` (after ``torch.manual_seed(seed)``).

    Raises:
        UnknownWorkloadError: the module or the function cannot be found.
        PayloadError: the factory fails or returns no ``(model, example_inputs)``.
    """
    torch = require_torch(f"the workload {target}")
    module_name, _, function = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownWorkloadError(
            f"workload {target!r}: cannot import module {module_name!r} ({exc})"
        ) from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise UnknownWorkloadError(f"workload {target!r}: {module_name} has no function "
                                   f"{function!r}")  # fmt: skip
    torch.manual_seed(seed)
    result = _guarded(target, "the factory", factory)
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise PayloadError(f"{target}: a factory returns (model, example_inputs), got "
                           f"{type(result).__name__}")  # fmt: skip
    model, inputs = result
    inputs = list(inputs) if isinstance(inputs, tuple | list) else [inputs]
    return TorchProblem(model, inputs, f"{target}()")
