"""The implicit GEMM's patch matrix as a gather the packing of B absorbs.

``P[k, j] = X[n, c, o*s + t*d]`` with ``k = (c, t...)`` (row-major over the channel and
the taps) and ``j = (n, o...)`` (over the images and output positions): a ``linalg.generic``
over the 2-D ``[C*T, N*O]`` matrix itself, whose body takes its position
(``linalg.index``), splits it into ``(c, t...)`` and ``(n, o...)`` and reads the input
element with ``tensor.extract``. No reshape stands between it and the matmul, so the matmul
schedule can fuse it into each step that packs B's panels
(:mod:`stagegraph.stages.x86.matmul.patch_operands`): a tile of it is a ``k_step x reg_n``
block of the panel, gathered from the input into registers and stored once. The window
form (one copy over ``[C, T..., N, O...]`` with a window map, then a reshape) must be
written out whole before the packing reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stagegraph.mlir.build import collapse_shape, generic
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.matmul.patch_operands import PATCH_ATTR


def gather_worth(shape: ConvShape, config: ConvGemmConfig) -> bool:
    """Whether the implicit GEMM of ``shape`` gathers its patch matrix into B's panels
    (else the window copy): ``config.gather_patches``, an innermost stride of at least
    ``gather_min_stride``, and few channels or a large window (the measurements behind
    the knobs: :class:`~stagegraph.stages.x86.conv.config.ConvGemmConfig`)."""
    if not config.gather_patches or shape.strides[-1] < config.gather_min_stride:
        return False
    return shape.c <= config.gather_max_channels or math.prod(shape.taps) >= config.gather_min_taps


def patch_matrix(
    image: Any, shape: ConvShape, element: Any, origin: tuple[Any, Any] | None = None
) -> Any:
    """``P[(c, t), (n, o)] = X[n, c, o*s + t*d]`` of the channels-first ``image`` as a
    ``[C*T, N*O]`` tensor of ``element``, built by one gathering ``linalg.generic`` marked
    :data:`PATCH_ATTR` (see the module doc). ``origin`` (``index`` values: an image and an
    input row) offsets the first two coordinates read: a block of rows of a larger image
    (:mod:`.gemm_blocks`), which the gather reads whole.

    The gather reads the image flattened, at ``column part + row part``: the column's
    (image, output position) offset plus the row's (channel, tap) offset, in 32-bit
    integers where the image allows (16 lanes per ``vpgatherdps`` instead of 8 with 64-bit
    offsets). Packed panel by panel, a panel's column parts are the same for every row:
    LLVM hoists their divisions out of the loop over K. ``image`` must be contiguous (a
    vectorized gather reads it as one buffer): see :func:`contiguous`."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    sizes = list(ir.RankedTensorType(image.type).shape)
    flat = collapse_shape(image, [list(range(len(sizes)))], [math.prod(sizes)])
    strides = [math.prod(sizes[d + 1 :]) for d in range(len(sizes))]
    width = ir.IntegerType.get_signless(32) if math.prod(sizes) < 2**31 else ir.IndexType.get()
    base = None
    if origin is not None:  # (the block's first element, in the caller's scope)
        index = ir.IndexType.get()
        base = arith.AddIOp(
            arith.MulIOp(origin[0], arith.ConstantOp(index, strides[0]).result).result,
            arith.MulIOp(origin[1], arith.ConstantOp(index, strides[2]).result).result,
        ).result
    patches = dialect("tensor").EmptyOp([shape.depth, shape.columns], element).result
    spatial = strides[2:]

    def body(_out: Any) -> Any:
        linalg = dialect("linalg")
        row, column = (_cast(linalg.IndexOp(d).result, width) for d in (0, 1))
        channel, *taps = _split(row, [shape.c, *shape.taps])
        number, *outs = _split(column, [shape.n, *shape.out])
        row_part = _scaled(channel, strides[1])
        for tap, dilation, stride in zip(taps, shape.dilations, spatial, strict=True):
            row_part = _add(row_part, _scaled(tap, dilation * stride))
        column_part = _scaled(number, strides[0])
        for out, step, stride in zip(outs, shape.strides, spatial, strict=True):
            column_part = _add(column_part, _scaled(out, step * stride))
        offset = _add(column_part, row_part)
        if base is not None:
            offset = _add(offset, _cast(base, width))
        return dialect("tensor").ExtractOp(flat, [_cast(offset, ir.IndexType.get())]).result

    made = generic([], [patches], [ir.AffineMap.get_identity(2)], ["parallel"] * 2, body)
    made.owner.attributes[PATCH_ATTR] = ir.UnitAttr.get()
    return made


def _cast(value: Any, kind: Any) -> Any:
    """``value`` as an integer of ``kind`` (``index``/``i32`` both ways; none if equal)."""
    from stagegraph.mlir.bindings import arith

    return value if value.type == kind else arith.IndexCastOp(kind, value).result


def contiguous(image: Any, element: Any) -> Any:
    """``image``, copied into a tensor of its own when it is a slice of another (a group's
    channels, a transposed convolution's phase: a strided buffer once bufferized), which a
    vectorized gather would read as if contiguous (see :func:`patch_matrix`)."""
    from stagegraph.mlir.bindings import dialect, ir
    from stagegraph.mlir.build import named_structured_op

    owner = image.owner
    if isinstance(owner, ir.Block):
        sliced = owner.owner.name != "func.func"  # (a loop's block argument: unknown)
    else:
        sliced = owner.operation.name in ("tensor.extract_slice", "memref.subview")
    if not sliced:
        return image
    sizes = list(ir.RankedTensorType(image.type).shape)
    empty = dialect("tensor").EmptyOp(sizes, element).result
    return named_structured_op("linalg.copy", [image], [empty])


def _split(index: Any, extents: Sequence[int]) -> list[Any]:
    """``index`` (an ``index`` value below ``prod(extents)``) as row-major coordinates over
    ``extents``: divisions and remainders by the trailing extents' products."""
    coordinates = []
    for position in range(len(extents)):
        inner = math.prod(extents[position + 1 :])
        value = index
        if position:  # (the first coordinate needs no remainder: index < prod(extents))
            value = _binary("RemUIOp", value, math.prod(extents[position:]))
        if inner != 1:
            value = _binary("DivUIOp", value, inner)
        coordinates.append(value)
    return coordinates


def _binary(name: str, value: Any, constant: int) -> Any:
    from stagegraph.mlir.bindings import arith

    operand = arith.ConstantOp(value.type, constant).result
    return getattr(arith, name)(value, operand).result


def _scaled(value: Any, factor: int) -> Any:
    return value if factor == 1 else _binary("MulIOp", value, factor)


def _add(left: Any, right: Any) -> Any:
    from stagegraph.mlir.bindings import arith

    return arith.AddIOp(left, right).result
