"""The Workload interface: a payload with its inputs, a reference result, a verifier and
its cost. Importing it does not import MLIR: payload builders import the bindings when
called.
"""

from __future__ import annotations

import contextlib
import tempfile
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, ValidationError

from stagegraph.core.ports import Schema
from stagegraph.dtypes import decode, is_float, to_bf16
from stagegraph.errors import WorkloadParamError, did_you_mean
from stagegraph.workload.tensors import TensorSpec
from stagegraph.workload.verify import Verdict, compare, rms, tolerances

if typing.TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir


# ---------------------------------------------------------------- schemas


class Complexity(Schema):
    """Work of one run: arithmetic operations and compulsory memory traffic (args + results)."""

    flops: int
    bytes_moved: int

    @property
    def intensity(self) -> float:
        """Flops per byte (roofline x-axis)."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0


ReferenceKind = Literal["npz", "pytorch", "numpy", "graph", "none"]
"""Where a workload's reference result comes from: arrays stored beside the payload, eager
PyTorch, numpy (Python workloads, float64), another graph's compiled code (``graph:NAME``
in reports), or nowhere (``none``: outputs are not verified)."""


class WorkloadParams(Schema):
    """Parameters shared by every workload; subclasses add shapes and dtypes with defaults."""

    seed: int = Field(0, ge=0, description="seed of the input generator")


# ---------------------------------------------------------------- inputs


def random_array(rng: np.random.Generator, spec: TensorSpec, scale: float = 1.0) -> np.ndarray:
    """Uniform values in [-scale, scale) (floats), [0, 8) (ints) or booleans, read-only."""
    if is_float(spec.dtype):
        values = rng.uniform(-scale, scale, spec.shape)
        array = to_bf16(values) if spec.dtype == "bf16" else values.astype(spec.numpy_dtype)
    elif spec.dtype == "i1":
        array = rng.integers(0, 2, spec.shape).astype(np.bool_)
    else:
        array = rng.integers(0, 8, spec.shape).astype(spec.numpy_dtype)
    return _frozen(np.require(array, requirements="C"))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


# ---------------------------------------------------------------- the interface


class Workload:
    """A payload plus everything needed to run, check and rate it.

    Subclasses set ``name`` and ``Params`` and implement :meth:`build`, :meth:`input_specs`,
    :meth:`output_specs`, :meth:`_generate_inputs`, :meth:`_compute_reference` and
    :attr:`complexity`. Inputs and the reference are computed once and cached (read-only) so
    that a tuner can reuse them for thousands of runs; leaving a :meth:`session` drops them.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[WorkloadParams]] = WorkloadParams
    entry: str = "main"
    #: Computes the outputs of a workload that has no stored reference (the session sets
    #: it to the naive graph: differential testing); ``None``: no such reference.
    reference_runner: Callable[[Workload], list[np.ndarray]] | None = None
    #: The user chose the runner (``--reference GRAPH``): it replaces the stored reference.
    prefer_runner: bool = False
    #: Where :meth:`_compute_reference` gets its result (a PyTorch workload sets "pytorch").
    reference_kind: ClassVar[ReferenceKind] = "numpy"

    def __init__(self, params: WorkloadParams | None = None, /, **values: Any) -> None:
        if params is None:
            try:
                params = self.Params(**values)
            except ValidationError as error:
                raise _param_error(self.name, self.Params, error, values) from None
        elif values:
            raise TypeError("pass either a Params object or keyword values, not both")
        self.params = params
        self._inputs: list[np.ndarray] | None = None
        self._reference: list[np.ndarray] | None = None
        self._magnitudes: list[float] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._depth = 0

    # -- identity
    @property
    def spec(self) -> str:
        """Canonical ``NAME:key=value,...`` with every parameter (``seed`` last)."""
        data = self.params.model_dump()
        data["seed"] = data.pop("seed")
        return f"{self.name}:" + ",".join(f"{k}={_format(v)}" for k, v in data.items())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as class + params only: caches are rebuilt (deterministically) on the far side."""
        return (type(self), (self.params,))

    # -- payload
    def payload(self, context: ir.Context | None = None) -> ir.Module:
        """A fresh module (entry ``self.entry``) built in ``context`` (a new one if omitted)."""
        from stagegraph.mlir.bindings import ir, new_context

        context = context or new_context()
        with context, ir.Location.unknown(context):
            return self.build()

    def build(self) -> ir.Module:
        """Build the payload; called inside the target context with a default location."""
        raise NotImplementedError

    def input_specs(self) -> list[TensorSpec]:
        raise NotImplementedError

    def output_specs(self) -> list[TensorSpec]:
        raise NotImplementedError

    # -- data
    def inputs(self) -> list[np.ndarray]:
        """The entry's arguments, generated once from ``seed`` (read-only arrays)."""
        if self._inputs is None:
            self._inputs = [
                _frozen(np.require(a, requirements="C")) for a in self._generate_inputs()
            ]
        return self._inputs

    def reference(self) -> list[np.ndarray]:
        """Expected results (float64 for float outputs unless read from a file), cached."""
        if self._reference is None:
            if self.prefer_runner and self.reference_runner is not None:
                computed = self.reference_runner(self)
            else:
                computed = self._compute_reference()
            self._reference = [_frozen(np.asarray(a)) for a in computed]
        return self._reference

    @property
    def reference_source(self) -> str:
        """Where :meth:`reference` comes from: ``npz``, ``pytorch``, ``numpy``,
        ``graph:NAME`` or ``none`` (what reports print)."""
        if self.prefer_runner and self.reference_runner is not None:
            return runner_source(self.reference_runner)
        return self.reference_kind

    def empty_outputs(self) -> list[np.ndarray]:
        """Fresh zeroed arrays for the results (out-parameters after bufferization)."""
        return [np.zeros(s.shape, s.numpy_dtype) for s in self.output_specs()]

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng(self.params.seed)

    def _generate_inputs(self) -> list[np.ndarray]:
        rng = self._rng()
        return [random_array(rng, spec) for spec in self.input_specs()]

    def _compute_reference(self) -> list[np.ndarray]:
        raise NotImplementedError

    # -- checking and cost
    @property
    def reduction_length(self) -> int:
        """Longest chain of accumulated terms per output element; widens the tolerance."""
        return 1

    def tolerance(self, spec: TensorSpec) -> float:
        """Elementwise tolerance for one output: 0 for integers, ~u*sqrt(reduction) for floats.

        Errors are measured relative to ``|ref| + S``, where the scale ``S`` is the larger of
        the output's RMS and :meth:`magnitudes`; see :mod:`stagegraph.workload.verify`.
        """
        return tolerances(spec.dtype, self.reduction_length)[1]

    def magnitudes(self) -> list[float]:
        """Per output, the magnitude of the values that produced it (cached per session).

        It is the floor of the scale an output's rounding errors are judged against, so that
        an output made tiny by cancellation (the mean of normalized values) is judged by the
        size of what cancelled. The default is the largest RMS of the float inputs: what a
        payload adds, subtracts or normalizes is usually of that order (normalized
        activations are O(1), like the inputs). A payload that scales its inputs down by
        orders of magnitude would get too loose a floor and should override this, as should
        a workload that knows better (:class:`~stagegraph.workloads.matmul.Matmul` does).
        """
        if self._magnitudes is None:
            pairs = zip(self.inputs(), self.input_specs(), strict=False)
            floor = max(
                (rms(decode(a, s.dtype)) for a, s in pairs if is_float(s.dtype)), default=0.0
            )
            self._magnitudes = [floor] * len(self.output_specs())
        return self._magnitudes

    def verify(self, outputs: Sequence[np.ndarray]) -> Verdict:
        """Compare ``outputs`` with :meth:`reference` (count, shape, dtype, then values)."""
        return compare(
            list(outputs),
            self.reference(),
            self.output_specs(),
            reduction_length=self.reduction_length,
            magnitudes=self.magnitudes(),
            who=self.spec,
        )

    @property
    def specialization(self) -> dict[str, list[int]]:
        """Static shapes given at load time to arguments/results declared with dynamic sizes
        (``{"argument 0": [4, 8]}``); empty for workloads built with static shapes."""
        return {}

    @property
    def complexity(self) -> Complexity:
        raise NotImplementedError

    @property
    def requirements(self) -> list[str]:
        """Shared libraries the compiled payload needs at run time."""
        return []

    def numpy_equivalent(self) -> Callable[..., list[np.ndarray]] | None:
        """The same computation in numpy, called on :meth:`inputs` (for ``--vs numpy``)."""
        return None

    # -- run-time resources
    def scratch_dir(self) -> Path:
        """A temporary directory that lives until the outermost session ends."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix=f"stagegraph-{self.name}-")
        return Path(self._scratch.name)

    def __enter__(self) -> Workload:
        self._depth += 1
        self.inputs()
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.release()

    @contextlib.contextmanager
    def session(self) -> Iterator[Workload]:
        """``with workload.session() as w:`` keeps inputs cached; releases them afterwards."""
        with self:
            yield self

    def release(self) -> None:
        """Drop cached arrays and the scratch directory (they are rebuilt on demand)."""
        self._inputs = self._reference = self._magnitudes = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def runner_source(runner: Callable[..., Any]) -> str:
    """``graph:NAME`` for a runner that names the graph it compiles with (its ``graph``
    attribute), else the runner's name."""
    graph = getattr(runner, "graph", None)
    return f"graph:{graph}" if graph else getattr(runner, "__name__", "runner")


