"""Port types: what flows along the edges of a stage graph.

A port type is a Python class, so it can be written as a type hint on a stage function:
``Module["tensor"]`` (an IR module at one level), a subclass of :class:`Params` (what a cost
model produces and a schedule consumes), a subclass of :class:`Facts` (analysis results), or
:class:`Binary` (an emitted executable artifact).
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

LEVELS = ("tensor", "buffer", "llvm", "any")


class Schema(BaseModel):
    """Base of every schema in the project: frozen, no unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def content_hash(self) -> str:
        """Stable hash of the class and its values (part of cache keys)."""
        data = f"{type(self).__module__}.{type(self).__qualname__}:{self.model_dump_json()}"
        return hashlib.sha256(data.encode()).hexdigest()


class Params(Schema):
    """A parameter dict produced by a cost model and consumed by a schedule."""


class Facts(Schema):
    """Results of analysing a payload (or the machine)."""


class Config(Schema):
    """A stage's configuration (the empty config is the default).

    Optional hooks let a config refine its stage instance: :meth:`port_levels` gives
    the IR levels of the stage's ``Module["any"]`` ports (a generic pass pipeline knows
    from its passes what it takes and gives), :meth:`check_for` checks values against the
    factory (keys of the params model a cost model produces).
    """

    def port_levels(self) -> tuple[str | None, str | None]:
        """IR levels (taken, given) that replace ``any`` on this instance's module ports."""
        return None, None

    def check_for(self, factory: Any) -> None:
        """Raise ``ValueError`` when the config does not fit ``factory`` (default: fits)."""

    def static_problems(self) -> list[str]:
        """What is wrong with the config that can be known before any payload runs (a pass
        pipeline that does not parse, a schedule file that is missing): ``validate`` reports
        these. Slower than :meth:`check_for` (it may parse), so only ``validate`` asks."""
        return []

    @classmethod
    def schema_for(cls, factory: Any, schema: dict[str, Any]) -> dict[str, Any]:
        """This config's JSON Schema for ``factory`` (what :meth:`check_for` checks, as far
        as a schema can say it); the default is ``schema`` unchanged."""
        return schema


#: Marks a config field holding a file path: a graph file resolves it relative to its own
#: folder (``file: schedule.mlir`` next to ``graph.yaml``), as ``Annotated[str, GRAPH_PATH]``.
GRAPH_PATH = "stagegraph:graph-relative-path"


class Module:
    """An MLIR module at an IR level; ``Module["buffer"]`` is the port type for that level.

    Instances carry the bindings' ``ir.Module`` in ``.ir``; they never cross process
    boundaries (use :meth:`text` or bytecode for that).
    """

    level: ClassVar[str] = "any"
    _by_level: ClassVar[dict[str, type[Module]]] = {}

    def __init__(self, module: Any, level: str | None = None) -> None:
        self.ir = module
        self.level = level or type(self).level

    def __class_getitem__(cls, level: str) -> type[Module]:
        if level not in LEVELS:
            raise TypeError(f"unknown IR level {level!r}; levels are {', '.join(LEVELS)}")
        if level not in cls._by_level:
            cls._by_level[level] = type(f"Module[{level}]", (Module,), {"level": level})
        return cls._by_level[level]

    def text(self) -> str:
        """The module as MLIR assembly (for hashing, dumping and process boundaries)."""
        return str(self.ir)

    def bytecode(self) -> bytes:
        """The module as MLIR bytecode: what hashes, snapshots and copies are made of.

        Writing bytecode is several times faster than printing assembly (the engine hashes
        every stage's output and the reproducer hook snapshots every stage's input: as text
        that was a fifth of an unrolled LSTM's compile), and dense constants stay raw bytes
        instead of becoming hex text.
        """
        buffer = io.BytesIO()
        self.ir.operation.write_bytecode(buffer)
        return buffer.getvalue()

    def content_hash(self) -> str:
        """Hash of the module's bytecode (equal modules write equal bytecode), hashed as it
        is written: a model's weights are not held a second time for it."""
        from stagegraph.mlir.digest import bytecode_digest

        return bytecode_digest(self.ir).hexdigest()

    def clone(self) -> Module:
        """A deep copy in the same context, for a second stage that mutates the module.

        Round-trips through bytecode: ``Operation.clone`` would give a ``ModuleOp``, which
        the execution engine and other ``ir.Module`` APIs do not accept.
        """
        from stagegraph.errors import PayloadError

        try:
            copy = type(self.ir).parse(self.bytecode(), self.ir.context)
        except Exception as error:  # the bindings' MLIRError: the module does not round-trip
            raise PayloadError(
                "the payload cannot be copied for a second stage (its bytecode does not parse "
                f"back: {str(error).splitlines()[0]}); a tensor with a dimension of 0 is the "
                "usual cause"
            ) from None
        return type(self)(copy, self.level)

    def __repr__(self) -> str:
        return f"<Module level={self.level}>"


class Binary:
    """An emitted executable artifact (a JIT engine, an object file or a shared library).

    Subclasses know how to call the entry points; ``content_hash`` identifies what was built.
    """

    def __init__(self, key: str) -> None:
        self.key = key

    def content_hash(self) -> str:
        return self.key


class WorkloadRef:
    """The workload a graph compiles, as a graph input (its inputs, reference and checks),
    for stages that run the binary: verification and measurement."""

    def __init__(self, workload: Any) -> None:
        self.workload = workload

    def content_hash(self) -> str:
        return hashlib.sha256(str(self.workload.spec).encode()).hexdigest()


def port_name(port_type: type) -> str:
    """Human-readable name of a port type, used in errors, DOT labels and graph files."""
    if isinstance(port_type, type) and issubclass(port_type, Module):
        return f"Module[{port_type.level}]"
    return getattr(port_type, "__qualname__", repr(port_type))


def is_port_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(
        annotation, Module | Params | Facts | Binary | WorkloadRef
    )


def compatible(produced: type, expected: type) -> bool:
    """Can a value of type ``produced`` flow into a port expecting ``expected``?"""
    if issubclass(produced, Module) and issubclass(expected, Module):
        return "any" in (produced.level, expected.level) or produced.level == expected.level
    return issubclass(produced, expected)


TensorModule = Module["tensor"]
BufferModule = Module["buffer"]
LLVMModule = Module["llvm"]
AnyModule = Module["any"]
