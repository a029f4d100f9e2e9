"""Pointwise (1x1) convolutions become matmuls before the analysis sees them.

A convolution whose window is one element is a matmul over the channels, but as a
convolution it takes the generic schedule's convolution path, which leaves a window of one
to scalar loops. Rewritten here, before the analysis, it is a ``linalg.matmul`` (NHWC: the
pixels are the rows) or a ``linalg.batch_matmul`` (NCHW: per image, filter x pixels), so
the cost model gives it matmul params and the schedule its packed micro-kernel. On Zen 1
(AVX2, one thread) the scalar loops ran 3.4-6x slower than IREE on EfficientNet's 1x1
convolutions.

A stride becomes a strided slice of the input first (the pixels the window visits); the
dilation of a one-element window changes nothing.
"""

from __future__ import annotations

from typing import Any

from stagegraph.dtypes import is_float
from stagegraph.mlir.build import collapse_shape, expand_shape, generic, named_structured_op
from stagegraph.mlir.walk import top_level_ops

# Layout of each pointwise-capable convolution: where the channels sit in the image.
_LAYOUTS = {
    "linalg.conv_2d_nchw_fchw": "nchw",
    "linalg.conv_2d_nhwc_hwcf": "nhwc",
    "linalg.conv_2d_ngchw_gfchw": "ngchw",
}


def pointwise_convolutions_to_matmuls(module: Any) -> int:
    """Rewrite every static pointwise 2-D convolution of ``module``'s functions (NCHW/FCHW,
    NHWC/HWCF or grouped NGCHW/GFCHW, one element type throughout) into a matmul between
    reshapes; returns the count. Other convolutions are left as they are."""
    found = [
        op
        for fn in top_level_ops(module.operation)
        if fn.name == "func.func"
        for op in top_level_ops(fn)
        if _pointwise(op)
    ]
    if not found:
        return 0  # no dialect module imported for payloads without one
    for op in found:
        _rewrite(op)
    return len(found)


def window_attr(op: Any, name: str) -> list[int]:
    """A convolution's or pooling's ``strides`` or ``dilations``; a named op may omit them
    (then 1 per spatial dim: ``conv_2d_*`` has two; a pooling, its image's rank less batch
    and channels)."""
    from stagegraph.mlir.bindings import ir

    if name in op.attributes:
        return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]
    for spatial in (1, 2, 3):
        if f"_{spatial}d_" in op.name:
            return [1] * spatial
    return [1] * (ir.RankedTensorType(op.operands[0].type).rank - 2)


def _pointwise(op: Any) -> bool:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.types import element_name

    if op.name not in _LAYOUTS or len(op.operands) != 3 or len(op.results) != 1:
        return False
    types = [op.operands[i].type for i in range(3)]
    if not all(isinstance(t, ir.RankedTensorType) for t in types):
        return False
    shaped = [ir.RankedTensorType(t) for t in types]
    if not all(t.has_static_shape for t in shaped):
        return False
    elements = {element_name(t.element_type) for t in shaped}
    if len(elements) != 1 or not is_float(elements.pop() or ""):
        return False
    layout = _LAYOUTS[op.name]
    window = {"nchw": shaped[1].shape[2:], "nhwc": shaped[1].shape[:2]}.get(
        layout, shaped[1].shape[3:]
    )
    return all(size == 1 for size in window)


def _rewrite(op: Any) -> None:
    from stagegraph.mlir.bindings import ir

    image, kernel, init = op.operands
    out_shape = list(ir.RankedTensorType(init.type).shape)
    element = ir.RankedTensorType(init.type).element_type
    strides = window_attr(op, "strides")
    with ir.InsertionPoint(op), op.location:
        layout = _LAYOUTS[op.name]
        if layout == "nchw":
            result = _nchw(_visited(image, out_shape, (2, 3), strides), kernel, init, element)
        elif layout == "ngchw":
            result = _ngchw(_visited(image, out_shape, (3, 4), strides), kernel, init, element)
        else:
            result = _nhwc(_visited(image, out_shape, (1, 2), strides), kernel, init)
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _visited(image: Any, out_shape: list[int], spatial: tuple[int, int], strides: list[int]):
    """The pixels of ``image`` the one-element window visits: all of them with unit
    strides, else a strided slice with the output's spatial shape."""
    from stagegraph.mlir.bindings import dialect, ir

    if all(s == 1 for s in strides):
        return image
    source = ir.RankedTensorType(image.type)
    sizes = list(source.shape)
    steps = [1] * len(sizes)
    for dim, stride in zip(spatial, strides, strict=True):
        sizes[dim], steps[dim] = out_shape[dim], stride
    result = ir.RankedTensorType.get(sizes, source.element_type)
    tensor = dialect("tensor")
    return tensor.ExtractSliceOp(result, image, [], [], [], [0] * len(sizes), sizes, steps).result