def _format(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "-".join(str(v) for v in value)
    return str(value)


def _param_error(
    name: str, params: type[WorkloadParams], error: ValidationError, values: dict[str, Any]
) -> WorkloadParamError:
    first = error.errors()[0]
    key = str(first["loc"][0]) if first["loc"] else "?"
    if first["type"] == "extra_forbidden":
        hint = did_you_mean(key, params.model_fields)
        return WorkloadParamError(f"workload {name!r} has no parameter {key!r}{hint}")
    raw = values.get(key, first.get("input"))
    shown = _format(raw) if isinstance(raw, list) else raw
    expected = _describe(params, key)
    return WorkloadParamError(
        f"workload {name!r}: invalid value {shown!r} for parameter {key!r}: {first['msg']} "
        f"(expected {expected})"
    )


def _describe(params: type[WorkloadParams], key: str) -> str:
    """Human description of a field's type and range, e.g. ``int > 0``."""
    field = params.model_fields.get(key)
    if field is None:
        return "a known parameter"
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (list, tuple):
        item = typing.get_args(annotation)[0]
        inner = getattr(typing.get_origin(item), "__name__", None) or getattr(item, "__name__", "")
        if typing.get_origin(item) is typing.Annotated:
            inner = typing.get_args(item)[0].__name__ + _bounds(typing.get_args(item)[1:])
        return f"a list of {inner} joined by '-', e.g. 64-128"
    text = getattr(annotation, "__name__", str(annotation))
    return text + _bounds(field.metadata)


def _bounds(metadata: Sequence[Any]) -> str:
    parts = []
    for item in metadata:
        for attr in getattr(item, "metadata", [item]):
            for op, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                bound = getattr(attr, op, None)
                if bound is not None:
                    parts.append(f"{symbol} {bound}")
    return (" " + " and ".join(parts)) if parts else ""
