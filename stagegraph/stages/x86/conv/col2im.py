"""Stride-1 transposed convolutions as a GEMM on their real input, then shifted adds (col2im).

PyTorch's stride-1 ``ConvTranspose`` is imported as a plain convolution of its input
zero-padded by ``P = dilation * (kernel - 1) - padding`` per side (``tensor.insert_slice``
into a zero tensor, unit strides: :mod:`stagegraph.stages.x86.conv.transposed` takes the
strided ones). Every output then sums all ``T`` taps, though near the edges most of them
read the zero border: a 3-D one of a 6^3 input and 3^3 taps multiplies 2.4 times the
useful flops, a 3x5x7 window on 8^3 3.3 times.

Here, with ``Wf`` the convolution's (flipped) filter ``[F, C, T...]``:
``Y[(f, t), (n, i)] = sum_c Wf[f, c, t] * X[n, c, i]`` is one matmul (filters and taps
the rows, every image's input positions the columns, the channels its depth) that the
packed kernel runs, on the real input only; and each tap adds its rows into the output
shifted, ``out[n, f, i - t*d + P] += Y[f, t, n, i]`` where that lands inside the output. The flops
are the useful ones; the adds cost ``T`` passes over ``N*F*I`` elements against ``2*C``
flops each.

Taken when :func:`col2im_worth` estimates it faster than the direct path on the padded
input (the model's constants are ``ConvGemmConfig`` fields) and one image's products fit
``ConvGemmConfig.col2im_max_elements``; the batch runs in blocks of images whose products
stay in L2 (:func:`images_per_block`). For a 3-D one the direct path is the channels-last
kernel, which skips the taps that read only the border: its own estimate
(:func:`~stagegraph.stages.x86.conv.choice.direct3d_cycles`) against the GEMM and adds'
(:func:`col2im_cycles`). Runs in ``x86.normalize``
before the patch GEMM.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

from stagegraph.mlir.build import collapse_shape, expand_shape, generic, named_structured_op
from stagegraph.mlir.walk import DefUse, top_level_ops
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.gemm import conv_shape, swap_leading
from stagegraph.stages.x86.conv.transposed import _only_reader, _zero_tensor


@dataclass(frozen=True)
class _Padded:
    """A convolution of an input zero-padded by ``pads`` (low side, per spatial dim)."""

    conv: Any
    source: Any  # the unpadded input [N, C, I...]
    inputs: tuple[int, ...]  # I per spatial dim
    pads: tuple[int, ...]
    images: int  # images per block (a divisor of N; all N: one block, no loop)


def useful_fraction(
    inputs: tuple[int, ...], outputs: tuple[int, ...], taps: tuple[int, ...],
    pads: tuple[int, ...], dilations: tuple[int, ...],
) -> float:  # fmt: skip
    """Of the (output, tap) pairs the padded convolution computes, the fraction that reads
    the real input: per dim, pairs with ``0 <= o + t*d - P < I``."""
    fraction = 1.0
    for size, out, tap_count, pad, d in zip(inputs, outputs, taps, pads, dilations, strict=True):
        useful = sum(len(_valid(size, out, t * d - pad)) for t in range(tap_count))
        fraction *= useful / (out * tap_count)
    return fraction


def _valid(size: int, out: int, shift: int) -> range:
    """The input positions ``i`` whose output ``i - shift`` lies in ``[0, out)``."""
    return range(max(0, shift), min(size, out + shift))


def col2im_worth(channels: int, useful: float, config: ConvGemmConfig) -> bool:
    """Whether GEMM + shifted adds beat the direct path, per useful flop: the GEMM runs at
    ``gemm_efficiency`` of the peak and each of its results (``2 * channels`` flops) costs
    one shifted add (``add_cost`` flops of time); the direct path runs at
    ``direct_efficiency`` but only ``useful`` of its flops count."""
    col2im = 1 / config.gemm_efficiency + config.add_cost / (2 * channels)
    return col2im < 1 / (useful * config.direct_efficiency)


def col2im_cycles(shape: Any, useful: float, target: Any, config: ConvGemmConfig) -> float:
    """Cycles of the GEMM on the real input and the shifted adds: the useful flops at
    ``gemm_efficiency`` of the target's FMA peak, each product's add at ``add_cost``."""
    from stagegraph.stages.x86.conv.choice import flops
    from stagegraph.stages.x86.conv.rates import peak_per_cycle

    per_flop = 1 / config.gemm_efficiency + config.add_cost / (2 * shape.c)
    return flops(shape) * useful / peak_per_cycle(target, "f32") * per_flop


def _worth(match: _Padded, shape: Any, useful: float, config: ConvGemmConfig, target: Any) -> bool:
    """:func:`col2im_worth`, or for a 3-D convolution on a known target, the GEMM and adds
    against the 3-D direct kernel's own estimate on the padded input."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.conv.choice import direct3d_cycles

    if target is not None and config.direct3d and len(shape.taps) == 3:
        element = str(ir.RankedTensorType(match.conv.operands[2].type).element_type)
        padding = list(zip(match.inputs, match.pads, strict=True))
        direct = direct3d_cycles(shape, target, config, element, padding)
        if direct is not None:
            return col2im_cycles(shape, useful, target, config) < direct
    return col2im_worth(shape.c, useful, config)


