"""A workload read from a ``.mlir`` file (e.g. a KernelBench payload).

The entry is ``main`` or the single public function with a body. Inputs follow its signature
(static shapes only). If ``<stem>.npz`` lies beside the file with ``in0..``/``out0..`` arrays,
those are the inputs and the reference; otherwise the reference comes from
the workload's ``reference_runner`` (a Session sets the naive graph).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from stagegraph.errors import PayloadError, ReferenceUnavailableError
from stagegraph.workload.base import Complexity, TensorSpec, Workload, WorkloadParams

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir

_CAST_OPS = {"extf", "truncf", "extsi", "extui", "trunci", "sitofp", "uitofp", "fptosi", "fptoui"}


class MlirFileParams(WorkloadParams):
    entry: str | None = Field(None, description="entry function (default: main or the only one)")


@dataclass(frozen=True)
class _Summary:
    """Plain-Python facts about the file, gathered once (no op handles kept)."""

    entry: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    flops: int
    reduction: int


class MlirFileWorkload(Workload):
    """The payload of a ``.mlir`` file; construction parses it and reports problems early.

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
        self.text = self.path.read_text()
        self._summary = _summarize(self.path, self.text, self.params.entry)
        self.entry = self._summary.entry

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
    def npz_path(self) -> Path:
        return self.path.with_suffix(".npz")

    def payload(self, context: ir.Context | None = None) -> ir.Module:
        """Parse the file into ``context`` (a fresh module each call)."""
        from stagegraph.mlir.bindings import new_context

        return _parse(self.path, self.text, context or new_context())

    def input_specs(self) -> list[TensorSpec]:
        return list(self._summary.inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self._summary.outputs)

    def _arrays(self, prefixes: tuple[str, ...], count: int) -> list[np.ndarray] | None:
        """``prefix0..`` arrays from the npz, concatenated over ``prefixes`` (None: no npz).

        Training-mode norms return updated running statistics (``mut0..``) before the output
        (``out0..``), so the reference is ``mut*`` followed by ``out*``.
        """
        if not self.npz_path.is_file():
            return None
        with np.load(self.npz_path) as data:
            names = [
                f"{prefix}{i}"
                for prefix in prefixes
                for i in range(len(data.files))
                if f"{prefix}{i}" in data.files
            ]
            if len(names) != count:
                raise PayloadError(
                    f"{self.npz_path}: has {len(names)} arrays {', '.join(names) or '(none)'} "
                    f"named {'/'.join(p + 'N' for p in prefixes)}, but @{self.entry} has {count}"
                )
            return [data[n] for n in names]

    def _generate_inputs(self) -> list[np.ndarray]:
        specs = self.input_specs()
        arrays = self._arrays(("in",), len(specs))
        if arrays is None:
            return super()._generate_inputs()
        for i, (array, spec) in enumerate(zip(arrays, specs, strict=True)):
            if array.shape != spec.shape or array.dtype != spec.numpy_dtype:
                raise PayloadError(
                    f"{self.npz_path}: in{i} is {array.dtype}{list(array.shape)} but argument "
                    f"#{i} of @{self.entry} is {spec.dtype}{list(spec.shape)}"
                )
        return arrays

    def _compute_reference(self) -> list[np.ndarray]:
        arrays = self._arrays(("mut", "out"), len(self.output_specs()))
        if arrays is not None:
            return arrays
        if self.reference_runner is None:
            raise ReferenceUnavailableError(
                f"{self.path}: no reference: no {self.npz_path.name} beside it and no "
                "reference runner (a Session sets the naive graph as the reference runner)"
            )
        return list(self.reference_runner(self))

    @property
    def reduction_length(self) -> int:
        return self._summary.reduction

    @property
    def complexity(self) -> Complexity:
        """Flops estimated from the linalg ops' loop ranges; bytes = arguments + results."""
        moved = sum(s.nbytes for s in self.input_specs() + self.output_specs())
        return Complexity(flops=self._summary.flops, bytes_moved=moved)


# ---------------------------------------------------------------- parsing


def _parse(path: Path, text: str, context: ir.Context) -> ir.Module:
    """Parse with diagnostics located as ``file:line:column``; unregistered ops named."""
    from stagegraph.mlir.diagnostics import parse_payload

    return parse_payload(text, context, source=str(path))


# ---------------------------------------------------------------- inspection


