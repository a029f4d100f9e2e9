"""A channels-last 3-D pooling becomes a 2-D pooling over height and width, then a 1-D
pooling over depth.

The generic schedule vectorizes 2-D poolings (decomposed into 1-D ones) and 1-D poolings,
but not ``linalg.pooling_ndhwc_*``: it ran as scalar loops (PyTorch's ``AvgPool3d`` through
torch-mlir, 8x16x8x8x8 at 16 times the batch, was slower than PyTorch eager). Sum, max and
min over a box window are separable:

    out[n, od, oh, ow, c] = init (+) pool_d(pool_hw(x))
    pool_hw: x as [N*D, H, W, C]  -> linalg.pooling_nhwc_*  (window KH x KW, from the identity)
    pool_d:  that as [N, D, OH*OW*C] -> linalg.pooling_nwc_*  (window KD, into the init)

Both are ops the schedule vectorizes (the second along its OH*OW*C contiguous channels).
torch-mlir imports ``AvgPool3d`` as a transpose to NDHWC, this pooling and a transpose back
(on the image read across strides, element by element): then the pooling runs on the NCDHW
image itself, ``pooling_nchw`` over [N, C*D, H, W] and ``pooling_nwc`` over depth with the
OH*OW pixels as its channels, and both transposes go.
Each window element is still combined once per output element, and for sums the order
changes as in any blocked sum. Strides and dilations carry over per dimension.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.build import collapse_shape, expand_shape, named_structured_op
from stagegraph.mlir.walk import collect, defining_op
from stagegraph.stages.x86.conv.pointwise import window_attr
from stagegraph.stages.x86.conv.transposed import _vector

#: The 3-D channels-last poolings split, by their combiner's name.
KINDS = ("sum", "max", "min")
#: Where each pooling starts its first pass: the combiner's identity.
_IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}


def separate_3d_poolings(module: Any) -> int:
    """Rewrite every static f32 ``linalg.pooling_ndhwc_{sum,max,min}`` of ``module`` as
    described above; returns how many."""
    from stagegraph.mlir.bindings import ir

    module = getattr(module, "ir", module)
    names = {f"linalg.pooling_ndhwc_{kind}": kind for kind in KINDS}
    count = 0
    for op in collect(module.operation, lambda o: o.name in names):
        kinds = [ir.RankedTensorType(v.type) for v in (*op.operands, *op.results)]
        if len(kinds) != 4 or not all(k.has_static_shape for k in kinds):
            continue
        if not isinstance(kinds[0].element_type, ir.F32Type):
            continue
        chain = _channels_first_chain(op)
        if chain is not None:  # NCDHW in and out through transposes: pool NCDHW directly
            image, back = chain
            with ir.InsertionPoint(back), back.location:
                separated = _separate_channels_first(op, names[op.name], image)
            back.results[0].replace_all_uses_with(separated)
            back.erase()
            producers = [defining_op(op.operands[0]), defining_op(op.operands[2])]
            op.erase()
            for producer in producers:  # the transpose in and the NDHWC fill, if now unread
                if not list(producer.results[0].uses):
                    producer.erase()
        else:
            with ir.InsertionPoint(op), op.location:
                separated = _separate(op, names[op.name])
            op.results[0].replace_all_uses_with(separated)
            op.erase()
        count += 1
    return count


#: torch-mlir's NCDHW -> NDHWC transpose before a channels-last pooling, and the way back.
_TO_CHANNELS_LAST, _TO_CHANNELS_FIRST = [0, 2, 3, 4, 1], [0, 4, 1, 2, 3]


def _channels_first_chain(op: Any) -> tuple[Any, Any] | None:
    """(the NCDHW image, the transpose back) when ``op`` pools a transpose of an NCDHW
    image into a fill, and its result's only reader transposes it back to NCDHW."""
    from stagegraph.mlir.bindings import ir

    def transpose(candidate: Any, permutation: list[int]) -> bool:
        return candidate is not None and candidate.name == "linalg.transpose" and list(
            ir.DenseI64ArrayAttr(candidate.attributes["permutation"])
        ) == permutation  # fmt: skip

    forward = defining_op(op.operands[0])
    init = defining_op(op.operands[2])
    uses = list(op.results[0].uses)
    if not transpose(forward, _TO_CHANNELS_LAST) or init is None or init.name != "linalg.fill":
        return None
    if len(uses) != 1 or not transpose(uses[0].owner.operation, _TO_CHANNELS_FIRST):
        return None
    return forward.operands[0], uses[0].owner.operation


