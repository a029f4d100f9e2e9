"""A PyTorch model as a workload: imported with torch-mlir's FX importer, checked against
eager PyTorch on the same inputs.

The import happens on first use (the first stage that asks for the payload, its inputs or
its reference), so it runs where compiles run: in the ``--isolate`` child, under the
compile time limit. It exports the model (``torch.export``), lowers it to linalg on tensors
(:mod:`stagegraph.mlir.torch_import`), runs the model eagerly on the same inputs, and writes
the ``.mlir`` and an ``.npz`` (``in0..``; updated buffers ``mut0..`` then outputs
``out0..``, the layout of ``../shared/kernelbench``) to a private directory; from there the
:class:`~stagegraph.workload.mlir_file.MlirFileWorkload` of that file serves the payload,
inputs, reference and costs. A model in training mode that updates buffers (BatchNorm's
running statistics) returns them as extra results, which are verified like the outputs.
Dropout modules are put in eval mode: a random mask cannot be verified.
"""

from __future__ import annotations

import copy
import functools
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stagegraph.errors import PayloadError
from stagegraph.workload.base import Complexity, TensorSpec, Workload, WorkloadParams
from stagegraph.workload.torch_eager import (
    eager_arrays,
    export,
    register_tensor_attributes,
    updated_inputs,
)
from stagegraph.workload.torch_source import (
    TorchProblem,
    load_factory,
    load_problem_file,
    parse_value,
    require_torch,
)

if TYPE_CHECKING:
    from stagegraph.mlir.bindings import ir
    from stagegraph.workload.mlir_file import MlirFileWorkload


@dataclass(frozen=True)
class ProblemFile:
    """``FILE.py[:name=value,...]``: overrides kept as written (``16x1x1``)."""

    path: str
    overrides: tuple[tuple[str, str], ...] = ()

    def load(self, seed: int) -> TorchProblem:
        values = {}
        for name, text in self.overrides:
            try:
                values[name] = parse_value(text)
            except ValueError as exc:
                from stagegraph.errors import WorkloadParamError

                raise WorkloadParamError(f"{self.path}: {name}={exc}") from None
        return load_problem_file(Path(self.path), values, seed)

    def spec(self, seed: int) -> str:
        items = [f"{k}={v}" for k, v in self.overrides] + ([f"seed={seed}"] if seed else [])
        return f"{self.path}:{','.join(items)}" if items else self.path


@dataclass(frozen=True)
class Factory:
    """``package.module:factory``."""

    target: str

    def load(self, seed: int) -> TorchProblem:
        return load_factory(self.target, seed)

    def spec(self, seed: int) -> str:
        return self.target


@dataclass(frozen=True)
class Live:
    """A model object and its example inputs (``sg.from_torch``)."""

    problem: TorchProblem = field(compare=False)

    def load(self, seed: int) -> TorchProblem:
        """A copy of the model: putting its dropout in eval mode must not touch the caller's."""
        problem = self.problem
        return TorchProblem(copy.deepcopy(problem.model), problem.inputs, problem.what)

    def spec(self, seed: int) -> str:
        return f"torch:{type(self.problem.model).__name__}"


