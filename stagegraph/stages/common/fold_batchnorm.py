"""Eval-mode BatchNorm (and any per-channel scale and shift) folded into the weights and
bias of the convolution or matmul before it.

A frozen PyTorch import of a model in eval mode computes BatchNorm as elementwise
``linalg.generic`` ops after the convolution: subtract the running mean, multiply by
``1 / sqrt(running_var + eps)`` (itself computed from constants), multiply by the weight,
add the bias, each a pass over the convolution's output. All of it is ``y = a[c] * x +
b[c]`` with constant ``a`` and ``b`` per output channel, so it belongs in the convolution:
``conv(W) + bias`` followed by it is ``conv(a * W) + (a * bias + b)``. This rewrite finds
each convolution or matmul with constant weights whose result only feeds such a chain
(additions, subtractions, multiplications and divisions by per-channel constants or scalar
constants), computes the new weights and bias with numpy at compile time
(:mod:`stagegraph.stages.common.constant_eval`) and drops the chain: BatchNorm then costs
nothing at run time. Training-mode BatchNorm (statistics of the batch, not constants) is
not a constant chain and stays as it is, as does any chain whose first op is not affine
(the ReLU after BatchNorm ends the chain and stays for the epilogue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stagegraph.mlir.walk import DefUse, children, top_level_ops
from stagegraph.stages.common.constant_eval import ConstantValues, NotConstantError

#: Producers whose output channel is scaled by scaling one axis of their weight (operand 1):
#: op name -> (the output's channel dim, the weight's channel axis).
CHANNEL_PRODUCERS = {
    "linalg.conv_1d_ncw_fcw": (1, 0),
    "linalg.conv_2d_nchw_fchw": (1, 0),
    "linalg.conv_3d_ncdhw_fcdhw": (1, 0),
    "linalg.conv_1d_nwc_wcf": (2, 2),
    "linalg.conv_2d_nhwc_hwcf": (3, 3),
    "linalg.conv_2d_nhwc_fhwc": (3, 0),
    "linalg.conv_3d_ndhwc_dhwcf": (4, 4),
    "linalg.depthwise_conv_1d_ncw_cw": (1, 0),
    "linalg.depthwise_conv_2d_nchw_chw": (1, 0),
    "linalg.matmul": (1, 1),
    "linalg.matmul_transpose_b": (1, 0),
}
_STEPS = frozenset({"arith.addf", "arith.subf", "arith.mulf", "arith.divf"})


@dataclass
class _Step:
    """One affine op of a chain: ``kind`` applied with the chain value on the left
    (``chain_left``) or right, against ``side`` (a constant input read through ``side_map``)
    or the scalar ``scalar`` (a constant defined outside the body)."""

    op: Any
    kind: str
    chain_left: bool
    side: Any = None
    side_map: Any = None
    scalar: Any = None


@dataclass
class _Chain:
    producer: Any
    steps: list[_Step]
    channel_dim: int
    weight_axis: int


def fold_channel_affine_chains(module: Any) -> int:
    """Fold every per-channel affine chain after a convolution or matmul with constant
    weights into its weights and bias (see the module doc); returns how many chains were
    folded."""
    values = ConstantValues(module)
    chains: list[_Chain] = []
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        def_use = DefUse(fn)
        chains.extend(c for op in top_level_ops(fn) if (c := _match(op, def_use)) is not None)
    ready, leaves = [], []
    for chain in chains:
        needed = _constant_leaves(chain, values)
        if needed is not None:
            ready.append(chain)
            leaves.extend(needed)
    if not ready:
        return 0
    try:
        values.load(list({leaf: None for leaf in leaves}))
    except NotConstantError:
        return 0  # a constant of a type numpy does not compute like (f16, bf16)
    folded = 0
    for chain in ready:
        try:
            weight, bias = _folded_parameters(chain, values)
        except (NotConstantError, ValueError, IndexError):
            continue
        _rewrite(chain, weight, bias)
        folded += 1
    return folded


def _match(op: Any, def_use: DefUse) -> _Chain | None:
    if op.name not in CHANNEL_PRODUCERS or len(op.results) != 1:
        return None
    if "indexing_maps" in op.attributes or len(op.operands) != 3:
        return None  # a matmul with transposed maps: its weight axis is not the table's
    if not all(_f32_or_f64(v) for v in (*op.operands, op.results[0])):
        return None  # bf16 and others: numpy has no type that computes like them
    channel_dim, weight_axis = CHANNEL_PRODUCERS[op.name]
    steps: list[_Step] = []
    value = op.results[0]
    while len(users := def_use.users(value)) == 1:
        step = _affine_step(users[0], value, channel_dim)
        if step is None:
            break
        steps.append(step)
        value = users[0].results[0]
    return _Chain(op, steps, channel_dim, weight_axis) if steps else None


def _f32_or_f64(value: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    element = ir.ShapedType(value.type).element_type
    return isinstance(element, ir.F32Type | ir.F64Type)


def _affine_step(op: Any, chain_value: Any, channel_dim: int) -> _Step | None:
    """``op`` as one affine step on ``chain_value``, or ``None``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.constant_eval import evaluable_generic

    if op.name != "linalg.generic" or not evaluable_generic(op):
        return None
    if op.results[0].type != chain_value.type:
        return None
    inputs = int(next(iter(op.attributes["operandSegmentSizes"])))
    maps = [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]
    positions = [i for i in range(inputs) if op.operands[i] == chain_value]
    if len(positions) != 1 or inputs > 2 or maps[positions[0]] != maps[-1]:
        return None
    body = children(op)
    if len(body) != 2 or body[0].name not in _STEPS or body[1].operands[0] != body[0].results[0]:
        return None
    block = op.regions[0].blocks[0]
    chain_arg = block.arguments[positions[0]]
    left, right = body[0].operands
    if (left == chain_arg) == (right == chain_arg):
        return None
    other = right if left == chain_arg else left
    step = _Step(body[0], body[0].name, chain_left=left == chain_arg)
    if step.kind == "arith.divf" and not step.chain_left:
        return None  # s / x is not affine
    step.op = op
    if isinstance(other, ir.BlockArgument) and ir.BlockArgument(other).owner == block:
        side_position = ir.BlockArgument(other).arg_number
        if side_position >= inputs or side_position == positions[0]:
            return None
        mapping = maps[side_position]
        if any(isinstance(e, ir.AffineDimExpr) and ir.AffineDimExpr(e).position != channel_dim
               for e in mapping.results):  # fmt: skip
            return None
        step.side, step.side_map = op.operands[side_position], mapping
    elif isinstance(other.type, ir.FloatType) and inputs == 1:
        step.scalar = other
    else:
        return None
    return step


