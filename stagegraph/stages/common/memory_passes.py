"""Passes over memory: how many times a compiled payload streams a large buffer.

Fusion's goal is stated in this unit: "a model makes as few passes over memory as its
dependences allow". A *pass* is counted on the bufferized module (after the schedule has
tiled and fused, before lowering), in the entry function and, through calls, in the
functions it calls:

* every op directly in a function's body (a loop nest, an untiled ``linalg`` op, a
  ``memref.copy``) is one pass when it, or any op nested in it, reads or writes a buffer
  defined outside it whose whole size exceeds ``resident_bytes`` (default 32 KiB, an L1
  data cache: a tile that size stays resident between the loops that share it). A buffer is
  traced through its views (``subview``, ``expand_shape``, ``cast``, ...) to the
  allocation, global or argument it views, so a loop over tiles of a large buffer counts
  once, as the stream over that buffer it is;
* allocations, views, globals, constants, deallocations and returns move no data and never
  count;
* a ``func.call`` counts as the passes of its callee, and an op whose nest holds calls (a
  loop of rolled recurrent steps) as the callees' passes times the static trip counts of
  the loops around each call.

So a convolution with its bias and activation fused into its tiles is one pass, the same
convolution followed by a separate activation loop is two, and a concatenation copied from
its operands adds one pass per operand copied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stagegraph.mlir.walk import children, collect

#: Default size (bytes) above which a buffer is not cache-resident between two loops.
RESIDENT_BYTES = 32 * 1024

_VIEWS = frozenset({
    "memref.subview", "memref.expand_shape", "memref.collapse_shape", "memref.cast",
    "memref.reinterpret_cast", "memref.transpose", "memref.view",
    "memref.memory_space_cast", "memref.assume_alignment",
})  # fmt: skip
_NO_TRAFFIC = _VIEWS | frozenset({
    "memref.alloc", "memref.alloca", "memref.dealloc", "memref.get_global",
    "arith.constant", "func.return", "llvm.return", "memref.global",
})  # fmt: skip


@dataclass(frozen=True)
class MemoryPasses:
    """The passes of one payload: ``total``, and per function (``by_function``, each
    function's own count, calls expanded) for a reader who wants to see where they are."""

    total: int
    resident_bytes: int
    by_function: dict[str, int] = field(default_factory=dict)


def count_memory_passes(
    module: Any, entry: str | None = None, resident_bytes: int = RESIDENT_BYTES
) -> MemoryPasses:
    """The passes over memory of bufferized ``module`` (an ``ir.Module``) from its function
    ``entry`` (default: the payload's entry, as every stage finds it; see the module doc
    for the definition)."""
    from stagegraph.mlir.functions import entry_function, function_name

    if entry is None:
        entry = function_name(entry_function(module, None))
    functions = {_symbol(op): op for op in children(module.operation) if op.name == "func.func"}
    counted: dict[str, int] = {}

    def function_passes(name: str, active: tuple[str, ...]) -> int:
        if name in counted:
            return counted[name]
        fn = functions.get(name)
        if fn is None or name in active or not fn.regions[0].blocks:
            return 0  # external or recursive: nothing seen
        total = sum(_op_passes(op, resident_bytes,
                               lambda callee: function_passes(callee, (*active, name)))
                    for op in children(fn))  # fmt: skip
        counted[name] = total
        return total

    total = function_passes(entry, ())
    return MemoryPasses(total=total, resident_bytes=resident_bytes, by_function=counted)


def _op_passes(op: Any, resident_bytes: int, callee_passes: Any) -> int:
    """The passes of one op directly in a function's body."""
    if op.name in _NO_TRAFFIC:
        return 0
    if op.name == "func.call":
        return callee_passes(_callee(op))
    calls = collect(op, "func.call")
    if calls:
        return sum(callee_passes(_callee(call)) * _trip_product(call, op) for call in calls)
    inner = {_key(nested) for nested in collect(op)} | {_key(op)}
    for user in [op, *collect(op)]:
        for value in user.operands:
            if _defined_inside(value, inner):
                continue
            if _buffer_bytes(_root(value)) > resident_bytes:
                return 1
    return 0


def _key(op: Any) -> Any:
    return getattr(op, "operation", op)


def _defined_inside(value: Any, inner: set[Any]) -> bool:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if isinstance(owner, ir.Block):
        owner = owner.owner
    return _key(owner) in inner


def _root(value: Any) -> Any:
    """The buffer ``value`` views: followed through view ops to an allocation, a global or
    a block argument."""
    from stagegraph.mlir.bindings import ir

    while not isinstance(value.owner, ir.Block):
        owner = _key(value.owner)
        if owner.name not in _VIEWS or not owner.operands:
            break
        value = owner.operands[0]
    return value


def _buffer_bytes(value: Any) -> float:
    """Bytes of a statically shaped memref; infinite for a dynamic one, 0 for a non-memref."""
    from stagegraph.mlir.bindings import ir

    if not isinstance(value.type, ir.MemRefType):
        return 0
    memref = ir.MemRefType(value.type)
    if not memref.has_static_shape:
        return math.inf
    element = memref.element_type
    width = getattr(element, "width", None) or _element_width(element)
    return math.prod(memref.shape) * max(width // 8, 1)


def _element_width(element: Any) -> int:
    from stagegraph.mlir.bindings import ir

    for kind in (ir.F64Type, ir.F32Type, ir.F16Type, ir.BF16Type, ir.IntegerType):
        if isinstance(element, kind):
            return kind(element).width
    return 64  # index and others: a word


def _callee(call: Any) -> str:
    from stagegraph.mlir.bindings import ir

    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _symbol(fn: Any) -> str:
    from stagegraph.mlir.bindings import ir

    return ir.StringAttr(fn.attributes["sym_name"]).value


def _trip_product(op: Any, top: Any) -> int:
    """The product of the static trip counts of the ``scf.for`` loops between ``op`` and
    ``top`` (``top`` included); a loop whose bounds are not constants counts once."""
    product = 1
    current = op.parent
    top = _key(top)
    while current is not None:
        current = _key(current)
        if current.name == "scf.for":
            bounds = [_constant_int(v) for v in current.operands[:3]]
            if None not in bounds and bounds[2] > 0:
                product *= max(0, -(-(bounds[1] - bounds[0]) // bounds[2]))
        if current == top:
            break
        parent = current.parent
        current = parent if parent is not None else None
    return product


def _constant_int(value: Any) -> int | None:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or _key(owner).name != "arith.constant":
        return None
    attr = _key(owner).attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None
