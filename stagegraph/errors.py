"""Every exception stagegraph raises: one short class each, dual-inheriting a builtin.

User-facing errors derive from :class:`StagegraphError`; the CLI prints their message (one
paragraph, no traceback) and exits with code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A " (did you mean 'x'?)" suffix, or "" when nothing is close."""
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def unknown_name_message(what: str, name: str, known: Iterable[str], where: str = "") -> str:
    known = sorted(set(known))
    place = f" in {where}" if where else ""
    listing = ", ".join(known) if known else "none"
    return f"unknown {what} {name!r}{place}{did_you_mean(name, known)}; known: {listing}"


def validation_details(error: Any) -> str:
    """A pydantic ``ValidationError`` as ``loc=input: message; ...``: what the user typed and
    what is wrong with it, without pydantic's documentation URLs and type codes."""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ()))
        shown = f"{where}={item['input']!r}: " if where and "input" in item else ""
        parts.append(shown + str(item.get("msg", "")))
    return "; ".join(parts)


class StagegraphWarning(UserWarning):
    """Something the user should know that did not stop the run (the CLI prints it as
    ``warning: ...`` on stderr), e.g. a corrupt cache entry that was ignored."""


class StagegraphError(Exception):
    """Base of all errors meant for users."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class GraphError(StagegraphError):
    """A graph is malformed."""


class DuplicateStageError(GraphError, ValueError):
    """Two stages (or a stage and a graph input) share a name."""


class CycleError(GraphError, ValueError):
    """The edges form a cycle."""


class UnconnectedPortError(GraphError, ValueError):
    """A required input port has no edge."""


class DoublyConnectedPortError(GraphError, ValueError):
    """An input port has more than one edge."""


class PortTypeError(GraphError, TypeError):
    """An edge connects ports of incompatible types."""


class UnknownStageError(GraphError, KeyError):
    """A name that is not a stage of the graph (or not a registered factory)."""


class UnknownPortError(GraphError, KeyError):
    """A port name a stage does not have."""


class UnknownTagError(GraphError, KeyError):
    """A tag no stage of the graph carries."""


class AmbiguousTagError(GraphError, ValueError):
    """A tag carried by several stages where one was needed."""


class EmptyGraphError(GraphError, ValueError):
    """A graph without stages."""


class InvalidGraphError(GraphError, ValueError):
    """Several problems at once; ``problems`` holds each one."""

    def __init__(self, graph: str, problems: list[GraphError]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"graph {graph!r} has {len(problems)} problems:\n{lines}")


class SpliceError(GraphError, ValueError):
    """A wrapper cannot follow the stage at the requested splice tag (e.g. LLVM level)."""


class GraphFileError(GraphError, ValueError):
    """A graph file cannot be read or does not match the schema."""


class UnknownGraphError(StagegraphError, KeyError):
    """A graph name that is neither in graphs/ nor a file."""


class StageDefinitionError(StagegraphError, TypeError):
    """A stage function or class is declared wrongly (missing hints, bad kind)."""


class StageOutputError(StageDefinitionError):
    """A stage returned a value that is not of its output port's type (None, a str...)."""


class DuplicateNameError(StageDefinitionError, ValueError):
    """A second, different stage, graph, workload or cost model under a name already taken.

    Every registry refuses it the same way, so a plugin can never silently replace a built-in
    (or another plugin's) definition; re-running the same code (a re-import) is no clash.
    """


class PluginError(StagegraphError, ImportError):
    """A plugin (``--plugin``, ``STAGEGRAPH_PLUGINS`` or an entry point) could not be loaded."""


class ConfigError(StagegraphError, ValueError):
    """A stage config or a params override does not validate."""


class StageFailed(StagegraphError, RuntimeError):
    """A stage raised while running; carries the MLIR diagnostics and the reproducer path."""

    def __init__(
        self,
        graph: str,
        stage: str,
        reason: str,
        diagnostics: list[str] | None = None,
        reproducer: str | None = None,
    ) -> None:
        self.graph, self.stage, self.reason = graph, stage, reason
        self.diagnostics = diagnostics or []
        self.reproducer = reproducer
        text = f"stage {stage!r} of graph {graph!r} failed: {reason}"
        if self.diagnostics:
            text += "\nMLIR diagnostics:\n" + "\n".join(f"  {d}" for d in self.diagnostics)
        if reproducer:
            text += f"\nreproducer: {reproducer}"
        super().__init__(text)


class PayloadError(StagegraphError, ValueError):
    """A payload the project cannot handle (malformed, dynamic shapes, unsupported dtype)."""


class UnsupportedPayloadError(PayloadError):
    """The payload is outside what stagegraph can lower (dynamic shapes, dtypes, no entry)."""


class UnregisteredOpError(UnsupportedPayloadError):
    """The payload uses an op of a dialect these MLIR bindings do not register."""

    def __init__(self, message: str, op_name: str, dialect: str) -> None:
        super().__init__(message)
        self.op_name = op_name
        self.dialect = dialect

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across executor processes
        return type(self), (str(self), self.op_name, self.dialect)


class EmitError(StagegraphError, ValueError):
    """A module cannot be turned into a binary (wrong IR level, toolchain failure)."""


class LoweringIncompleteError(StagegraphError, ValueError):
    """A module meant to be at the LLVM level still holds ops of other dialects."""


class ToolchainError(StagegraphError, RuntimeError):
    """The system linker is missing or failed."""


class SignatureError(StagegraphError, ValueError):
    """An entry point's signature is missing, unsupported, or does not match the arguments."""


class WrapperError(StagegraphError, ValueError):
    """The benchmark wrapper cannot be built around a function."""


class ShardingError(StagegraphError, ValueError):
    """The ``shard`` ops of a module could not all be lowered."""