class TorchWorkload(Workload):
    """A PyTorch model and its inputs (see the module docstring)."""

    name = "torch"
    Params = WorkloadParams

    def __init__(self, source: ProblemFile | Factory | Live, /, **values: Any) -> None:
        super().__init__(**values)
        self.source = source
        stem = Path(source.path).stem if isinstance(source, ProblemFile) else None
        self.name = stem or self.spec.rpartition(":")[2].removesuffix("()")

    @property
    def spec(self) -> str:
        return self.source.spec(self.params.seed)

    def __reduce__(self) -> tuple[Any, ...]:
        options = self.params.model_dump(exclude_defaults=True)
        return (functools.partial(TorchWorkload, self.source, **options), ())

    # -- the PyTorch side
    @functools.cached_property
    def problem(self) -> TorchProblem:
        """The model (dropout in eval mode) and inputs, built once."""
        torch = require_torch(f"the workload {self.spec}")
        problem = self.source.load(self.params.seed)
        if not isinstance(problem.model, torch.nn.Module):
            raise PayloadError(f"{problem.what}: is a {type(problem.model).__name__}, not a "
                               f"torch.nn.Module")  # fmt: skip
        for module in problem.model.modules():
            if isinstance(module, torch.nn.modules.dropout._DropoutNd):
                module.eval()
            register_tensor_attributes(module)
        return problem

    def torch_model(self) -> Any:
        """A fresh copy of the model in its state before any call (for a peer's runs).

        Copied from ``problem.model`` itself, which stays as it was: the workload never
        runs it (``torch.export`` traces it with fake tensors, buffers untouched; the
        eager reference runs a copy), so no second pristine copy of the weights is kept
        for the whole run (VGG-16: 528 MiB)."""
        return copy.deepcopy(self.problem.model)

    def torch_inputs(self) -> list[Any]:
        return list(self.problem.inputs)

    def verify_outputs(
        self, outputs: list[np.ndarray], expected: list[np.ndarray] | None = None
    ) -> Any:
        """The :class:`~stagegraph.workload.verify.Verdict` of a model's own outputs (no
        updated buffers) against ``expected`` (default: the reference's outputs), by the
        workload's tolerances."""
        from stagegraph.workload.verify import compare

        mutated = self.mutated
        return compare(
            outputs,
            expected if expected is not None else list(self.reference())[mutated:],
            self.output_specs()[mutated:],
            reduction_length=self.reduction_length,
            magnitudes=self.magnitudes()[mutated:],
            who=self.spec,
        )

    # -- the imported payload
    @functools.cached_property
    def imported(self) -> MlirFileWorkload:
        """The ``.mlir`` + ``.npz`` of the import, as a file workload (imported on first use).

        Raises:
            PayloadError: ``torch.export`` or torch-mlir cannot take the model (the message
                names the op), or the eager run fails.
        """
        from stagegraph.mlir.torch_import import import_program_to
        from stagegraph.workload.mlir_file import MlirFileWorkload

        problem = self.problem
        program = export(problem)
        folder = Path(tempfile.mkdtemp(prefix=f"stagegraph-torch-{self.name}-"))
        weakref.finalize(self, shutil.rmtree, folder, True)
        path = folder / f"{self.name}.{_payload_suffix()}"
        signature = import_program_to(program, problem.what, path)
        del program  # its decomposed copy of the weights: not needed for the eager run
        arrays, self._output_tree = eager_arrays(self.torch_model(), problem, signature)
        self._mutations = updated_inputs(signature)
        np.savez(path.with_suffix(".npz"), **arrays)
        try:
            return MlirFileWorkload(path)
        except PayloadError:
            raise
        except Exception as exc:  # the bindings' MLIRError: an op stagegraph cannot parse
            raise PayloadError(
                f"{problem.what}: the module torch-mlir imported does not load: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            ) from None

    def prepare(self) -> None:
        """Import now (a Session calls it before the first stage, under the compile time
        limit; otherwise the first use imports)."""
        self.imported  # noqa: B018

    @property
    def mutated(self) -> int:
        """How many results (the first) are buffers the model updates, not its outputs."""
        return len(self.mutations)

    @property
    def mutations(self) -> list[int | None]:
        """Per updated-buffer result, the input it updates in place (an index of the
        inputs), or None for a buffer of the model (frozen into the payload)."""
        self.imported  # noqa: B018 -- imports on first use
        return self._mutations

    @property
    def output_tree(self) -> Any:
        """The structure of the model's output (a pytree spec: a tensor, a tuple, ...)."""
        self.imported  # noqa: B018 -- imports on first use
        return self._output_tree

    def save_payload(self, directory: str | Path) -> list[Path]:
        """Write ``<name>.mlir`` and ``<name>.npz`` to ``directory`` (runs without PyTorch)."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        text = folder / f"{self.name}.mlir"
        if self.imported.path.suffix == ".mlir":
            shutil.copyfile(self.imported.path, text)
        else:  # imported as bytecode: saved as text, for any MLIR tool to read
            with open(text, "w") as file:
                self.imported.payload().operation.print(file=file)
        npz = self.imported.npz_path
        return [text, Path(shutil.copyfile(npz, folder / npz.name))]

    # -- the Workload interface, served by the imported file
    def payload(self, context: ir.Context | None = None) -> ir.Module:
        return self.imported.payload(context)

    def input_specs(self) -> list[TensorSpec]:
        return self.imported.input_specs()

    def output_specs(self) -> list[TensorSpec]:
        return self.imported.output_specs()

    def _generate_inputs(self) -> list[np.ndarray]:
        return list(self.imported.inputs())

    def _compute_reference(self) -> list[np.ndarray]:
        return list(self.imported.reference())

    @property
    def reduction_length(self) -> int:
        return self.imported.reduction_length

    @property
    def complexity(self) -> Complexity:
        return self.imported.complexity


# ---------------------------------------------------------------- specs


def _payload_suffix() -> str:
    """The imported payload's file type: bytecode where stagegraph reads it with the
    importer's own MLIR (torch-mlir's bindings), else text (another MLIR may not read
    the importer's bytecode)."""
    from stagegraph.mlir.bindings import ROOT

    return "mlirbc" if ROOT == "torch_mlir" else "mlir"


def parse_problem_spec(text: str) -> TorchWorkload:
    """``FILE.py[:name=value,...,seed=N]``: names and values are checked here, before
    anything imports torch (the file is parsed, not run).

    Raises:
        UnknownWorkloadError: no such file.
        WorkloadParamError: ``key=value`` malformed or repeated, an unknown constant, or a
            value that is no integer, float or ``AxB`` tuple.
    """
    import ast

    from stagegraph.errors import UnknownWorkloadError, WorkloadParamError
    from stagegraph.workload.torch_source import apply_overrides

    path, _, rest = text.partition(":")
    if not Path(path).is_file():
        raise UnknownWorkloadError(f"PyTorch problem file workload: no such file {path!r}")
    overrides: dict[str, str] = {}
    seed = 0
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise WorkloadParamError(f"workload {path!r}: expected name=value, got {item!r}")
        if key in overrides or (key == "seed" and seed):
            raise WorkloadParamError(f"workload {path!r}: {key!r} given twice")
        try:
            parsed = parse_value(value)
        except ValueError as exc:
            raise WorkloadParamError(f"workload {path!r}: {key}={exc}") from None
        if key == "seed":
            if not isinstance(parsed, int) or parsed < 0:
                raise WorkloadParamError(f"workload {path!r}: seed must be an integer >= 0")
            seed = parsed
        else:
            overrides[key] = value
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except SyntaxError as exc:
        raise PayloadError(f"{path}:{exc.lineno}: {exc.msg}") from None
    apply_overrides(tree, {k: parse_value(v) for k, v in overrides.items()}, path)
    return TorchWorkload(ProblemFile(path, tuple(overrides.items())), seed=seed)


def parse_factory_spec(text: str) -> TorchWorkload:
    """``package.module:factory``; the module must be findable (it is imported, and the
    factory called, where the workload is first used).

    Raises:
        UnknownWorkloadError: no such module.
    """
    import importlib.util

    from stagegraph.errors import UnknownWorkloadError

    module = text.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UnknownWorkloadError(
            f"no workload named {module!r}, and no module {module!r} to call "
            f"{text.partition(':')[2]!r} from (a package.module:factory spec)"
        )
    return TorchWorkload(Factory(text))


def from_torch(model: Any, example_inputs: Any) -> TorchWorkload:
    """The workload of a model object and its example inputs (a tensor or a sequence)."""
    require_torch("stagegraph.from_torch")
    inputs = list(example_inputs) if isinstance(example_inputs, list | tuple) else [
        example_inputs
    ]  # fmt: skip
    return TorchWorkload(Live(TorchProblem(model, inputs, f"{type(model).__name__}")))


def check_savable(workload: Workload) -> None:
    """Refuse ``--save-payload`` for a workload that was not imported from PyTorch.

    Raises:
        ConfigError: the workload is no :class:`TorchWorkload`.
    """
    if not isinstance(workload, TorchWorkload):
        from stagegraph.errors import ConfigError

        raise ConfigError(
            f"--save-payload writes the payload imported from a PyTorch model (FILE.py or "
            f"package.module:factory); {workload.spec} is already an MLIR payload"
        )
