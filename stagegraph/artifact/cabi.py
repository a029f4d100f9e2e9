"""The C ABI of an exported entry: its symbol names, its C types, the header and the
plain-pointer wrapper around MLIR's descriptor interface.

An entry compiled by MLIR takes memref descriptors (``_mlir_ciface_<entry>``). A C program
usually has plain arrays, so the artifact also exports ``<symbol>(const T *in..., T *out...)``
for static shapes: a small C function (:func:`wrapper_source`) that builds the descriptors
of dense row-major arrays and calls the descriptor form. The header declares both. Arguments
are named ``in0, in1, ...`` and results ``out0, ...`` (the names of reference ``.npz`` files).

See ``docs/guides/c-abi.md`` for the convention as a user reads it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from stagegraph.artifact.manifest import Value, row_major_strides
from stagegraph.errors import ArtifactError
from stagegraph.runtime.memref import CIFACE_PREFIX, Signature

#: Every default entry symbol starts with this, so it cannot collide with a user's names.
SYMBOL_PREFIX = "stagegraph_"

#: MLIR element type name -> the C type of one element (half types as their bit patterns).
C_TYPES = {
    "f64": "double",
    "f32": "float",
    "f16": "uint16_t",
    "bf16": "uint16_t",
    "i1": "bool",
    "i8": "int8_t",
    "i16": "int16_t",
    "i32": "int32_t",
    "i64": "int64_t",
    "ui8": "uint8_t",
    "ui16": "uint16_t",
    "ui32": "uint32_t",
    "ui64": "uint64_t",
    "index": "int64_t",
}


def default_symbol(workload_spec: str) -> str:
    """The entry symbol for a workload: ``stagegraph_`` + its name as a C identifier.

    The name is what precedes ``:`` (``matmul:m=8`` -> ``stagegraph_matmul``), or a
    ``.mlir`` file's stem (``19_ReLU.mlir`` -> ``stagegraph_19_relu``); lowercased, every
    run of characters outside ``[a-z0-9_]`` becomes one ``_``.
    """
    name = workload_spec.split(":", 1)[0]
    if name.endswith(".mlir"):
        name = Path(name).stem
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    return SYMBOL_PREFIX + (slug or "entry")


def ciface_symbol(symbol: str) -> str:
    """The descriptor form's symbol: MLIR's C-interface name for ``symbol``."""
    return CIFACE_PREFIX + symbol


def manifest_values(signature: Signature) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """The signature's inputs and outputs as manifest values (``in<i>``/``out<i>``), in
    calling order.

    Raises:
        ArtifactError: a dynamic shape (outputs are caller-allocated; the plain-pointer
            form builds descriptors from the manifest's sizes).
    """
    inputs: list[Value] = []
    outputs: list[Value] = []
    for position, arg in enumerate(signature.args):
        group = outputs if arg.output else inputs
        name = f"{'out' if arg.output else 'in'}{len(group)}"
        if arg.shape is not None and None in arg.shape:
            raise ArtifactError(
                f"{signature.entry}: {name} has dynamic shape {arg.shape}; an artifact takes "
                "static shapes (give the workload's sizes, e.g. an .npz beside the payload)"
            )
        shape = None if arg.shape is None else tuple(int(d) for d in arg.shape)  # type: ignore[arg-type]
        strides = None if shape is None else row_major_strides(shape)
        group.append(
            Value(name=name, position=position, dtype=arg.dtype, shape=shape, strides=strides)
        )
    return tuple(inputs), tuple(outputs)


def _descriptor(rank: int) -> str:
    return f"stagegraph_memref_{rank}d"


def _descriptor_typedef(rank: int) -> str:
    name = _descriptor(rank)
    dims = f"  int64_t sizes[{rank}];\n  int64_t strides[{rank}];\n" if rank else ""
    return (
        f"#ifndef STAGEGRAPH_MEMREF_{rank}D\n#define STAGEGRAPH_MEMREF_{rank}D\n"
        f"typedef struct {name} {{\n  void *allocated;\n  void *aligned;\n  int64_t offset;\n"
        f"{dims}}} {name};\n#endif\n"
    )


def _plain_param(value: Value, output: bool) -> str:
    ctype = C_TYPES[value.dtype]
    if value.shape is None:
        return f"{ctype} {value.name}"
    return f"{'' if output else 'const '}{ctype} *{value.name}"


def _ciface_param(value: Value) -> str:
    if value.shape is None:
        return f"{C_TYPES[value.dtype]} {value.name}"
    return f"{_descriptor(len(value.shape))} *{value.name}"


def _describe(value: Value, output: bool) -> str:
    if value.shape is None:
        return f"{value.name}: {value.dtype} scalar, by value"
    dims = "".join(f"[{d}]" for d in value.shape) or " rank-0 array"
    role = "output, caller-allocated" if output else "input"
    return f"{value.name}: {value.dtype}{dims} row-major ({role})"


def _in_order(arguments: Sequence[Value], results: Sequence[Value]) -> list[tuple[Value, bool]]:
    """Every value in calling order, with whether it is a (caller-allocated) output."""
    tagged = [(v, False) for v in arguments] + [(v, True) for v in results]
    return sorted(tagged, key=lambda pair: pair[0].position)


def _plain_params(ordered: list[tuple[Value, bool]]) -> str:
    return ", ".join(_plain_param(v, out) for v, out in ordered) or "void"


def header_source(
    symbol: str,
    ciface: str,
    arguments: Sequence[Value],
    results: Sequence[Value],
    preamble: Sequence[str] = (),
) -> str:
    """The C header declaring ``symbol`` (plain pointers) and the descriptor form
    ``ciface``, with each array's element count as a macro; ``preamble``: comment lines."""
    ordered = _in_order(arguments, results)
    guard = symbol.upper() + "_H"
    ranks = sorted({len(v.shape) for v, _ in ordered if v.shape is not None})
    lines = ["/* " + line + " */" for line in preamble]
    lines += [f"#ifndef {guard}", f"#define {guard}", "", "#include <stdbool.h>",
              "#include <stdint.h>", "", "#ifdef __cplusplus", 'extern "C" {', "#endif",
              ""]  # fmt: skip
    lines += [_descriptor_typedef(rank) for rank in ranks]
    lines += ["/* Arguments, in calling order:"]
    lines += [f" *   {_describe(v, out)}" for v, out in ordered] + [" */"]
    lines += [
        f"#define {symbol.upper()}_{v.name.upper()}_ELEMENTS {math.prod(v.shape)}"
        for v, _ in ordered
        if v.shape is not None
    ]
    lines += ["", "/* Plain pointers to dense row-major arrays. */",
              f"void {symbol}({_plain_params(ordered)});"]  # fmt: skip
    descs = ", ".join(_ciface_param(v) for v, _ in ordered) or "void"
    lines += ["", "/* MLIR memref descriptors (sizes and strides in elements). */",
              f"void {ciface}({descs});", "", "#ifdef __cplusplus", "}", "#endif", "",
              f"#endif /* {guard} */", ""]  # fmt: skip
    return "\n".join(lines)


def wrapper_source(
    header_name: str,
    symbol: str,
    ciface: str,
    arguments: Sequence[Value],
    results: Sequence[Value],
) -> str:
    """C source of ``symbol``: descriptors of the dense row-major arrays, then a call of
    ``ciface``."""
    ordered = _in_order(arguments, results)
    body, args = [], []
    for i, (v, _) in enumerate(ordered):
        if v.shape is None:
            args.append(v.name)
            continue
        init = f"(void *){v.name}, (void *){v.name}, 0"
        if v.shape:
            sizes = ", ".join(map(str, v.shape))
            strides = ", ".join(map(str, v.strides or ()))
            init += f", {{{sizes}}}, {{{strides}}}"
        body.append(f"  {_descriptor(len(v.shape))} d{i} = {{{init}}};")
        args.append(f"&d{i}")
    lines = [f'#include "{header_name}"', "", f"void {symbol}({_plain_params(ordered)}) {{",
             *body, f"  {ciface}({', '.join(args)});", "}", ""]  # fmt: skip
    return "\n".join(lines)
