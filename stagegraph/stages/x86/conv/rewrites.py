"""Convolution rewrites run before the generic schedule (see
:mod:`stagegraph.stages.x86.generic.prepare`): 3-D
convolutions as depth loops of 2-D ones, grouped convolutions as loops over groups, NCHW
depthwise convolutions channels-last. Each makes a form the schedule vectorizes."""

from __future__ import annotations

from typing import Any

import numpy as np

from stagegraph.mlir.bindings import arith, ir, scf, tensor
from stagegraph.mlir.build import named_structured_op, transposed
from stagegraph.mlir.walk import top_level_ops
from stagegraph.stages.x86.conv.pointwise import window_attr

# 3-D convolution -> the 2-D one of a depth slice, and the depth dim of (input, filter,
# output) in its layout.
_CONV_3D_TO_2D = {
    "linalg.conv_3d_ncdhw_fcdhw": ("conv_2d_nchw_fchw", (2, 2, 2)),
    "linalg.conv_3d_ndhwc_dhwcf": ("conv_2d_nhwc_hwcf", (1, 0, 1)),
}


def _ints(attr: Any) -> list[int]:
    return [int(v) for v in ir.DenseIntElementsAttr(attr)]


def _window(shape: list[int], dim: int) -> tuple[list[int], list[int]]:
    """Static offsets and sizes of one slice along ``dim`` (its offset is dynamic)."""
    offsets = [0] * len(shape)
    offsets[dim] = ir.ShapedType.get_dynamic_stride_or_offset()
    return offsets, [*shape[:dim], 1, *shape[dim + 1 :]]


def _slice(source: Any, dim: int, offset: Any) -> Any:
    """``source`` at ``offset`` along ``dim``, without that dim."""
    source_type = ir.RankedTensorType(source.type)
    shape = source_type.shape
    offsets, sizes = _window(shape, dim)
    result = ir.RankedTensorType.get(shape[:dim] + shape[dim + 1 :], source_type.element_type)
    made = tensor.ExtractSliceOp(result, source, [offset], [], [], offsets, sizes, [1] * len(shape))
    return made.result


def _insert_slice(value: Any, dest: Any, dim: int, offset: Any) -> Any:
    shape = ir.RankedTensorType(dest.type).shape
    offsets, sizes = _window(shape, dim)
    made = tensor.InsertSliceOp(value, dest, [offset], [], [], offsets, sizes, [1] * len(shape))
    return made.result


def _index_constant(value: int) -> Any:
    """An ``index`` constant at the current insertion point."""
    return arith.ConstantOp(ir.IndexType.get(), value).result


def conv3d_to_conv2d_loops(fn: Any) -> int:
    """Rewrite each static 3-D convolution as ``for od: for kd: out[od] += conv2d(in[d],
    filter[kd])`` with ``d = od * stride + kd * dilation``; returns the count."""
    count = 0
    for op in top_level_ops(fn):
        plan = _CONV_3D_TO_2D.get(op.name)
        if plan is None or len(op.operands) != 3:
            continue
        image, kernel, init = op.operands
        if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
            continue
        name, (image_dim, kernel_dim, out_dim) = plan
        strides, dilations = window_attr(op, "strides"), window_attr(op, "dilations")
        depth = ir.RankedTensorType(init.type).shape[out_dim]
        kernel_depth = ir.RankedTensorType(kernel.type).shape[kernel_dim]
        with ir.InsertionPoint(op), op.location:
            zero, one = _index_constant(0), _index_constant(1)
            over_depth = scf.ForOp(zero, _index_constant(depth), one, [init])
            with ir.InsertionPoint(over_depth.body):
                od, acc = over_depth.induction_variable, over_depth.inner_iter_args[0]
                plane = _slice(acc, out_dim, od)
                over_kernel = scf.ForOp(zero, _index_constant(kernel_depth), one, [plane])
                with ir.InsertionPoint(over_kernel.body):
                    kd, partial = over_kernel.induction_variable, over_kernel.inner_iter_args[0]
                    start = arith.MulIOp(od, _index_constant(strides[0])).result
                    step = arith.MulIOp(kd, _index_constant(dilations[0])).result
                    d = arith.AddIOp(start, step).result
                    summed = _convolution(
                        name,
                        _slice(image, image_dim, d),
                        _slice(kernel, kernel_dim, kd),
                        partial,
                        strides[1:],
                        dilations[1:],
                    )
                    scf.YieldOp([summed])
                scf.YieldOp([_insert_slice(over_kernel.results[0], acc, out_dim, od)])
        op.results[0].replace_all_uses_with(over_depth.results[0])
        op.erase()
        count += 1
    return count


