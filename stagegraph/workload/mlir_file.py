"""A workload read from a ``.mlir`` file (e.g. a KernelBench payload).

The entry is ``main`` or the single public function with a body. Inputs follow its signature
(static shapes only). If ``<stem>.npz`` lies beside the file with ``in0..``/``out0..`` arrays,
those are the inputs and the reference; otherwise the reference comes from
the workload's ``reference_runner`` (a Session sets the naive graph).
"""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from stagegraph.dtypes import NAMES
from stagegraph.errors import PayloadError, ReferenceUnavailableError
from stagegraph.workload.base import (
    Complexity,
    TensorSpec,
    Workload,
    WorkloadParams,
    runner_source,
)
from stagegraph.workload.npz import (
    INPUT_PREFIXES,
    REFERENCE_PREFIXES,
    check_arrays,
    load_arrays,
    names,
    read_headers,
)

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir


class MlirFileParams(WorkloadParams):
    entry: str | None = Field(None, description="entry function (default: main or the only one)")


@dataclass(frozen=True)
class _Summary:
    """Plain-Python facts about the file, gathered once (no op handles kept)."""

    entry: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    arguments: dict[int, tuple[int, ...]]  # dynamic argument -> the static shape it got
    results: dict[int, tuple[int, ...]]


class MlirFileWorkload(Workload):
    """The payload of a ``.mlir`` file; construction parses it and reports problems early
    (an op the analysis cannot take is reported by the graph's analysis stage, or when
    flops or tolerances are first asked for).

    Raises:
        PayloadError: parse error (``file:line:column: message``), an op of an unregistered
            dialect, no/ambiguous entry function, or a dynamic/unranked argument.
    """

    name = "mlir-file"
    Params = MlirFileParams
    params: MlirFileParams

    def __init__(self, path: str | Path, /, **values: Any) -> None:
        super().__init__(**values)
        self.path = Path(path)
        self.name = self.path.stem
        self._summary = _summarize(self.path, self.params.entry)
        self.entry = self._summary.entry
        self._npz_names = _check_npz(self.npz_path, self._summary)

    @property
    def spec(self) -> str:
        """The path, plus ``:entry=..,seed=..`` when they differ from the defaults."""
        options = {k: v for k, v in self.params.model_dump(exclude_defaults=True).items()}
        suffix = ",".join(f"{k}={v}" for k, v in options.items())
        return f"{self.path}:{suffix}" if suffix else str(self.path)

    def __reduce__(self) -> tuple[Any, ...]:
        options = self.params.model_dump(exclude_defaults=True)
        return (functools.partial(MlirFileWorkload, self.path, **options), ())

    @property
    def text(self) -> str:
        """The file's text, read when asked for, not kept: a model's weights print as hex,
        twice their size (VGG-16: 1.1 GB held for the whole run). A bytecode file (a
        PyTorch model's import) is printed."""
        from stagegraph.mlir.diagnostics import is_bytecode

        if is_bytecode(self.path):
            return str(_parse(self.path, None))
        return self.path.read_text()

    @property
    def npz_path(self) -> Path:
        return self.path.with_suffix(".npz")

    def payload(self, context: ir.Context | None = None) -> ir.Module:
        """Parse the file into ``context`` (a fresh module each call), with dynamic sizes
        specialized as the npz fixes them (see :attr:`specialization`)."""
        from stagegraph.mlir.bindings import new_context
        from stagegraph.mlir.functions import entry_function

        context = context or new_context()
        module = _parse(self.path, context)
        summary = self._summary
        if summary.arguments or summary.results:
            with context:
                function = entry_function(module, summary.entry)
                _apply_specialization(self.path, module, function, summary.arguments,
                                      summary.results)  # fmt: skip
        return module

    @property
    def specialization(self) -> dict[str, list[int]]:
        """The static shapes given to dynamic arguments and results at load time."""
        summary = self._summary
        return {
            **{f"argument {i}": list(s) for i, s in summary.arguments.items()},
            **{f"result {i}": list(s) for i, s in summary.results.items()},
        }

    def input_specs(self) -> list[TensorSpec]:
        return list(self._summary.inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self._summary.outputs)

    def _arrays(self, prefixes: tuple[str, ...]) -> list[np.ndarray] | None:
        """The npz's arrays for ``prefixes`` (None: no npz), checked against the entry's
        signature at construction."""
        if self._npz_names is None:
            return None
        return load_arrays(self.npz_path, self._npz_names[prefixes])

    def _generate_inputs(self) -> list[np.ndarray]:
        arrays = self._arrays(INPUT_PREFIXES)
        return super()._generate_inputs() if arrays is None else arrays

    def _compute_reference(self) -> list[np.ndarray]:
        arrays = self._arrays(REFERENCE_PREFIXES)
        if arrays is not None:
            return arrays
        if self.reference_runner is None:
            raise ReferenceUnavailableError(
                f"{self.path}: no reference: no {self.npz_path.name} beside it and no "
                "reference runner (a Session sets the naive graph as the reference runner)"
            )
        return list(self.reference_runner(self))

    @property
    def reference_source(self) -> str:
        if self.prefer_runner or self._npz_names is None:
            runner = self.reference_runner
            return "none" if runner is None else runner_source(runner)
        return "npz"

    @property
    def reduction_length(self) -> int:
        return self._costs[1]

    def magnitudes(self) -> list[float]:
        """The default floor (the inputs' size), times ``sqrt(n)`` for a result that is a
        sum of ``n`` terms: the size of its partial sums, which its rounding errors follow
        even when the terms cancel (:mod:`stagegraph.workload.sum_outputs`)."""
        if self._magnitudes is None:
            floors = super().magnitudes()
            terms = self._summed_terms
            self._magnitudes = [f * math.sqrt(n) for f, n in zip(floors, terms, strict=True)]
        return self._magnitudes

    @functools.cached_property
    def _summed_terms(self) -> list[int]:
        from stagegraph.workload.sum_outputs import summed_terms

        return summed_terms(self.payload(), self.entry)

    @property
    def complexity(self) -> Complexity:
        """Flops estimated from the linalg ops' loop ranges; bytes = arguments + results."""
        moved = sum(s.nbytes for s in self.input_specs() + self.output_specs())
        return Complexity(flops=self._costs[0], bytes_moved=moved)

    @functools.cached_property
    def _costs(self) -> tuple[int, int]:
        """(flops, longest reduction) of the entry, from the analysis the graphs' cost
        models use, on first use: only verifying and timing need them, and analysing an
        unrolled network of 20,000 ops is seconds a compile need not pay twice (its own
        analysis stage does the same walk).

        Raises:
            PayloadError: an op the analysis does not support (a dynamic shape inside).
        """
        from stagegraph.errors import UnsupportedPayloadError
        from stagegraph.stages.analysis import analyze

        module = self.payload()
        with module.context:
            try:
                facts = analyze(module, self.entry)
            except UnsupportedPayloadError as exc:
                raise PayloadError(f"{self.path}: {exc}") from None
        return facts.flops, facts.reduction_length


