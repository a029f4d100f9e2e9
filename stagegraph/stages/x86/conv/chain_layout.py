"""Channels-last through a model's chain of convolutions, decided in ``x86.normalize``.

The generic schedule runs an NCHW convolution channels-last between transposes
(:func:`stagegraph.stages.x86.conv.rewrites.conv_to_channels_last`), and its ``prepare``
sinks the transposes back to NCHW until they cancel the next convolution's
(:mod:`stagegraph.stages.x86.generic.layout_sinking`). But a model with more ops than
``ScheduleConfig.deduplicate_above`` is cut into repeated groups of ops before that
(:mod:`stagegraph.stages.common.dedup`), each scheduled as a function of its own: a chain
crossing from one group into the next keeps its transposes at the boundary. Here, once
``x86.normalize`` has decided each convolution's path (the GEMM ones are matmuls by now),
the 2-D convolutions left for the direct path go channels-last and the transposes sink
through the whole entry function, before any group is cut: the groups are then made of
channels-last ops, and their boundaries carry channels-last tensors.

3-D, depthwise and grouped convolutions keep their own rewrites in ``prepare`` (the
schedule's params choose between their forms).
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import top_level_ops
from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE
from stagegraph.stages.x86.conv.rewrites import (
    _CHANNEL_GROUP,
    _CHANNELS_LAST,
    _replace_by_transposed,
)

_NCHW = "linalg.conv_2d_nchw_fchw"


def carry_channels_last(module: Any) -> int:
    """Rewrite every static 2-D NCHW convolution of ``module``'s functions whose filters
    fill whole vectors channels-last (its path decision kept on the new op), then sink the
    transposes between them; returns how many convolutions were rewritten."""
    from stagegraph.stages.x86.generic.layout_sinking import (
        SINKS_ATTRIBUTE,
        sink_channels_last_transposes,
    )
    from stagegraph.stages.x86.generic.prepare import drop_dead_results, erase_unused_tensor_ops

    rewritten = 0
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func" or not fn.regions[0].blocks:
            continue
        here = sum(_to_channels_last(op) for op in top_level_ops(fn) if op.name == _NCHW)
        marked = any(SINKS_ATTRIBUTE in op.attributes for op in top_level_ops(fn))
        if here or marked:  # (marked: Winograd's results, conv/winograd.py)
            drop_dead_results(fn)  # an unused argmax next to a max: no index loop to carry
            sink_channels_last_transposes(fn)
            erase_unused_tensor_ops(fn)
        rewritten += here
    return rewritten


def _to_channels_last(op: Any) -> bool:
    if len(op.operands) != 3:
        return False
    if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
        return False
    if ir.RankedTensorType(op.operands[1].type).shape[0] % _CHANNEL_GROUP:
        return False  # partial vectors along the channels: prepare leaves it NCHW too
    decision = op.attributes[PATH_ATTRIBUTE] if PATH_ATTRIBUTE in op.attributes else None  # noqa: SIM401 (no .get)
    block = op.operation.block
    before = set(top_level_ops_of(block))
    name, to_last, filter_to_last, to_first = _CHANNELS_LAST[_NCHW]
    _replace_by_transposed(op, name, to_last, filter_to_last, to_first)
    if decision is not None:
        for made in top_level_ops_of(block):
            if made not in before and made.name == f"linalg.{name}":
                made.attributes[PATH_ATTRIBUTE] = decision
    return True


def top_level_ops_of(block: Any) -> list[Any]:
    """The ops of ``block`` (their ``OpView``s)."""
    return [op.operation for op in block.operations]
