"""Convolutions whose images share one GEMM, run in groups of images whose patch matrix
stays in L2.

Images with few output positions each (a 1-D convolution of 30 outputs, a 2-D one of 7x7)
share one implicit GEMM (:mod:`stagegraph.stages.x86.conv.gemm`: every image's columns in
one ``[C*T, N*O]`` patch matrix; :func:`~.gemm_blocks.per_image` says when), because per
image the matmul would be too narrow for the micro-kernel. At the shipped batch sizes that
matrix fits L2; with the batch 16 times larger it does not (KernelBench's l1_067, 512
images of a 64-channel 1-D convolution: an 11.8 MB patch matrix, written to memory, read
back by B's packing into another 11.8 MB, then streamed by the micro-kernel), and the
convolution ran at half PyTorch's speed. In groups of images (a divisor of the batch) whose
patch matrix fits ``ConvGemmConfig.patch_block_l2_fraction`` of L2, each group's copy,
packing and matmul stay in L2. The groups are one ``scf.for`` (one matmul for the schedule
and one kernel for LLVM) carrying the output: per group, its images' input, their patches,
a matmul into ``[F, G*O]`` and the transpose into the output's ``[G, F, O...]`` rows
(``tensor.extract_slice``/``insert_slice`` on the loop's accumulator).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from stagegraph.dtypes import byte_size
from stagegraph.mlir.build import collapse_shape, expand_shape, named_structured_op
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape


def images_per_group(shape: ConvShape, target: Target, config: ConvGemmConfig, element: str) -> int:
    """Images per GEMM: all of them (no groups) when their patch matrix fits
    ``patch_block_l2_fraction`` of L2; else the largest divisor of the batch whose patch
    matrix fits and whose columns fill ``partial_block_min_panels`` register panels (two
    vectors: a wide matmul), or, when no fitting divisor is that wide, the narrowest
    divisor that is."""
    bytes_ = byte_size(element, 4)
    image_bytes = shape.depth * math.prod(shape.out) * bytes_
    budget = int(target.l2_bytes * config.patch_block_l2_fraction)
    if config.patch_block_l2_fraction <= 0 or shape.n * image_bytes <= budget:
        return shape.n
    lanes = max(1, target.vector_bits // (8 * bytes_))
    least_columns = config.partial_block_min_panels * 2 * lanes
    outputs = math.prod(shape.out)
    divisors = [g for g in range(1, shape.n) if shape.n % g == 0]
    wide = [g for g in divisors if g * outputs >= least_columns]
    fitting = [g for g in wide if g * image_bytes <= budget]
    if fitting:
        return max(fitting)
    return min(wide) if wide else shape.n


def grouped_gemm(
    image: Any, weights: Any, init: Any, shape: ConvShape, group: int, build: tuple[Any, ...]
) -> Any:
    """``W @ P`` in ``shape.n // group`` groups of ``group`` images, each written into the
    convolution's ``[N, F, O...]`` result (``init``'s value first). ``build`` is (the
    element type, ``patches(images, shape, element)`` that builds a ``[C*T, G*O]`` patch
    matrix of the images given, the matmul's attributes, ``swap_leading(value, element)``
    that swaps a tensor's first two dims: the GEMM module's, passed in so this one stays
    below it)."""
    from stagegraph.mlir.bindings import arith, ir, scf, tensor

    element, patches, attributes, swap_leading = build
    rank = len(shape.taps)
    part = replace(shape, n=group)
    image_shape = list(ir.RankedTensorType(image.type).shape)
    images_type = ir.RankedTensorType.get([group, *image_shape[1:]], element)
    out_block = [group, shape.f, *shape.out]
    out_type = ir.RankedTensorType.get(out_block, element)
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    index = ir.IndexType.get()
    fill = _fill_value(init)

    def constant(value: int) -> Any:
        return arith.ConstantOp(index, value).result

    if fill is not None:  # every group fills its own accumulator: the output starts empty
        init = tensor.EmptyOp([shape.n, shape.f, *shape.out], element).result
    loop = scf.ForOp(constant(0), constant(shape.n), constant(group), [init])
    with ir.InsertionPoint(loop.body):
        first, current = loop.induction_variable, loop.inner_iter_args[0]
        offsets = [dynamic, *[0] * (rank + 1)]
        unit = [1] * (rank + 2)
        source = tensor.ExtractSliceOp(
            images_type, image, [first], [], [], offsets, [group, *image_shape[1:]], unit
        ).result
        if fill is not None:
            empty = tensor.EmptyOp([shape.f, part.columns], element).result
            acc = named_structured_op("linalg.fill", [fill], [empty])
        else:
            rows = tensor.ExtractSliceOp(
                out_type, current, [first], [], [], offsets, out_block, unit
            ).result
            swapped = swap_leading(rows, element)
            acc = collapse_shape(swapped, [[0], list(range(1, rank + 2))], [shape.f, part.columns])
        made = named_structured_op(
            "linalg.matmul", [weights, patches(source, part, element)], [acc], attributes
        )
        groups = [[0], list(range(1, rank + 2))]
        by_filter = expand_shape(made, groups, [shape.f, group, *shape.out])
        back = swap_leading(by_filter, element)
        written = tensor.InsertSliceOp(back, current, [first], [], [], offsets, out_block, unit)
        scf.YieldOp([written.result])
    return loop.results[0]


def _fill_value(init: Any) -> Any:
    """The scalar ``init`` is filled with, or None when it is no ``linalg.fill``."""
    from stagegraph.mlir.bindings import ir

    owner = init.owner
    if isinstance(owner, ir.Operation | ir.OpView) and owner.operation.name == "linalg.fill":
        return owner.operation.operands[0]
    return None