# ---------------------------------------------------------------- parsing


def _parse(path: Path, context: ir.Context | None) -> ir.Module:
    """Parse the file (by MLIR, from the file: no string of it is held); if that fails,
    parse its text again for diagnostics located as ``file:line:column`` and unregistered
    ops named (or rewritten: see :func:`~stagegraph.mlir.diagnostics.parse_payload`)."""
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.diagnostics import parse_file_quietly, parse_payload

    context = context or new_context()
    module = parse_file_quietly(path, context)
    if module is not None:
        return module
    return parse_payload(path.read_text(errors="replace"), context, source=str(path))


# ---------------------------------------------------------------- inspection


def _summarize(path: Path, entry: str | None) -> _Summary:
    """Signature of the file's entry (by the entry rule the graphs' cost models use);
    dynamic sizes specialized to the arrays of the ``.npz`` beside the file when it has
    them. Flops and the longest reduction come later, when asked for (``_costs``)."""
    from stagegraph.errors import UnsupportedPayloadError
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.functions import entry_function, function_name

    context = new_context()
    module = _parse(path, context)
    with context:
        try:
            function = entry_function(module, entry)
        except UnsupportedPayloadError as exc:
            raise PayloadError(f"{path}: {exc} (add ':entry=NAME' to the workload spec)") from None
        name = function_name(function)
        arguments, results = _specialization(path, function)
        if arguments or results:
            _apply_specialization(path, module, function, arguments, results)
        kind = ir.TypeAttr(function.attributes["function_type"]).value
        inputs = [_spec(path, name, i, t) for i, t in enumerate(kind.inputs)]
        outputs = [_spec(path, name, i, t, result=True) for i, t in enumerate(kind.results)]
    return _Summary(name, inputs, outputs, arguments, results)