class OpenMPRuntimeNotFound(StagegraphError, RuntimeError):
    """No OpenMP runtime with the ``__kmpc_*`` ABI is installed."""


class BaselineError(StagegraphError, RuntimeError):
    """A tuning run's baseline params do not compile or verify: nothing can be compared."""


class WorkloadError(StagegraphError, ValueError):
    """A workload spec that does not resolve (unknown name, bad parameter)."""


class UnknownWorkloadError(WorkloadError, KeyError):
    """A workload name (or .mlir path) that resolves to nothing."""


class WorkloadParamError(WorkloadError):
    """A workload parameter that is unknown or has an invalid value."""


class InsufficientMemoryError(WorkloadError, MemoryError):
    """The workload's buffers cannot fit in the memory this process may use."""


class ReferenceUnavailableError(StagegraphError, RuntimeError):
    """No reference result: no ``.npz`` beside the file and no reference runner installed."""


class ReferenceFailedError(StagegraphError, RuntimeError):
    """The reference (another graph's code) could not be computed: not the graph under test."""


class VerificationError(StagegraphError, ValueError):
    """Outputs that do not match the workload's reference."""


def restore_exception(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    """Rebuild an exception from its args and ``__dict__`` without calling its ``__init__``.

    Unpickling calls ``cls(*args)``, which fails for classes whose ``__init__`` takes other
    arguments than the message (e.g. :class:`StageFailed`); this is the pickle-safe path.
    """
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class IsolatedFailure(StagegraphError, RuntimeError):
    """A call run in a child process died of a signal, timed out, ran out of memory or raised.

    ``reason`` is ``"signal"``, ``"timeout"``, ``"memory"``, ``"exception"`` or ``"exit"``
    (the child exited without a result); the other fields say more, ``stderr_tail`` holds the
    end of the child's captured stderr (MLIR/LLVM messages, faulthandler traceback).
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        label: str = "",
        signal: str | None = None,
        timeout_s: float | None = None,
        memory_bytes: int | None = None,
        exitcode: int | None = None,
        exc_type: str | None = None,
        exc_message: str | None = None,
        child_traceback: str = "",
        stderr_tail: str = "",
    ) -> None:
        self.reason, self.detail, self.label, self.signal = reason, detail, label, signal
        self.timeout_s, self.memory_bytes, self.exitcode = timeout_s, memory_bytes, exitcode
        self.exc_type, self.exc_message = exc_type, exc_message
        self.child_traceback, self.stderr_tail = child_traceback, stderr_tail
        text = f"isolated call{f' {label!r}' if label else ''} failed ({reason}): {detail}"
        lines = stderr_tail.strip().splitlines()[-12:]
        if lines:
            text += "\nchild stderr (tail):\n" + "\n".join(f"  {line}" for line in lines)
        super().__init__(text)

    def __reduce__(self) -> tuple:
        return (restore_exception, (type(self), self.args, self.__dict__))


class MpiError(StagegraphError, RuntimeError):
    """A multi-rank (MPI) run cannot start or did not finish."""


class MpiUnavailableError(MpiError):
    """MPICH (the ``mpich`` wheel) or ``mpi4py`` is not installed."""


class RanksMismatchError(MpiError, ValueError):
    """``--ranks`` differs from the number of devices in the workload's grid."""


class RankFailedError(MpiError):
    """A rank raised or died; the message carries that rank's error."""


class MpiTimeoutError(MpiError, TimeoutError):
    """The ranks did not finish within the timeout; the job was killed."""


class UnknownTargetError(StagegraphError, KeyError):
    """A ``--target`` name that is neither ``host``, an x86-64 level nor a known CPU."""


class TargetNotRunnableError(StagegraphError, RuntimeError):
    """Code built for a target whose ISA features this host lacks (it would die of SIGILL)."""


class PeerUnavailableError(StagegraphError, ImportError):
    """A peer compiler (``--vs iree``) whose optional packages are not installed."""


class TorchUnavailableError(StagegraphError, ImportError):
    """A PyTorch feature (a ``.py`` workload, ``sg.compile``, ``--vs torch``) without the
    ``torch`` extra installed."""


class PeerCompileError(StagegraphError, RuntimeError):
    """A peer compiler rejected the payload."""


class UnknownCostModelError(StagegraphError, KeyError):
    """A ``--cost-model`` name that is not registered."""


class UnknownNameError(StagegraphError, KeyError):
    """A name no registry of its kind holds (the kinds without an error of their own:
    stage-library modules, peers, artifact kinds, ...)."""


class EmptySearchSpaceError(StagegraphError, ValueError):
    """The tuning constraints admit no parameters; ``conflicts`` names the clashing ones."""

    def __init__(self, message: str, conflicts: list[str] | None = None) -> None:
        self.conflicts = list(conflicts or [])
        super().__init__(message)


class ClusterUnreachableError(StagegraphError, ConnectionError):
    """``--cluster`` names a Dask scheduler that cannot be reached (or a bad address)."""


class TuneDBError(StagegraphError, RuntimeError):
    """The tuning database cannot be opened, read or written."""


class ArtifactError(StagegraphError, ValueError):
    """An artifact folder cannot be used: a missing or unreadable file, a manifest of another
    schema version or kind, or inputs that do not match what the manifest declares."""


class GpuUnavailableError(StagegraphError, RuntimeError):
    """The GPU graph's code needs an NVIDIA GPU (``--target cuda``, ``run``, ``bench``) and
    this machine has none (no driver, or no device): compile or emit it instead."""


class CudaError(StagegraphError, RuntimeError):
    """A CUDA driver call returned an error code (named in the message)."""


class PtxError(StagegraphError, RuntimeError):
    """A kernel's PTX could not be produced (LLVM) or assembled (ptxas)."""
