"""The artifact manifest (``manifest.json``): a versioned schema with one ``kind`` per device.

An artifact folder holds compiled code and the manifest that says how to call it. The
manifest is what a runner reads instead of the IR: ``stagegraph exec`` (CPU) and the GPU
runtime load the code, check the inputs and allocate the outputs from it alone.

Every manifest carries ``schema_version`` (:data:`SCHEMA_VERSION`) and ``kind``:

``cpu``
    a shared library and an object file exporting one entry (``entry.symbol``: plain
    pointers; ``entry.ciface_symbol``: memref descriptors), a C header, the arguments and
    results in calling order, the target's ISA features, the thread count and the run-time
    libraries the code needs (bundled next to it or from the system).
``cuda``
    a set of kernels (a PTX file each, its entry and launch configuration) and a host-side
    ``plan``: the allocations, copies and launches that run them, in order, with device
    buffers named and kernel arguments given as buffer references or scalars.

The JSON is plain dicts and lists, readable without pydantic (:func:`load_manifest_dict`);
these models validate it and write it. Values (``Value``) are row-major dense arrays:
``strides`` are in elements, ``shape`` ``None`` marks a scalar passed by value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, model_validator

from stagegraph.artifact.manifest_json import (
    KINDS,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    load_manifest_dict,
    manifest_path,
)
from stagegraph.core.ports import Schema
from stagegraph.errors import ArtifactError

__all__ = [
    "KINDS",
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "CpuManifest",
    "CudaManifest",
    "Manifest",
    "load_manifest",
    "load_manifest_dict",
    "row_major_strides",
    "write_manifest",
]


C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_file_name(name: str) -> str:
    """A file inside the artifact folder: no directories, so the folder can move."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"{name!r} must be a file name inside the artifact folder")
    return name


def _c_identifier(name: str) -> str:
    if not C_IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a C identifier")
    return name


FileName = Annotated[str, AfterValidator(_plain_file_name)]
CIdentifier = Annotated[str, AfterValidator(_c_identifier)]


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a dense row-major (C-order) array of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class Value(Schema):
    """One argument or result on the host side: a dense array or a by-value scalar."""

    name: str
    #: Position in the C call (inputs and caller-allocated outputs share one list).
    position: int = Field(ge=0)
    #: MLIR element type name (``f32``, ``bf16`` as uint16 bit patterns, ``i64``, ...).
    dtype: str
    #: ``None``: a scalar passed by value; ``[]``: a rank-0 array.
    shape: tuple[int, ...] | None
    strides: tuple[int, ...] | None = None
    layout: Literal["row-major"] = "row-major"

    @model_validator(mode="after")
    def _dense(self) -> Value:
        if self.shape is not None and self.strides != row_major_strides(self.shape):
            raise ValueError(
                f"{self.name}: strides {self.strides} are not the row-major strides "
                f"{row_major_strides(self.shape)} of shape {self.shape}"
            )
        return self


class Producer(Schema):
    """What built the artifact (for reproducing it, not for running it)."""

    stagegraph: str
    mlir: str
    graph: str
    workload: str
    params: dict[str, Any] | None = None


class _Common(Schema):
    schema_version: Literal[1] = SCHEMA_VERSION
    #: The artifact's name (a C identifier: the default entry symbol and file stem).
    name: CIdentifier
    producer: Producer
    arguments: tuple[Value, ...]
    results: tuple[Value, ...]
    #: The longest chain of accumulated terms per output element: how far rounding may
    #: move a float result (a checker's tolerance grows with its square root).
    reduction_length: int = Field(1, ge=1)

    def _check_positions(self) -> None:
        positions = sorted(v.position for v in (*self.arguments, *self.results))
        if positions != list(range(len(positions))):
            raise ValueError(
                f"argument/result positions {positions} are not 0..{len(positions) - 1}"
            )
        names = [v.name for v in (*self.arguments, *self.results)]
        if len(set(names)) != len(names):
            raise ValueError(f"argument/result names {names} repeat")


# --------------------------------------------------------------------------- cpu


class CpuTarget(Schema):
    """The CPU the code was built for; a host lacking any of ``isa`` must not run it."""

    name: str
    arch: Literal["x86_64"] = "x86_64"
    isa: tuple[str, ...]


class CpuEntry(Schema):
    """The exported functions (the only global symbols of the library and the object)."""

    #: ``void symbol(const T *in..., T *out...)``: dense row-major arrays (static shapes).
    symbol: CIdentifier
    #: ``void ciface_symbol(memref descriptor *...)`` in the same argument order.
    ciface_symbol: CIdentifier


class RuntimeLibrary(Schema):
    """A shared library the code calls at run time.

    ``file`` set: bundled in the artifact folder (found through the library's
    ``rpath``); ``None``: a system library (``libm``, glibc's ``libmvec``).
    """

    name: str
    purpose: Literal["openmp", "libm", "libmvec"]
    file: FileName | None = None