def _summarize(path: Path, text: str, entry: str | None) -> _Summary:
    from stagegraph.mlir.bindings import new_context, passmanager

    context = new_context()
    module = _parse(path, text, context)
    with context:
        function = _entry(path, module, entry)
        kind = function.type
        inputs = [_spec(path, function, i, t) for i, t in enumerate(kind.inputs)]
        outputs = [_spec(path, function, i, t, result=True) for i, t in enumerate(kind.results)]
        name = function.name.value
        passmanager.PassManager.parse("builtin.module(linalg-generalize-named-ops)").run(
            module.operation
        )
        flops, reduction = _count(module.operation)
    return _Summary(name, inputs, outputs, flops, reduction)


def _entry(path: Path, module: ir.Module, wanted: str | None) -> Any:
    from stagegraph.mlir.bindings import func, ir

    functions = {}
    for op in module.body.operations:
        if isinstance(op, func.FuncOp) and not op.is_external:
            visibility = op.attributes.get("sym_visibility")
            public = visibility is None or ir.StringAttr(visibility).value == "public"
            functions[op.name.value] = (op, public)
    if wanted is not None:
        if wanted not in functions:
            raise PayloadError(
                f"{path}: no function @{wanted}; functions: {', '.join(sorted(functions))}"
            )
        return functions[wanted][0]
    if "main" in functions:
        return functions["main"][0]
    public = [n for n, (_, is_public) in functions.items() if is_public]
    if len(public) != 1:
        raise PayloadError(
            f"{path}: cannot choose an entry among public functions "
            f"[{', '.join(public)}]; name one with ':entry=NAME'"
        )
    return functions[public[0]][0]


def _spec(path: Path, function: Any, index: int, kind: Any, result: bool = False) -> TensorSpec:
    from stagegraph.mlir.bindings import ir

    what = f"{'result' if result else 'argument'} #{index} of @{function.name.value}"
    if isinstance(kind, ir.RankedTensorType | ir.MemRefType):
        if not kind.has_static_shape:
            raise PayloadError(
                f"{path}: {what} has a dynamic shape ({kind}); workloads need static shapes"
            )
        return TensorSpec(shape=tuple(kind.shape), dtype=_dtype(path, what, kind.element_type))
    if isinstance(kind, ir.ShapedType):
        raise PayloadError(f"{path}: {what} is unranked ({kind}); workloads need static shapes")
    return TensorSpec(shape=(), dtype=_dtype(path, what, kind))


def _dtype(path: Path, what: str, element: Any) -> str:
    from stagegraph.mlir.bindings import ir

    simple = {ir.F64Type: "f64", ir.F32Type: "f32", ir.F16Type: "f16", ir.BF16Type: "bf16"}
    for kind, name in simple.items():
        if isinstance(element, kind):
            return name
    if isinstance(element, ir.IndexType):
        return "index"
    if isinstance(element, ir.IntegerType) and element.width in (1, 8, 16, 32, 64):
        return f"i{element.width}"
    raise PayloadError(f"{path}: {what} has element type {element}, which has no numpy dtype")


def _walk(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from _walk(child.operation)


def _count(root: Any) -> tuple[int, int]:
    """(flops, longest reduction) over the generalized linalg ops: iterations x body ops."""
    from stagegraph.mlir.bindings import ir

    flops, reduction = 0, 1
    for op in _walk(root):
        if op.name != "linalg.generic":
            continue
        generic = op.opview
        maps = [ir.AffineMapAttr(a).value for a in generic.indexing_maps]
        operands = list(generic.inputs) + list(generic.outputs)
        ranges = [1] * maps[0].n_dims
        for affine_map, operand in zip(maps, operands, strict=True):
            shape = operand.type.shape if isinstance(operand.type, ir.ShapedType) else []
            for size, expr in zip(shape, affine_map.results, strict=False):
                if isinstance(expr, ir.AffineDimExpr) and size > 0:
                    ranges[expr.position] = max(ranges[expr.position], size)
        produced = {
            e.position
            for m in maps[len(generic.inputs) :]
            for e in m.results
            if isinstance(e, ir.AffineDimExpr)
        }
        iterations = int(np.prod(ranges, dtype=np.int64))
        flops += iterations * sum(_is_flop(o.operation.name) for o in generic.regions[0].blocks[0])
        reduced = [r for d, r in enumerate(ranges) if d not in produced]
        reduction = max(reduction, int(np.prod(reduced, dtype=np.int64)))
    return flops, reduction


def _is_flop(name: str) -> bool:
    dialect, _, op = name.partition(".")
    return dialect in ("arith", "math") and op != "constant" and op not in _CAST_OPS
