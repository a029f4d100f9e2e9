"""The implicit GEMM of one image in blocks of output rows, so each block's patch matrix
stays in L2.

One image's patch matrix (:mod:`stagegraph.stages.x86.conv.gemm`) holds ``C*T`` rows of
every output position: 7.2 MB for ResNet-18's 64-channel 3x3 layers at 56x56, 7.4 MB for
its 7x7 first layer. Built whole, it is written to memory and read back by the matmul's
packing of B: measured with ``perf`` on the 56x56 layer, the patch copy took 27% of the
time and the packing 29%, the micro-kernel 43%. In blocks of output rows (the first
spatial dim) whose patch matrix fits ``ConvGemmConfig.patch_block_l2_fraction`` of L2,
the copy writes to L2 and the packing reads it from there. The blocks are one ``scf.for``
(one matmul for the schedule and one kernel for LLVM): per block, the input rows its
window reads, their patches, and a matmul accumulating into the output's rows, written back
in place (``tensor.extract_slice``/``insert_slice`` pairs on the loop's accumulator).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from stagegraph.dtypes import byte_size
from stagegraph.mlir.build import collapse_shape, expand_shape, named_structured_op
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.bias_epilogue import bias_of, biased_block
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape


def block_rows(shape: ConvShape, target: Target, config: ConvGemmConfig, element: str) -> int:
    """Output rows (of the first spatial dim) per block: the most whose patch matrix fits
    ``patch_block_l2_fraction`` of L2 (one image's rows: several images run one by one),
    a divisor of the rows (every block the same shape), at least rows /
    ``max_patch_blocks``, whose columns fill whole register panels or at least
    ``partial_block_min_panels`` of them. All the rows (one block) for a 1-D convolution
    or a matrix that fits already. Strided windows block too (ResNet-18's 7x7/2 layer: 8
    blocks of 14 rows, 1.44x the whole matrix)."""
    rows = shape.out[0]
    if len(shape.taps) < 2 or config.patch_block_l2_fraction <= 0:
        return rows
    bytes_ = byte_size(element, 4)
    row_bytes = shape.depth * math.prod(shape.out[1:]) * bytes_
    fitting = int(target.l2_bytes * config.patch_block_l2_fraction) // row_bytes
    if fitting >= rows:
        return rows
    # whole register tiles of two vectors: a block of 196 columns (6 panels and 4 columns)
    # measured 2x slower than the whole matrix; one of many panels keeps its tail small
    # (l1_050: 605 columns, 18 panels and 29 columns, 1.26x faster than a 4.4 MB matrix)
    panel = 2 * max(1, target.vector_bits // (8 * bytes_))
    width = math.prod(shape.out[1:])

    def fits_panels(chosen: int) -> bool:
        columns = chosen * width
        return columns % panel == 0 or columns >= config.partial_block_min_panels * panel

    least = -(-rows // config.max_patch_blocks)
    for chosen in range(max(fitting, least), least - 1, -1):
        if rows % chosen == 0 and fits_panels(chosen):
            return chosen if chosen >= least else rows
    for chosen in range(max(fitting, least) + 1, rows):
        if rows % chosen == 0 and fits_panels(chosen):
            return chosen
    return rows


def per_image(shape: ConvShape, target: Target, config: ConvGemmConfig, element: str) -> bool:
    """Whether several images run one by one (:func:`blocked_gemm`): when each image has
    at least ``per_image_min_panels`` register panels (two vectors) of output columns.
    Fewer make matmuls too narrow for the micro-kernel: one GEMM over every image's
    columns, then a transpose, ran 1.7x faster on KernelBench's l1_076 (32 images of 19
    outputs) than 32 matmuls of 19 columns."""
    lanes = max(1, target.vector_bits // (8 * byte_size(element, 4)))
    return shape.n > 1 and math.prod(shape.out) >= config.per_image_min_panels * 2 * lanes


def blocked_gemm(
    image: Any,
    weights: Any,
    init: Any,
    shape: ConvShape,
    rows: int,
    build: tuple[Any, Any, dict[str, Any], bool],
) -> Any:
    """``W @ P`` image by image, each in ``shape.out[0] // rows`` blocks of output rows,
    accumulating into ``init`` (the convolution's ``[N, F, O...]`` init) where each block's
    result lies: no transpose of the init or the output. A bias broadcast as the init is
    added in each block's epilogue instead (:mod:`.bias_epilogue`). ``build`` is (the element type,
    ``patches(image, shape, element)`` that builds one block's patch matrix, the matmul's
    attributes, whether ``patches`` takes the whole image and the block's origin, as
    ``conv.patch_gather.patch_matrix`` does, instead of the block's input rows)."""
    element, patches, attributes, whole_image = build
    from stagegraph.mlir.bindings import arith, ir, scf, tensor

    rank = len(shape.taps)
    block = replace(shape, n=1, out=(rows, *shape.out[1:]))
    per_image = shape.out[0] // rows
    # the input rows one block's windows read
    reach = (rows - 1) * shape.strides[0] + shape.dilations[0] * (shape.taps[0] - 1) + 1
    image_shape = ir.RankedTensorType(image.type).shape
    window = [1, shape.c, reach, *image_shape[3:]]
    window_type = ir.RankedTensorType.get(window, element)
    out_block = [1, shape.f, rows, *shape.out[1:]]
    out_type = ir.RankedTensorType.get(out_block, element)
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    index = ir.IndexType.get()
    offsets = [dynamic, 0, dynamic, *[0] * (rank - 1)]
    unit = [1] * (rank + 2)

    def constant(value: int) -> Any:
        return arith.ConstantOp(index, value).result

    biased = bias_of(init) if isinstance(element, ir.FloatType) else None  # (bias_epilogue)
    start = biased[1] if biased else init
    loop = scf.ForOp(constant(0), constant(shape.n * per_image), constant(1), [start])
    with ir.InsertionPoint(loop.body):
        step, current = loop.induction_variable, loop.inner_iter_args[0]
        number = arith.DivUIOp(step, constant(per_image)).result
        row_block = arith.RemUIOp(step, constant(per_image)).result
        first_row = arith.MulIOp(row_block, constant(rows)).result
        first_input = arith.MulIOp(row_block, constant(rows * shape.strides[0])).result
        source = tensor.ExtractSliceOp(
            window_type, image, [number, first_input], [], [],
            offsets, window, unit,
        ).result  # fmt: skip
        rows_acc = tensor.ExtractSliceOp(
            out_type, current, [number, first_row], [], [], offsets, out_block, unit
        ).result
        columns = rows * math.prod(shape.out[1:])
        groups = [[0, 1], list(range(2, rank + 2))]
        flat = collapse_shape(rows_acc, groups, [shape.f, columns])
        if whole_image:  # (the gather reads the image whole, from the block's origin)
            patch_block = patches(image, block, element, (number, first_input))
        else:
            patch_block = patches(source, block, element)
        operands = [weights, patch_block]
        if biased:
            made = biased_block(*operands, biased[0], flat, attributes)
        else:
            made = named_structured_op("linalg.matmul", operands, [flat], attributes)
        back = expand_shape(made, groups, out_block)
        written = tensor.InsertSliceOp(
            back, current, [number, first_row], [], [], offsets, out_block, unit
        )
        scf.YieldOp([written.result])
    return loop.results[0]