class CpuManifest(_Common):
    kind: Literal["cpu"] = "cpu"
    library: FileName
    object: FileName | None = None
    header: FileName | None = None
    entry: CpuEntry
    target: CpuTarget
    threads: int = Field(ge=1)
    runtime: tuple[RuntimeLibrary, ...] = ()
    #: The library's run path: bundled runtime libraries sit next to it.
    rpath: Literal["$ORIGIN"] = "$ORIGIN"

    @model_validator(mode="after")
    def _consistent(self) -> CpuManifest:
        self._check_positions()
        return self


# --------------------------------------------------------------------------- cuda


class CudaTarget(Schema):
    """The GPU architecture the PTX was assembled for (``sm_90``: ``sm=90``)."""

    name: str = Field(pattern=r"^sm_\d+a?$")
    sm: int = Field(ge=10)


class LaunchConfig(Schema):
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem_bytes: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _positive(self) -> LaunchConfig:
        if min(*self.grid, *self.block) < 1:
            raise ValueError(f"grid {self.grid} and block {self.block} must be positive")
        return self


class Kernel(Schema):
    """One kernel: the PTX file holding it, its entry name and how it is launched."""

    name: str
    ptx: FileName
    entry: str
    launch: LaunchConfig


class BufferArg(Schema):
    """A view of device buffer ``buffer`` as a kernel takes it (an MLIR memref descriptor:
    allocated and aligned pointer, then ``offset``, ``sizes`` and ``strides`` in elements of
    ``dtype``). Launches pass views, so one allocation can feed several kernels reshaped."""

    buffer: str
    offset: int = Field(ge=0)
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @model_validator(mode="after")
    def _rank(self) -> BufferArg:
        if len(self.sizes) != len(self.strides):
            raise ValueError(
                f"view of {self.buffer!r}: {len(self.sizes)} sizes but {len(self.strides)} strides"
            )
        return self


class ArgumentArg(Schema):
    """A scalar argument of the entry (by value), passed on to a kernel as itself."""

    argument: str
    dtype: str


class ScalarArg(Schema):
    """A constant of the host code, passed to a kernel by value."""

    scalar: int | float
    dtype: str


class TensorMapArg(Schema):
    """The device address of a tensor map a ``tensor_map`` step encoded (by value: a
    kernel reads its TMA descriptor through it)."""

    tensor_map: str


class Alloc(Schema):
    op: Literal["alloc"] = "alloc"
    buffer: str
    bytes: int = Field(ge=0)


class CopyH2D(Schema):
    """Copy the host argument ``src`` (an argument's name) into device buffer ``dst``."""

    op: Literal["copy_h2d"] = "copy_h2d"
    src: str
    dst: str


class Constant(Schema):
    """Fill device buffer ``buffer`` with the constant ``data`` (a key of ``constants``)."""

    op: Literal["constant"] = "constant"
    buffer: str
    data: str


class CopyD2D(Schema):
    """Copy the view ``src`` into the view ``dst`` on the device (same sizes)."""

    op: Literal["copy_d2d"] = "copy_d2d"
    src: BufferArg
    dst: BufferArg

    @model_validator(mode="after")
    def _same_sizes(self) -> CopyD2D:
        if self.src.sizes != self.dst.sizes:
            raise ValueError(f"copy_d2d between sizes {self.src.sizes} and {self.dst.sizes}")
        return self


class Launch(Schema):
    op: Literal["launch"] = "launch"
    kernel: str
    args: tuple[BufferArg | ArgumentArg | ScalarArg | TensorMapArg, ...]


class TensorMap(Schema):
    """Encode a TMA tensor map (``cuTensorMapEncodeTiled``) of the view ``source`` into the
    device buffer ``buffer`` (128 bytes): tiles of ``box`` elements per dim (outermost
    first, as ``source.sizes``), ``swizzle`` bytes (0: none), L2 promotion in bytes (0:
    none), out-of-bounds elements read as zero or NaN. Added in schema version 1 as a new
    step kind: readers that predate it refuse such a manifest by name."""

    op: Literal["tensor_map"] = "tensor_map"
    buffer: str
    source: BufferArg
    box: tuple[int, ...]
    swizzle: Literal[0, 32, 64, 128] = 0
    l2_promotion: Literal[0, 64, 128, 256] = 0
    oob_fill: Literal["zero", "nan"] = "zero"

    @model_validator(mode="after")
    def _box(self) -> TensorMap:
        if len(self.box) != len(self.source.sizes) or not 1 <= len(self.box) <= 5:
            raise ValueError(f"box {self.box} for a view of rank {len(self.source.sizes)}")
        if any(not 1 <= b <= 256 or b > n for b, n in zip(self.box, self.source.sizes,
                                                          strict=True)):  # fmt: skip
            raise ValueError(f"box {self.box} must be 1..256 and within {self.source.sizes}")
        return self