def _separate_channels_first(op: Any, kind: str, image: Any) -> Any:
    """The pooling of NCDHW ``image`` as NCDHW: a 2-D ``pooling_nchw`` over [N, C*D, H, W],
    then a 1-D ``pooling_nwc`` over depth with the OH*OW pixels as its channels."""
    from stagegraph.mlir.bindings import dialect, ir

    tensor, linalg = dialect("tensor"), dialect("linalg")
    window = op.operands[1]
    start = defining_op(op.operands[2]).operands[0]  # the init fill's value
    n, channels, depth, height, width = ir.RankedTensorType(image.type).shape
    _, out_depth, out_height, out_width, _ = ir.RankedTensorType(op.results[0].type).shape
    window_depth, window_height, window_width = ir.RankedTensorType(window.type).shape
    strides, dilations = window_attr(op, "strides"), window_attr(op, "dilations")
    f32 = ir.F32Type.get()
    planes = collapse_shape(image, [[0], [1, 2], [3], [4]],
                            [n, channels * depth, height, width])  # fmt: skip
    fresh = tensor.EmptyOp([n, channels * depth, out_height, out_width], f32).result
    pooled = named_structured_op(
        f"linalg.pooling_nchw_{kind}",
        [planes, tensor.EmptyOp([window_height, window_width], f32).result],
        [linalg.fill(_identity(kind), outs=[fresh])],
        {"strides": _vector(strides[1:]), "dilations": _vector(dilations[1:])},
    )  # fmt: skip
    pixels = out_height * out_width
    split = expand_shape(pooled, [[0], [1, 2], [3], [4]],
                         [n, channels, depth, out_height, out_width])  # fmt: skip
    rows = collapse_shape(split, [[0, 1], [2], [3, 4]], [n * channels, depth, pixels])
    out = tensor.EmptyOp([n * channels, out_depth, pixels], f32).result
    done = named_structured_op(
        f"linalg.pooling_nwc_{kind}",
        [rows, tensor.EmptyOp([window_depth], f32).result],
        [linalg.fill(start, outs=[out])],
        {"strides": _vector(strides[:1]), "dilations": _vector(dilations[:1])},
    )  # fmt: skip
    return expand_shape(done, [[0, 1], [2], [3, 4]],
                        [n, channels, out_depth, out_height, out_width])  # fmt: skip


def _identity(kind: str) -> Any:
    """The f32 constant a first pass starts from."""
    from stagegraph.mlir.bindings import arith, ir

    f32 = ir.F32Type.get()
    return arith.ConstantOp(f32, ir.FloatAttr.get(f32, _IDENTITY[kind])).result


def _separate(op: Any, kind: str) -> Any:
    """The channels-last pooling ``op`` as NDHWC: ``pooling_nhwc`` then ``pooling_nwc``."""
    from stagegraph.mlir.bindings import dialect, ir

    tensor, linalg = dialect("tensor"), dialect("linalg")
    image, window, init = op.operands
    n, depth, height, width, channels = ir.RankedTensorType(image.type).shape
    _, out_depth, out_height, out_width, _ = ir.RankedTensorType(init.type).shape
    window_depth, window_height, window_width = ir.RankedTensorType(window.type).shape
    strides, dilations = window_attr(op, "strides"), window_attr(op, "dilations")
    f32 = ir.F32Type.get()

    planes = collapse_shape(image, [[0, 1], [2], [3], [4]], [n * depth, height, width, channels])
    plane_shape = [n * depth, out_height, out_width, channels]
    fresh = tensor.EmptyOp(plane_shape, f32).result
    filled = linalg.fill(_identity(kind), outs=[fresh])
    hw_window = tensor.EmptyOp([window_height, window_width], f32).result
    pooled = named_structured_op(
        f"linalg.pooling_nhwc_{kind}", [planes, hw_window], [filled],
        {"strides": _vector(strides[1:]), "dilations": _vector(dilations[1:])},
    )  # fmt: skip
    row = out_height * out_width * channels
    split = expand_shape(pooled, [[0, 1], [2], [3], [4]],
                         [n, depth, out_height, out_width, channels])  # fmt: skip
    rows = collapse_shape(split, [[0], [1], [2, 3, 4]], [n, depth, row])
    into = collapse_shape(init, [[0], [1], [2, 3, 4]], [n, out_depth, row])
    d_window = tensor.EmptyOp([window_depth], f32).result
    done = named_structured_op(
        f"linalg.pooling_nwc_{kind}", [rows, d_window], [into],
        {"strides": _vector(strides[:1]), "dilations": _vector(dilations[:1])},
    )  # fmt: skip
    return expand_shape(done, [[0], [1], [2, 3, 4]],
                        [n, out_depth, out_height, out_width, channels])  # fmt: skip
