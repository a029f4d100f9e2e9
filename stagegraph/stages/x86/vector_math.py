"""Vector ``math`` ops to calls into glibc's libmvec (the x86 vector-function ABI).

``convert-to-llvm`` turns ``math.exp`` on ``vector<64xf32>`` into ``llvm.exp.v64f32``,
which the backend scalarizes into one ``expf`` call per lane. libmvec exports the same
functions on whole registers (``_ZGVeN16v_expf``: 16 x f32 in a zmm register, AVX-512;
``_ZGVdN8v_expf``: 8 x f32 in ymm, AVX2; ``_ZGVbN4v_expf``: 4 x f32 in xmm, SSE),
accurate to 4 ulp. :func:`call_vector_math` rewrites every such op on a vector of f32 or
f64 into calls to private ``func.func`` declarations of those symbols, splitting wide rows
into register-sized slices (``vector.extract_strided_slice`` /
``vector.insert_strided_slice``) and n-D vectors into rows. Run it on the buffer-level
module, before lowering to LLVM; the binary then needs ``libmvec_path()`` among its
shared libraries.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from stagegraph.mlir.constants import zeros
from stagegraph.stages.target import Target

# math op -> (libm base name of the f64 function, number of vector operands).
MATH_FUNCTIONS: dict[str, tuple[str, int]] = {
    "math.exp": ("exp", 1),
    "math.exp2": ("exp2", 1),
    "math.expm1": ("expm1", 1),
    "math.log": ("log", 1),
    "math.log2": ("log2", 1),
    "math.log10": ("log10", 1),
    "math.log1p": ("log1p", 1),
    "math.sin": ("sin", 1),
    "math.cos": ("cos", 1),
    "math.tan": ("tan", 1),
    "math.asin": ("asin", 1),
    "math.acos": ("acos", 1),
    "math.atan": ("atan", 1),
    "math.sinh": ("sinh", 1),
    "math.cosh": ("cosh", 1),
    "math.tanh": ("tanh", 1),
    "math.asinh": ("asinh", 1),
    "math.acosh": ("acosh", 1),
    "math.atanh": ("atanh", 1),
    "math.erf": ("erf", 1),
    "math.erfc": ("erfc", 1),
    "math.cbrt": ("cbrt", 1),
    "math.atan2": ("atan2", 2),
    "math.powf": ("pow", 2),
}

# Vector-ABI ISA letter -> (register bits, ISA feature the variant needs; None: x86-64 base).
VARIANTS: tuple[tuple[str, int, str | None], ...] = (
    ("e", 512, "avx512f"),
    ("d", 256, "avx2"),
    ("b", 128, None),
)

_SEARCH = ("/lib/x86_64-linux-gnu/libmvec.so.1", "/usr/lib/x86_64-linux-gnu/libmvec.so.1")


@cache
def libmvec_path() -> str | None:
    """The path of glibc's libmvec on this host, or None when there is none."""
    for candidate in _SEARCH:
        if Path(candidate).exists():
            return candidate
    found = ctypes.util.find_library("mvec")
    if found is None:
        return None
    return found if Path(found).is_absolute() else _loaded_path(found)


def _loaded_path(name: str) -> str | None:
    try:
        ctypes.CDLL(name)
    except OSError:
        return None
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libmvec" in path:
            return path
    return None


@cache
def _library() -> ctypes.CDLL | None:
    path = libmvec_path()
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def has_symbol(symbol: str) -> bool:
    """Whether this host's libmvec exports ``symbol``."""
    lib = _library()
    return lib is not None and hasattr(lib, symbol)


def vector_symbol(base: str, isa: str, lanes: int, arity: int, f32: bool) -> str:
    """The vector-ABI name, e.g. ``_ZGVeN16v_expf`` (unmasked, vector operands)."""
    return f"_ZGV{isa}N{lanes}{'v' * arity}_{base}{'f' if f32 else ''}"


def _isa_names(target: Target | Iterable[str]) -> frozenset[str]:
    return target.isa if isinstance(target, Target) else frozenset(target)


def _chunks(
    n: int, bits: int, isa: frozenset[str], base: str, arity: int, f32: bool
) -> list[tuple[int, int, int, str]] | None:
    """(offset, count, lanes, symbol) slices covering ``n`` lanes: the widest variant while
    it fits, then one call on the narrowest variant that holds the rest (a 14-wide row: one
    16-lane call), its spare lanes padded (``count < lanes``): a call on a few unused lanes
    costs about what a narrower call does, and far less than LLVM's one scalar libm call
    per lane. None when this ISA and libmvec have no variant of the function."""
    usable = []
    for letter, reg_bits, feature in VARIANTS:
        if feature is not None and feature not in isa:
            continue
        lanes = reg_bits // bits
        symbol = vector_symbol(base, letter, lanes, arity, f32)
        if has_symbol(symbol):
            usable.append((lanes, symbol))
    if not usable or n < 1:
        return None
    widest, symbol = usable[0]
    out = [(offset, widest, widest, symbol) for offset in range(0, n - widest + 1, widest)]
    offset = len(out) * widest
    if offset < n:  # one call on the narrowest register that holds the rest
        lanes, symbol = min((v for v in usable if v[0] >= n - offset), key=lambda v: v[0])
        out.append((offset, n - offset, lanes, symbol))
    return out


def _candidates(module: Any) -> list[Any]:
    from stagegraph.mlir.walk import collect

    return collect(module, MATH_FUNCTIONS)