class CopyD2H(Schema):
    """Copy device buffer ``src`` into the host result ``dst`` (a result's name)."""

    op: Literal["copy_d2h"] = "copy_d2h"
    src: str
    dst: str


class Free(Schema):
    op: Literal["free"] = "free"
    buffer: str


Step = Annotated[
    Alloc | CopyH2D | Constant | Launch | CopyD2D | CopyD2H | Free | TensorMap,
    Field(discriminator="op"),
]


class CudaManifest(_Common):
    kind: Literal["cuda"] = "cuda"
    target: CudaTarget
    kernels: tuple[Kernel, ...]
    #: Constant buffers' values: a name (what ``constant`` steps fill from) -> a ``.npy``
    #: file in the folder.
    constants: dict[str, FileName] = Field(default_factory=dict)
    plan: tuple[Step, ...]

    @model_validator(mode="after")
    def _plan_refers_to_known_names(self) -> CudaManifest:
        """Every step names a live buffer, a kernel, an argument, a result or a constant
        that exists."""
        self._check_positions()
        names = [k.name for k in self.kernels]
        if len(set(names)) != len(names):
            raise ValueError(f"kernel names {names} repeat")
        live: set[str] = set()
        for i, step in enumerate(self.plan):
            for problem in self._step_problems(step, live):
                raise ValueError(f"plan step {i} ({step.op}): {problem}")
            if isinstance(step, Alloc):
                live.add(step.buffer)
            elif isinstance(step, Free):
                live.discard(step.buffer)
        return self

    def _step_problems(self, step: Any, live: set[str]) -> list[str]:
        """What is wrong with one step, given the buffers allocated (and not freed) before."""
        scalars = {v.name for v in self.arguments if v.shape is None}
        used: list[str] = []
        problems: list[str] = []
        if isinstance(step, CopyH2D):
            used.append(step.dst)
            if step.src not in {v.name for v in self.arguments} - scalars:
                problems.append(f"copies unknown array argument {step.src!r}")
        elif isinstance(step, CopyD2H):
            used.append(step.src)
            if step.dst not in {v.name for v in self.results}:
                problems.append(f"copies into unknown result {step.dst!r}")
        elif isinstance(step, Constant):
            used.append(step.buffer)
            if step.data not in self.constants:
                problems.append(f"fills from {step.data!r}, which constants lacks")
        elif isinstance(step, CopyD2D):
            used += [step.src.buffer, step.dst.buffer]
        elif isinstance(step, Launch):
            if step.kernel not in {k.name for k in self.kernels}:
                problems.append(f"launches unknown kernel {step.kernel!r}")
            used += [a.buffer for a in step.args if isinstance(a, BufferArg)]
            used += [a.tensor_map for a in step.args if isinstance(a, TensorMapArg)]
            problems += [
                f"passes {a.argument!r}, which is no scalar argument"
                for a in step.args
                if isinstance(a, ArgumentArg) and a.argument not in scalars
            ]
        elif isinstance(step, Free):
            used.append(step.buffer)
        elif isinstance(step, TensorMap):
            used += [step.buffer, step.source.buffer]
        elif step.buffer in live:
            problems.append(f"allocates {step.buffer!r} twice")
        return problems + [f"uses buffer {b!r} before alloc" for b in used if b not in live]


Manifest = Annotated[CpuManifest | CudaManifest, Field(discriminator="kind")]
_MANIFEST: TypeAdapter[CpuManifest | CudaManifest] = TypeAdapter(Manifest)


def load_manifest(location: str | Path, kind: str | None = None) -> CpuManifest | CudaManifest:
    """The validated manifest of an artifact folder (or manifest file).

    Raises:
        ArtifactError: what :func:`load_manifest_dict` refuses, or a manifest whose keys do
            not match its kind's schema (the first few problems are named).
    """
    data = load_manifest_dict(location, kind)
    try:
        return _MANIFEST.validate_python(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, _where(e['loc'])))}: {e['msg']}" for e in error.errors()[:5]
        )
        raise ArtifactError(f"{manifest_path(location)}: invalid manifest: {problems}") from None


def _where(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An error's location without the union's tag (``cpu.threads`` is ``threads``)."""
    return loc[1:] if loc and loc[0] in KINDS else loc


def write_manifest(directory: str | Path, manifest: CpuManifest | CudaManifest) -> Path:
    """Write ``manifest.json`` into ``directory`` (indented, keys in schema order)."""
    path = Path(directory) / MANIFEST_NAME
    path.write_text(manifest.model_dump_json(indent=1) + "\n")
    return path