def _constant_leaves(chain: _Chain, values: ConstantValues) -> list[Any] | None:
    found: list[Any] = []
    operands = [chain.producer.operands[1], chain.producer.operands[2]]
    operands += [s.side if s.side is not None else s.scalar for s in chain.steps]
    for operand in operands:
        more = values.leaves(operand)
        if more is None:
            return None
        found.extend(more)
    return found


def _per_channel(step: _Step, values: ConstantValues) -> np.ndarray:
    """The step's constant as a vector over channels (or a scalar)."""
    from stagegraph.mlir.bindings import ir

    if step.scalar is not None:
        return np.asarray(values.value(step.scalar), np.float64)
    index = []
    for expr in step.side_map.results:
        is_dim = isinstance(expr, ir.AffineDimExpr)
        index.append(slice(None) if is_dim else ir.AffineConstantExpr(expr).value)
    return np.asarray(values.value(step.side)[tuple(index)], np.float64).reshape(-1)


def _folded_parameters(chain: _Chain, values: ConstantValues) -> tuple[np.ndarray, np.ndarray]:
    """The scaled weight and the bias vector of the folded producer."""
    producer = chain.producer
    weight = values.value(producer.operands[1])
    init = np.asarray(values.value(producer.operands[2]), np.float64)
    channels = init.shape[chain.channel_dim]
    moved = np.moveaxis(init, chain.channel_dim, 0).reshape(channels, -1)
    if not np.all(moved == moved[:, :1]):
        raise NotConstantError("an init that varies within a channel")
    shift = moved[:, 0].copy()
    scale = np.ones(channels)
    for step in chain.steps:
        s = _per_channel(step, values)
        if step.kind == "arith.addf":
            shift = shift + s
        elif step.kind == "arith.subf":
            scale, shift = (scale, shift - s) if step.chain_left else (-scale, s - shift)
        elif step.kind == "arith.mulf":
            scale, shift = scale * s, shift * s
        else:
            scale, shift = scale / s, shift / s
    scale = np.broadcast_to(scale, (channels,))
    shape = [1] * weight.ndim
    shape[chain.weight_axis] = channels
    scaled = (weight.astype(np.float64) * scale.reshape(shape)).astype(weight.dtype)
    return scaled, np.broadcast_to(shift, (channels,)).astype(weight.dtype)


def _rewrite(chain: _Chain, weight: np.ndarray, bias: np.ndarray) -> None:
    from stagegraph.mlir.bindings import arith, dialect, ir
    from stagegraph.mlir.build import generic

    producer = chain.producer
    old = [producer.operands[1], producer.operands[2], *(s.side for s in chain.steps)]
    result_type = ir.RankedTensorType(producer.results[0].type)
    rank = result_type.rank
    with ir.InsertionPoint(producer), producer.location:
        weight_type = producer.operands[1].type
        new_weight = arith.ConstantOp(
            weight_type, ir.DenseElementsAttr.get(np.ascontiguousarray(weight))
        ).result
        bias_type = ir.RankedTensorType.get([len(bias)], result_type.element_type)
        bias_value = arith.ConstantOp(
            bias_type, ir.DenseElementsAttr.get(np.ascontiguousarray(bias))
        ).result
        empty = dialect("tensor").EmptyOp(result_type.shape, result_type.element_type).result
        maps = [ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(chain.channel_dim)]),
                ir.AffineMap.get_identity(rank)]  # fmt: skip
        init = generic([bias_value], [empty], maps, ["parallel"] * rank, lambda b, _o: b)
    producer.operands[1] = new_weight
    producer.operands[2] = init
    chain.steps[-1].op.results[0].replace_all_uses_with(producer.results[0])
    for step in reversed(chain.steps):
        step.op.erase()
    _erase_dead([v for v in old if v is not None])


def _erase_dead(values: list[Any]) -> None:
    """Erase the ops defining ``values`` and their producers, as long as nothing else
    reads them (the constants and constant computations a fold left unused)."""
    from stagegraph.mlir.bindings import ir

    pending = list(values)
    erased: set[Any] = set()
    while pending:
        value = pending.pop()
        if value in erased or isinstance(value.owner, ir.Block):
            continue
        op = getattr(value.owner, "operation", value.owner)
        if any(list(result.uses) for result in op.results):
            continue
        block = op.parent
        inputs = [*op.operands, *(v for inner in children(op) for v in inner.operands)]
        inputs = [v for v in inputs if not isinstance(v.owner, ir.Block)
                  and getattr(v.owner, "operation", v.owner).parent == block]  # fmt: skip
        erased.update(op.results)
        op.erase()
        pending.extend(inputs)