def _declare(module: Any, symbol: str, vtype: Any, arity: int, declared: set[str]) -> None:
    from stagegraph.mlir.bindings import func, ir

    if symbol in declared:
        return
    table = ir.SymbolTable(module.operation)
    if symbol not in table:
        with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown():
            fn = func.FuncOp(symbol, ir.FunctionType.get([vtype] * arity, [vtype]))
            fn.attributes["sym_visibility"] = ir.StringAttr.get("private")
    declared.add(symbol)


def call_vector_math(module: Any, target: Target | Iterable[str]) -> set[str]:
    """Replace ``math`` ops on ``vector<... x N x f32|f64>`` by libmvec calls; return the
    symbols called.

    ``target`` is a :class:`Target` or a set of ISA feature names (``avx512f`` enables the
    512-bit variants, ``avx2`` the 256-bit ones; the 128-bit SSE variants are always
    usable); it must describe the machine that runs the code, since the vector ABI passes
    16 x f32 in one zmm register only when AVX-512 is enabled. Rows of an n-D vector are
    handled one at a time (``vector.extract`` / ``vector.insert``); a row that is no register
    multiple ends in a padded call (:func:`_chunks`). A scalable vector, a function libmvec
    lacks, or a host without libmvec is left alone.
    """
    from stagegraph.mlir.bindings import ir

    isa = _isa_names(target)
    if _library() is None:
        return set()
    used: set[str] = set()
    declared: set[str] = set()
    with module.context:
        for op in _candidates(module):
            base, arity = MATH_FUNCTIONS[op.name]
            if len(op.operands) != arity or len(op.results) != 1:
                continue
            rtype = op.results[0].type
            if not isinstance(rtype, ir.VectorType) or rtype.scalable or rtype.rank < 1:
                continue
            elem = rtype.element_type
            if isinstance(elem, ir.F32Type):
                f32, bits = True, 32
            elif isinstance(elem, ir.F64Type):
                f32, bits = False, 64
            else:
                continue
            if any(o.type != rtype for o in op.operands):
                continue
            chunks = _chunks(rtype.shape[-1], bits, isa, base, arity, f32)
            if chunks is None:
                continue
            with ir.InsertionPoint(op), op.location:
                value = _rewrite(module, rtype, list(op.operands), chunks, arity, declared)
            op.results[0].replace_all_uses_with(value)
            op.erase()
            used.update(chunk[-1] for chunk in chunks)
    return used


def _rewrite(
    module: Any,
    vtype: Any,
    operands: list[Any],
    chunks: list[tuple[int, int, int, str]],
    arity: int,
    declared: set[str],
) -> Any:
    """The value of the math op on ``operands`` computed by libmvec calls (at the current
    insertion point)."""
    import itertools

    from stagegraph.mlir.bindings import func, ir, vector

    elem = vtype.element_type
    n = vtype.shape[-1]
    if vtype.rank > 1:
        row = ir.VectorType.get([n], elem)
        value = zeros(vtype)
        for pos in itertools.product(*(range(d) for d in vtype.shape[:-1])):
            rows = [vector.extract(o, [], list(pos)) for o in operands]
            out = _rewrite(module, row, rows, chunks, arity, declared)
            value = vector.insert(out, value, [], list(pos))
        return value
    if len(chunks) == 1 and chunks[0][1] == chunks[0][2]:
        symbol = chunks[0][3]
        _declare(module, symbol, vtype, arity, declared)
        return func.CallOp([vtype], ir.FlatSymbolRefAttr.get(symbol), operands).results[0]
    value = zeros(vtype)
    for offset, count, lanes, symbol in chunks:
        ctype = ir.VectorType.get([lanes], elem)
        _declare(module, symbol, ctype, arity, declared)
        parts = [_lanes(o, offset, count, ctype) for o in operands]
        call = func.CallOp([ctype], ir.FlatSymbolRefAttr.get(symbol), parts).results[0]
        if count < lanes:  # the padded remainder: its first ``count`` lanes are the result
            slice_type = ir.VectorType.get([count], elem)
            call = vector.ExtractStridedSliceOp(slice_type, call, [0], [count], [1]).result
        value = vector.InsertStridedSliceOp(call, value, [offset], [1]).result
    return value


def _lanes(row: Any, offset: int, count: int, ctype: Any) -> Any:
    """Lanes ``offset .. offset + count`` of ``row`` as a ``ctype`` register; spare lanes
    are 1.0, in the domain of every function libmvec offers (log, acosh, pow, ...)."""
    from stagegraph.mlir.bindings import arith, ir, vector

    elem = ctype.element_type
    piece_type = ir.VectorType.get([count], elem)
    piece = vector.ExtractStridedSliceOp(piece_type, row, [offset], [count], [1]).result
    if count == ctype.shape[0]:
        return piece
    one = ir.DenseElementsAttr.get_splat(ctype, ir.FloatAttr.get(elem, 1.0))
    return vector.InsertStridedSliceOp(piece, arith.ConstantOp(ctype, one).result, [0], [1]).result


def declared_vector_functions(module: Any) -> set[str]:
    """The ``_ZGV*`` functions a module (func or LLVM dialect) declares: what the binary
    needs libmvec for."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import children

    names = set()
    for op in children(module.operation):  # iterating the body would import the llvm module
        if op.name in ("func.func", "llvm.func") and "sym_name" in op.attributes:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if name.startswith("_ZGV") and not op.regions[0].blocks:
                names.add(name)
    return names
