"""Gathers through constant index tensors that only reshape become reshapes.

PyTorch importers lower some views (GroupNorm's ``view`` back to the input's shape among
them) to a ``linalg.generic`` whose body is a ``tensor.extract`` from the source at
positions read from constant ``i64`` tensors, one per source dim, each wrapped for negative
values (``select(x < 0, x + size, x)``). No schedule vectorizes that: every element costs
several scalar loads of index tensors as big as the output, and it runs as a scalar loop
(GroupNorm after a 256x256 Linear: 15% of the run time, with 4 MiB of index reads per
call).

When the positions are exactly the output's row-major order over the source's row-major
order, the gather is ``reshape(source)``: it is rewritten as a ``tensor.collapse_shape`` to
one dim and a ``tensor.expand_shape`` to the output's shape, which the schedules fuse
through. Deciding it needs the constants' values. The importer stores them as
``dense_resource`` blobs, which the Python bindings cannot read, so they are evaluated: one
small function returning them is compiled and called (a few hundredths of a second, only
for payloads that have such gathers). Any other gather is left as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stagegraph.mlir.build import collapse_shape, expand_shape
from stagegraph.mlir.walk import DefUse, collect, top_level_ops

#: Index tensors larger than this (elements, all together) are not evaluated: the probe
#: would copy them all, and a gather that large is better left than stalled on.
MAX_INDEX_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class _Gather:
    """A gather ``op`` reading ``source`` at positions from constant input tensors:
    ``index_inputs[d]`` is the input (by position) giving the source's dim ``d``, wrapped
    by the source size if ``wraps[d]``."""

    op: Any
    source: Any
    index_inputs: tuple[int, ...]
    wraps: tuple[bool, ...]
    constants: tuple[Any, ...]  # the ``arith.constant`` of each input


def fold_reshaping_gathers(module: Any) -> int:
    """Rewrite every top-level gather of ``module``'s functions whose constant positions
    only reshape its source (see the module doc); returns how many were rewritten."""
    gathers = []
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        def_use = DefUse(fn)  # value.owner would import the linalg module (see DefUse)
        for op in top_level_ops(fn):
            if (gather := _match_gather(op, def_use)) is not None:
                gathers.append(gather)
    if not gathers:
        return 0
    constants = list(dict.fromkeys(g.constants[i] for g in gathers for i in g.index_inputs))
    if sum(_elements(c) for c in constants) > MAX_INDEX_ELEMENTS:
        return 0
    values = dict(zip(constants, evaluate_constants(module, constants), strict=True))
    rewritten = 0
    for gather in gathers:
        if _only_reshapes(gather, values):
            _rewrite(gather)
            rewritten += 1
    return rewritten


# ---------------------------------------------------------------------------- matching


def _match_gather(op: Any, def_use: DefUse) -> _Gather | None:
    from stagegraph.mlir.bindings import ir

    if op.name != "linalg.generic" or len(op.results) != 1:
        return None
    out_type = op.results[0].type
    if (
        not isinstance(out_type, ir.RankedTensorType)
        or not ir.RankedTensorType(out_type).has_static_shape
    ):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if any(m != ir.AffineMap.get_identity(m.n_dims, op.context) for m in maps):
        return None
    inputs = len(op.operands) - 1
    shape = ir.RankedTensorType(out_type).shape
    constants = []
    for value in list(op.operands)[:inputs]:
        producer = def_use.owner(value)
        if producer is None or producer.name != "arith.constant" or not _is_int_tensor(value):
            return None
        if ir.RankedTensorType(value.type).shape != shape:
            return None
        constants.append(producer)
    block = op.regions[0].blocks[0]
    terminator = list(block.operations)[-1]
    if len(terminator.operands) != 1:
        return None
    extract = def_use.owner(terminator.operands[0])
    if extract is None or extract.name != "tensor.extract":
        return None
    source = extract.operands[0]
    if _inside(source, op, block, def_use) or not ir.RankedTensorType(source.type).has_static_shape:
        return None
    if ir.RankedTensorType(source.type).element_type != ir.RankedTensorType(out_type).element_type:
        return None
    source_shape = ir.RankedTensorType(source.type).shape
    index_inputs, wraps = [], []
    for dim, index in enumerate(list(extract.operands)[1:]):
        found = _index_source(index, block, source_shape[dim], def_use)
        if found is None or found[0] >= inputs:
            return None
        index_inputs.append(found[0])
        wraps.append(found[1])
    return _Gather(op, source, tuple(index_inputs), tuple(wraps), tuple(constants))


def _index_source(index: Any, block: Any, size: int, def_use: DefUse) -> tuple[int, bool] | None:
    """(input position, wrapped) when ``index`` is ``index_cast(x)`` or
    ``index_cast(select(x < 0, x + size, x))`` of a block argument ``x``."""
    cast = def_use.owner(index)
    if cast is None or cast.name != "arith.index_cast":
        return None
    value, wrapped = cast.operands[0], False
    select = def_use.owner(value)
    if select is not None and select.name == "arith.select":
        condition, shifted = def_use.owner(select.operands[0]), def_use.owner(select.operands[1])
        x = select.operands[2]
        if not (
            condition is not None
            and condition.name == "arith.cmpi"
            and _predicate(condition) == "slt"
            and condition.operands[0] == x
            and _constant_int(condition.operands[1], def_use) == 0
            and shifted is not None
            and shifted.name == "arith.addi"
            and x in list(shifted.operands)
            and size in [_constant_int(v, def_use) for v in shifted.operands]
        ):
            return None
        value, wrapped = x, True
    if not _is_argument_of(value, block):
        return None
    return _argument_number(value), wrapped


# ---------------------------------------------------------------------------- deciding


def _only_reshapes(gather: _Gather, values: dict[Any, np.ndarray]) -> bool:
    from stagegraph.mlir.bindings import ir

    source_shape = ir.RankedTensorType(gather.source.type).shape
    out_shape = ir.RankedTensorType(gather.op.results[0].type).shape
    if math.prod(source_shape) != math.prod(out_shape):
        return False
    positions = []
    for dim, (i, wrap) in enumerate(zip(gather.index_inputs, gather.wraps, strict=True)):
        index = values[gather.constants[i]].astype(np.int64)
        if wrap:
            index = np.where(index < 0, index + source_shape[dim], index)
        if index.size and (index.min() < 0 or index.max() >= source_shape[dim]):
            return False
        positions.append(index)
    if not positions:
        return False
    flat = np.ravel_multi_index(tuple(positions), tuple(source_shape))
    return bool(np.array_equal(flat.ravel(), np.arange(flat.size)))


def evaluate_constants(module: Any, constants: list[Any]) -> list[np.ndarray]:
    """The values of tensor ``constants`` (``arith.constant`` ops, dense or
    ``dense_resource``), by compiling and calling a function that returns them."""
    from stagegraph.mlir.bindings import func, ir, passmanager
    from stagegraph.runtime.jit import jit
    from stagegraph.runtime.memref import record_signature
    from stagegraph.stages.common import lowering

    with module.context, ir.Location.unknown(module.context):
        probe = ir.Module.create()
        types = [c.results[0].type for c in constants]
        with ir.InsertionPoint(probe.body):
            fn = func.FuncOp("index_constants", ir.FunctionType.get([], types))
            with ir.InsertionPoint(fn.add_entry_block()):
                func.ReturnOp([c.clone().results[0] for c in constants])
        record_signature(probe, "index_constants")
        pipeline = f"builtin.module({lowering.BUFFERIZE},{lowering.LOWER_TO_LLVM})"
        passmanager.PassManager.parse(pipeline).run(probe.operation)
    return jit(probe, opt_level=0).call("index_constants", [])


# ---------------------------------------------------------------------------- rewriting


def _rewrite(gather: _Gather) -> None:
    from stagegraph.mlir.bindings import ir

    op = gather.op
    out_shape = ir.RankedTensorType(op.results[0].type).shape
    source_rank = ir.RankedTensorType(gather.source.type).rank
    size = math.prod(out_shape)
    with ir.InsertionPoint(op), op.location:
        value = gather.source
        if source_rank != 1:
            value = collapse_shape(value, [list(range(source_rank))], [size])
        if len(out_shape) != 1:
            value = expand_shape(value, [list(range(len(out_shape)))], out_shape)
    op.results[0].replace_all_uses_with(value)
    op.erase()


# ---------------------------------------------------------------------------- helpers


def _is_argument_of(value: Any, block: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    return isinstance(value, ir.BlockArgument) and value.owner == block


def _argument_number(value: Any) -> int:
    from stagegraph.mlir.bindings import ir

    return ir.BlockArgument(value).arg_number


def _inside(value: Any, op: Any, block: Any, def_use: DefUse) -> bool:
    """Whether ``value`` is defined in ``op``'s body (one of its arguments or ops)."""
    if _is_argument_of(value, block):
        return True
    owner = def_use.owner(value)
    return owner is not None and any(owner == inner for inner in collect(op))


def _is_int_tensor(value: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    if not isinstance(value.type, ir.RankedTensorType):
        return False
    element = ir.RankedTensorType(value.type).element_type
    return isinstance(element, ir.IntegerType) and ir.IntegerType(element).width in (32, 64)


def _constant_int(value: Any, def_use: DefUse) -> int | None:
    from stagegraph.mlir.bindings import ir

    producer = def_use.owner(value)
    if producer is None or producer.name != "arith.constant":
        return None
    attr = producer.attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def _predicate(cmpi: Any) -> str:
    from stagegraph.mlir.bindings import ir

    names = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")
    return names[ir.IntegerAttr(cmpi.attributes["predicate"]).value]


def _elements(constant: Any) -> int:
    from stagegraph.mlir.bindings import ir

    return math.prod(ir.RankedTensorType(constant.results[0].type).shape)