def stride1_transposed_to_col2im(
    module: Any, config: ConvGemmConfig | None = None, target: Target | None = None
) -> int:
    """Rewrite every channels-first convolution of a zero-padded input that
    :func:`col2im_worth` takes (see the module), in blocks of images whose products fit
    ``config.col2im_block_l2_fraction`` of ``target``'s L2 (default: the host's); returns
    the count."""
    config = config or ConvGemmConfig()
    if not config.conv_gemm or not config.col2im:
        return 0
    if target is None:
        from stagegraph.stages.target import detect_target

        target = detect_target()
    cached = int(target.l2_bytes * config.col2im_block_l2_fraction)
    count = 0
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        uses = DefUse(fn)
        found = [
            m
            for op in top_level_ops(fn)
            if (m := _match(op, uses, config, target, cached)) is not None
        ]
        for match in found:
            _rewrite(match)
        count += len(found)
    return count


def _match(
    op: Any, uses: DefUse, config: ConvGemmConfig, target: Target, cached: int
) -> _Padded | None:
    from stagegraph.mlir.bindings import ir

    shape = conv_shape(op)
    if shape is None or any(s != 1 for s in shape.strides):
        return None
    if op.operands[2] == op.operands[0] or not _only_reader(op.operands[0], op, uses):
        return None
    padded = uses.owner(op.operands[0])
    if padded is None or padded.name != "tensor.insert_slice" or len(padded.operands) != 2:
        return None
    if _zero_tensor(padded.operands[1], uses) is None:
        return None
    source = padded.operands[0]
    source_shape = list(ir.RankedTensorType(source.type).shape)
    offsets = list(ir.DenseI64ArrayAttr(padded.attributes["static_offsets"]))
    sizes = list(ir.DenseI64ArrayAttr(padded.attributes["static_sizes"]))
    steps = list(ir.DenseI64ArrayAttr(padded.attributes["static_strides"]))
    if sizes != source_shape or any(s != 1 for s in steps) or offsets[:2] != [0, 0]:
        return None
    if source_shape[:2] != [shape.n, shape.c]:
        return None
    inputs, pads = tuple(source_shape[2:]), tuple(offsets[2:])
    fraction = useful_fraction(inputs, shape.out, shape.taps, pads, shape.dilations)
    per_image = shape.f * math.prod(shape.taps) * math.prod(inputs)
    element = ir.RankedTensorType(op.results[0].type).element_type
    bytes_ = max(1, getattr(element, "width", 32) // 8)
    images = images_per_block(shape.n, per_image, config.col2im_max_elements, cached // bytes_)
    if not images:
        return None
    match = _Padded(op, source, inputs, pads, images)
    return match if _worth(match, shape, fraction, config, target) else None


def images_per_block(images: int, per_image: int, most: int, cached: int) -> int:
    """Images per block of the GEMM and its adds: 0 (no col2im) when one image's products
    (``per_image`` elements) exceed ``most``; else the most images, a divisor of
    ``images``, whose products fit ``cached`` elements (the caches' share), at least one.

    A block's products are made, then added, before the next block's, so they are read
    back from the cache they were written to. Made for the whole batch at once they
    streamed through memory, and a batch too large for ``most`` (KernelBench's l1_065 at
    16x its size: 11M elements) fell back to the direct path, whose work on the zero
    border is wasted."""
    if per_image > most:
        return 0
    for count in range(images, 0, -1):
        if images % count == 0 and count * per_image <= cached:
            return count
    return 1


def _rewrite(match: _Padded) -> None:
    from stagegraph.mlir.bindings import ir

    op = match.conv
    shape = conv_shape(op)
    with ir.InsertionPoint(op), op.location:
        if match.images == shape.n:
            result = _col2im(match, shape, op.operands[2])
        else:
            result = _image_blocks(match, shape)
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _col2im(match: _Padded, shape: Any, result: Any) -> Any:
    """``result`` plus every tap's products of ``match.source`` (all of ``shape.n``)."""
    products = _tap_products(match, shape)
    for tap in itertools.product(*(range(t) for t in shape.taps)):
        result = _add_tap(result, products, match, shape, tap)
    return result


def _image_blocks(match: _Padded, shape: Any) -> Any:
    """An ``scf.for`` over blocks of ``match.images`` images, each the GEMM and shifted adds
    of its slice of the input into its slice of the output."""
    from stagegraph.mlir.bindings import arith, ir, scf

    index = ir.IndexType.get()

    def constant(value: int) -> Any:
        return arith.ConstantOp(index, value).result

    count = match.images
    init = match.conv.operands[2]
    loop = scf.ForOp(constant(0), constant(shape.n), constant(count), [init])
    with ir.InsertionPoint(loop.body):
        first, acc = loop.induction_variable, loop.inner_iter_args[0]
        block = replace(match, source=_images(match.source, first, count))
        summed = _col2im(block, replace(shape, n=count), _images(acc, first, count))
        scf.YieldOp([_images(acc, first, count, summed)])
    return loop.results[0]


def _images(value: Any, first: Any, count: int, inserted: Any = None) -> Any:
    """Images ``first ..< first + count`` of ``value`` (``[N, ...]``), or ``inserted``
    written there."""
    from stagegraph.mlir.bindings import dialect, ir

    tensor = dialect("tensor")
    source = ir.RankedTensorType(value.type)
    sizes = [count, *source.shape[1:]]
    offsets = [ir.ShapedType.get_dynamic_stride_or_offset(), *[0] * (source.rank - 1)]
    ones = [1] * source.rank
    if inserted is not None:
        return tensor.InsertSliceOp(inserted, value, [first], [], [], offsets, sizes, ones).result
    result = ir.RankedTensorType.get(sizes, source.element_type)
    return tensor.ExtractSliceOp(result, value, [first], [], [], offsets, sizes, ones).result


def _tap_products(match: _Padded, shape: Any) -> Any:
    """``Y[f, t..., n, i...] = sum_c Wf[f, c, t] X[n, c, i]``: one matmul for all images
    (the input's positions of every image its columns: one parallel loop, not one per
    image), as ``[F, T..., N, I...]``."""
    from stagegraph.mlir.bindings import dialect, ir

    tensor = dialect("tensor")
    rank, taps = len(shape.taps), math.prod(shape.taps)
    kernel = match.conv.operands[1]
    element = ir.RankedTensorType(kernel.type).element_type
    columns = shape.n * math.prod(match.inputs)
    rows = shape.f * taps
    # Wf [F, C, T...] -> [F, T..., C] -> [(F, T), C]
    order = [0, *range(2, rank + 2), 1]
    empty = tensor.EmptyOp([shape.f, *shape.taps, shape.c], element).result
    permutation = {"permutation": ir.DenseI64ArrayAttr.get(order)}
    by_tap = named_structured_op("linalg.transpose", [kernel], [empty], permutation)
    weights = collapse_shape(by_tap, [list(range(rank + 1)), [rank + 1]], [rows, shape.c])
    # X [N, C, I...] -> [C, (N, I...)]
    by_channel = swap_leading(match.source, element)
    image = collapse_shape(by_channel, [[0], list(range(1, rank + 2))], [shape.c, columns])
    zero = dialect("arith").ConstantOp(element, 0.0).result
    init = tensor.EmptyOp([rows, columns], element).result
    acc = named_structured_op("linalg.fill", [zero], [init])
    made = named_structured_op("linalg.matmul", [weights, image], [acc])
    groups = [list(range(rank + 1)), list(range(rank + 1, 2 * rank + 2))]
    return expand_shape(made, groups, [shape.f, *shape.taps, shape.n, *match.inputs])


def _add_tap(result: Any, products: Any, match: _Padded, shape: Any, tap: tuple) -> Any:
    """``result[n, f, i - t*d + P] += Y[f, t, n, i]`` over the valid ``i`` of tap ``t``."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    tensor = dialect("tensor")
    rank = len(shape.taps)
    ranges = [
        _valid(size, out, t * d - pad)
        for size, out, t, d, pad in zip(
            match.inputs, shape.out, tap, shape.dilations, match.pads, strict=True
        )
    ]
    if any(len(r) == 0 for r in ranges):
        return result  # the tap only ever reads the zero border
    element = ir.RankedTensorType(result.type).element_type
    lengths = [len(r) for r in ranges]
    block = ir.RankedTensorType.get([shape.n, shape.f, *lengths], element)
    starts = [r.start - t * d + pad for r, t, d, pad in
              zip(ranges, tap, shape.dilations, match.pads, strict=True)]  # fmt: skip
    out_offsets, out_sizes = [0, 0, *starts], [shape.n, shape.f, *lengths]
    ones = [1] * (rank + 2)
    region = tensor.ExtractSliceOp(block, result, [], [], [], out_offsets, out_sizes, ones)
    y_offsets = [0, *tap, 0, *(r.start for r in ranges)]
    y_sizes = [shape.f, *[1] * rank, shape.n, *lengths]
    y_block = ir.RankedTensorType.get([shape.f, shape.n, *lengths], element)
    rows = tensor.ExtractSliceOp(
        y_block, products, [], [], [], y_offsets, y_sizes, [1] * (2 * rank + 2)
    )
    identity = ir.AffineMap.get_identity(rank + 2)
    d = [ir.AffineDimExpr.get(i) for i in range(rank + 2)]
    by_filter = ir.AffineMap.get(rank + 2, 0, [d[1], d[0], *d[2:]])  # Y[f, n, o...]
    added = generic(
        [rows.result], [region.result], [by_filter, identity], ["parallel"] * (rank + 2),
        lambda y, out: arith.AddFOp(out, y).result,
    )  # fmt: skip
    return tensor.InsertSliceOp(added, result, [], [], [], out_offsets, out_sizes, ones).result