def _nchw(image: Any, kernel: Any, init: Any, element: Any) -> Any:
    """out[n, f, p] = sum_c W[f, c] * X[n, c, p]: per image, filters x pixels."""
    from stagegraph.mlir.bindings import ir

    n, channels, height, width = ir.RankedTensorType(image.type).shape
    filters = ir.RankedTensorType(kernel.type).shape[0]
    pixels = height * width
    weights = collapse_shape(kernel, [[0], [1, 2, 3]], [filters, channels])
    if n == 1:
        pixels_of = collapse_shape(image, [[0, 1], [2, 3]], [channels, pixels])
        acc = _init(init, [[0, 1], [2, 3]], [filters, pixels])
        made = named_structured_op("linalg.matmul", [weights, pixels_of], [acc])
        return expand_shape(made, [[0, 1], [2, 3]], [1, filters, height, width])
    pixels_of = collapse_shape(image, [[0], [1], [2, 3]], [n, channels, pixels])
    # The filters once per image: batch_matmul's operands index the batch loop (the copy is
    # filters x channels per image against filters x channels x pixels multiply-adds).
    per_image = _empty([n, filters, channels], element)
    d = [ir.AffineDimExpr.get(i) for i in range(3)]
    broadcast = generic(
        [weights],
        [per_image],
        [ir.AffineMap.get(3, 0, [d[1], d[2]]), ir.AffineMap.get_identity(3)],
        ["parallel"] * 3,
        lambda value, _out: value,
    )
    acc = _init(init, [[0], [1], [2, 3]], [n, filters, pixels])
    made = named_structured_op("linalg.batch_matmul", [broadcast, pixels_of], [acc])
    return expand_shape(made, [[0], [1], [2, 3]], [n, filters, height, width])


def _ngchw(image: Any, kernel: Any, init: Any, element: Any) -> Any:
    """Grouped: out[(n, g), f, p] = sum_c W[g, f, c] * X[(n, g), c, p], one matmul per
    image and group (the filters of a group once per image)."""
    from stagegraph.mlir.bindings import ir

    n, groups, channels, height, width = ir.RankedTensorType(image.type).shape
    filters = ir.RankedTensorType(kernel.type).shape[1]
    batch, pixels = n * groups, height * width
    weights = collapse_shape(kernel, [[0], [1], [2, 3, 4]], [groups, filters, channels])
    per_image = _empty([n, groups, filters, channels], element)
    d = [ir.AffineDimExpr.get(i) for i in range(4)]
    broadcast = generic(
        [weights],
        [per_image],
        [ir.AffineMap.get(4, 0, [d[1], d[2], d[3]]), ir.AffineMap.get_identity(4)],
        ["parallel"] * 4,
        lambda value, _out: value,
    )
    filters_of = collapse_shape(broadcast, [[0, 1], [2], [3]], [batch, filters, channels])
    pixels_of = collapse_shape(image, [[0, 1], [2], [3, 4]], [batch, channels, pixels])
    acc = _init(init, [[0, 1], [2], [3, 4]], [batch, filters, pixels])
    made = named_structured_op("linalg.batch_matmul", [filters_of, pixels_of], [acc])
    return expand_shape(made, [[0, 1], [2], [3, 4]], [n, groups, filters, height, width])


def _nhwc(image: Any, kernel: Any, init: Any) -> Any:
    """out[(n, h, w), f] = sum_c X[(n, h, w), c] * W[c, f]: the pixels are the rows."""
    from stagegraph.mlir.bindings import ir

    n, height, width, channels = ir.RankedTensorType(image.type).shape
    filters = ir.RankedTensorType(kernel.type).shape[3]
    rows = n * height * width
    pixels_of = collapse_shape(image, [[0, 1, 2], [3]], [rows, channels])
    weights = collapse_shape(kernel, [[0, 1, 2], [3]], [channels, filters])
    acc = _init(init, [[0, 1, 2], [3]], [rows, filters])
    made = named_structured_op("linalg.matmul", [pixels_of, weights], [acc])
    return expand_shape(made, [[0, 1, 2], [3]], [n, height, width, filters])


def _init(init: Any, groups: list[list[int]], shape: list[int]) -> Any:
    """The accumulator in the matmul's shape: a fill of the same value when ``init`` is a
    fill (the matmul schedule fuses a fill into its tiles), else ``init`` reshaped."""
    from stagegraph.mlir.bindings import ir

    owner = init.owner
    if isinstance(owner, ir.Operation | ir.OpView) and owner.operation.name == "linalg.fill":
        value = owner.operation.operands[0]
        empty = _empty(shape, ir.RankedTensorType(init.type).element_type)
        return named_structured_op("linalg.fill", [value], [empty])
    return collapse_shape(init, groups, shape)


def _empty(shape: list[int], element: Any) -> Any:
    from stagegraph.mlir.bindings import dialect

    return dialect("tensor").EmptyOp(shape, element).result