# ----------------------------------------------------------------------------- grouped 2-D

# Grouped convolution -> the convolution of one group, and the group dim of (input,
# filter, output) in its layout.
_GROUPED = {"linalg.conv_2d_ngchw_gfchw": ("conv_2d_nchw_fchw", (1, 0, 1))}


def grouped_conv_to_group_loops(fn: Any) -> int:
    """Rewrite each static grouped 2-D convolution as a loop over the groups of plain 2-D
    convolutions (which decompose and vectorize); returns the count."""
    count = 0
    for op in top_level_ops(fn):
        plan = _GROUPED.get(op.name)
        if plan is None or len(op.operands) != 3:
            continue
        if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
            continue
        name, (image_dim, kernel_dim, out_dim) = plan
        image, kernel, init = op.operands
        groups = ir.RankedTensorType(init.type).shape[out_dim]
        with ir.InsertionPoint(op), op.location:
            zero, one = _index_constant(0), _index_constant(1)
            over_groups = scf.ForOp(zero, _index_constant(groups), one, [init])
            with ir.InsertionPoint(over_groups.body):
                g, acc = over_groups.induction_variable, over_groups.inner_iter_args[0]
                summed = _convolution(
                    name,
                    _slice(image, image_dim, g),
                    _slice(kernel, kernel_dim, g),
                    _slice(acc, out_dim, g),
                    window_attr(op, "strides"),
                    window_attr(op, "dilations"),
                )
                scf.YieldOp([_insert_slice(summed, acc, out_dim, g)])
        op.results[0].replace_all_uses_with(over_groups.results[0])
        op.erase()
        count += 1
    return count


# ----------------------------------------------------------------------------- depthwise NCHW

_NCHW_TO_NHWC, _NHWC_TO_NCHW, _CHW_TO_HWC = [0, 2, 3, 1], [0, 3, 1, 2], [1, 2, 0]
# Channels-last pays when the channels fill whole vectors (8 f32 lanes on AVX2, 16 on
# AVX-512; measured: docs/measurements.md, "Design decisions: the generic schedule").
_CHANNEL_GROUP = 8


def _convolution(
    name: str, image: Any, kernel: Any, init: Any, strides: list[int], dilations: list[int]
) -> Any:
    """The named convolution ``linalg.<name>`` of ``image`` and ``kernel`` into ``init``.

    Built generically (:func:`~stagegraph.mlir.build.named_structured_op`): the bindings'
    OpDSL builders import the linalg module, 0.18 s of a 1.2 s compile."""
    i64 = ir.IntegerType.get_signless(64)
    window = {
        key: ir.DenseElementsAttr.get(
            np.asarray(values, dtype=np.int64), type=i64, shape=[len(values)]
        )
        for key, values in (("strides", strides), ("dilations", dilations))
    }
    return named_structured_op(f"linalg.{name}", [image, kernel], [init], window)