def _npz_shapes(path: Path) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Shapes of the ``in*`` and the ``mut*`` + ``out*`` arrays of the npz beside ``path``."""
    npz = path.with_suffix(".npz")
    if not npz.is_file():
        return [], []
    headers = read_headers(npz)
    return [
        [headers[n][0] for n in names(headers, prefixes)]
        for prefixes in (INPUT_PREFIXES, REFERENCE_PREFIXES)
    ]


def _check_npz(npz: Path, summary: _Summary) -> dict[tuple[str, ...], list[str]] | None:
    """Names of the npz's input and reference arrays, checked against the entry's signature
    before anything compiles (None: no npz)."""
    if not npz.is_file():
        return None
    headers = read_headers(npz)
    return {
        INPUT_PREFIXES: check_arrays(npz, headers, INPUT_PREFIXES, summary.inputs,
                                     summary.entry, "argument"),
        REFERENCE_PREFIXES: check_arrays(npz, headers, REFERENCE_PREFIXES, summary.outputs,
                                         summary.entry, "result"),
    }  # fmt: skip


def _specialization(path: Path, function: Any) -> tuple[dict[int, tuple], dict[int, tuple]]:
    """Static shapes for the entry's dynamic arguments and results, from the npz (empty
    when nothing is dynamic or no npz fixes the sizes; ``_spec`` then names the problem)."""
    from stagegraph.mlir.bindings import ir

    kind = ir.TypeAttr(function.attributes["function_type"]).value
    dynamic = [
        [i for i, t in enumerate(types) if isinstance(t, ir.RankedTensorType)
         and not t.has_static_shape]
        for types in (kind.inputs, kind.results)
    ]  # fmt: skip
    if not any(dynamic):
        return {}, {}
    ins, outs = _npz_shapes(path)
    if len(ins) != len(kind.inputs) or len(outs) != len(kind.results):
        return {}, {}
    return {i: ins[i] for i in dynamic[0]}, {i: outs[i] for i in dynamic[1]}


def _apply_specialization(
    path: Path, module: Any, function: Any, arguments: dict, results: dict
) -> None:
    from stagegraph.mlir.specialize import specialize

    try:
        specialize(module, function, arguments, results)
    except PayloadError as exc:
        raise PayloadError(f"{path}: {path.with_suffix('.npz').name}: {exc}") from None


def _spec(path: Path, function: str, index: int, kind: Any, result: bool = False) -> TensorSpec:
    from stagegraph.mlir.bindings import ir

    what = f"{'result' if result else 'argument'} #{index} of @{function}"
    if isinstance(kind, ir.RankedTensorType | ir.MemRefType):
        if not kind.has_static_shape:
            raise PayloadError(
                f"{path}: {what} has a dynamic shape ({kind}); workloads need static shapes "
                f"(or a {path.with_suffix('.npz').name} beside it whose arrays fix the sizes)"
            )
        return TensorSpec(shape=tuple(kind.shape), dtype=_dtype(path, what, kind.element_type))
    if isinstance(kind, ir.ShapedType):
        raise PayloadError(f"{path}: {what} is unranked ({kind}); workloads need static shapes")
    return TensorSpec(shape=(), dtype=_dtype(path, what, kind))


def _dtype(path: Path, what: str, element: Any) -> str:
    from stagegraph.mlir.types import element_name

    name = element_name(element)
    if name is None or name.startswith("ui") or name not in NAMES:
        raise PayloadError(f"{path}: {what} has element type {element}, which has no numpy dtype")
    return name