def _replace_by_transposed(
    op: Any, name: str, to_last: list[int], filter_to_last: list[int], to_first: list[int]
) -> None:
    """Replace the convolution ``op`` (image, filter, init) by ``linalg.<name>`` (its
    channels-last form, same strides and dilations) on transposed operands, transposed
    back."""
    image, kernel, init = op.operands
    with ir.InsertionPoint(op), op.location:
        summed = _convolution(
            name,
            transposed(image, to_last),
            transposed(kernel, filter_to_last),
            transposed(init, to_last),
            window_attr(op, "strides"),
            window_attr(op, "dilations"),
        )
        result = transposed(summed, to_first)
    op.results[0].replace_all_uses_with(result)
    op.erase()


def depthwise_to_channels_last(fn: Any) -> int:
    """Rewrite each static ``depthwise_conv_2d_nchw_chw`` as transposes around
    ``depthwise_conv_2d_nhwc_hwc``, which decomposes to a 1-D depthwise convolution that
    vectorizes along the channels (the NCHW form has no decomposition); returns the count."""
    count = 0
    for op in top_level_ops(fn):
        if op.name != "linalg.depthwise_conv_2d_nchw_chw" or len(op.operands) != 3:
            continue
        if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
            continue
        kernel = op.operands[1]
        channels, *_, width = ir.RankedTensorType(kernel.type).shape
        if width == 1:
            continue  # a one-wide window: the loops run along the contiguous width already
        if channels % _CHANNEL_GROUP:
            continue  # vectors along the channels would be partial ones
        _replace_by_transposed(
            op, "depthwise_conv_2d_nhwc_hwc", _NCHW_TO_NHWC, _CHW_TO_HWC, _NHWC_TO_NCHW
        )
        count += 1
    return count


# ----------------------------------------------------------------------------- NCHW 2-D

# Channels-first convolution -> its channels-last form and the permutations of (input,
# filter, output) into it; the output's way back is the inverse of the first.
_CHANNELS_LAST = {
    "linalg.conv_2d_nchw_fchw": ("conv_2d_nhwc_hwcf", [0, 2, 3, 1], [2, 3, 1, 0], [0, 3, 1, 2]),
    "linalg.conv_3d_ncdhw_fcdhw": (
        "conv_3d_ndhwc_dhwcf",
        [0, 2, 3, 4, 1],
        [2, 3, 4, 1, 0],
        [0, 4, 1, 2, 3],
    ),
}


def conv_to_channels_last(fn: Any, takes_any_filters: Any = None) -> int:
    """Rewrite each static NCHW (NCDHW) convolution whose output channels fill whole vectors
    as transposes around the NHWC (NDHWC) one; returns the count. Run it before
    :func:`conv3d_to_conv2d_loops`, which takes both 3-D layouts.

    Both forms decompose to a 1-D convolution that vectorizes along the output channels,
    but in NCW the channels are strided: every tile gathers its accumulators and filter
    taps element by element (``vector.from_elements``) and scatters them back. Channels-last
    reads them as contiguous vectors; the transposes are linear in the tensors, the
    convolution is not (measured: docs/measurements.md, "Design decisions: the generic schedule").
    A window one element wide (a ``(3, 3, 1)`` filter) gathers the same way in NCW, so it
    goes channels-last too (a 3-D one at 3 -> 16 channels: 5x faster, see
    docs/measurements.md, "Convolutions whose window is one element wide").
    ``takes_any_filters(op)``: whether a convolution whose filters do not fill whole vector
    groups goes channels-last anyway (the 3-D direct kernel, which masks its last vector).
    """
    count = 0
    for op in top_level_ops(fn):
        plan = _CHANNELS_LAST.get(op.name)
        if plan is None or len(op.operands) != 3:
            continue
        if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
            continue
        name, to_last, filter_to_last, to_first = plan
        kernel = op.operands[1]
        filters = ir.RankedTensorType(kernel.type).shape[0]
        if filters % _CHANNEL_GROUP and not (takes_any_filters and takes_any_filters(op)):
            continue  # partial vectors along the channels
        _replace_by_transposed(op, name, to_last, filter_to_last, to_first)
        count += 1
    return count


# ----------------------------------------------------------------------------- entry
