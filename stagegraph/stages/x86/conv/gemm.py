"""Channels-first convolutions as one GEMM through the packed matmul kernel (implicit GEMM).

A convolution ``out[n, f, o] = sum_{c, t} W[f, c, t] * X[n, c, o*s + t*d]`` (``o``: output
position, ``t``: kernel tap, per spatial dim) is a matmul once the input's patches are laid
out as a matrix: ``P[(c, t), (n, o)] = X[n, c, o*s + t*d]``. Then ``out'[f, (n, o)] =
W[f, (c, t)] @ P`` reads the filter as it is stored (``FCHW`` collapses to ``[F, C*T]``
with no copy), and ``out'`` is ``[F, N, O]``: the output (``[N, F, O]``) is one transpose
of it, none for one image. The patch matrix is built by one copy, a ``linalg.generic``
whose input map reads each tap's (strided, dilated) window, or, where
:func:`~stagegraph.stages.x86.conv.patch_gather.gather_worth` says so (strided windows
over few channels or many taps), by a gather that the matmul's packing of B absorbs: each
packing step gathers its panel tile from the input (:mod:`.patch_gather`), and no patch
matrix is written out and read back.

Why this form: the filters are the matmul's rows (``m``), the images' output positions
together its columns (``n``, long and contiguous: the vectors run along them), the
channels and taps its depth (``k``). So a convolution with few output positions per image
or a filter past L2 is still one large matmul the packed micro-kernel runs near the FMA
peak, where the direct path starves on a short register block or streams its filter from
L3 once per output row. The patch copy costs ``C*T*N*O`` moves against ``2*F*C*T*N*O``
flops. :func:`gemm_worth` admits the spatial ranks ``ConvGemmConfig.ranks`` names when the
filters pay for the copy; among those, the cost model of
:mod:`stagegraph.stages.x86.conv.choice` picks the path per shape.

Transposed convolutions reach here as the plain convolutions of their zero-stuffed (or,
after :mod:`stagegraph.stages.x86.conv.transposed`, per phase) inputs. Runs in
``x86.normalize``, after the pointwise rewrite (1x1 windows need no patches).
"""

from __future__ import annotations

import math
from typing import Any

from stagegraph.mlir.build import (
    collapse_shape,
    expand_shape,
    generic,
    named_structured_op,
    transposed,
)
from stagegraph.mlir.walk import top_level_ops
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.bias_epilogue import erase_if_unused
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.conv.pointwise import window_attr

# Channels-first convolutions with (image, filter, output) = ([N, C, S...], [F, C, T...],
# [N, F, O...]): their spatial rank.
CONVOLUTIONS = {
    "linalg.conv_1d_ncw_fcw": 1,
    "linalg.conv_2d_nchw_fchw": 2,
    "linalg.conv_3d_ncdhw_fcdhw": 3,
}
_FLOATS = ("f16", "bf16", "f32", "f64")


def conv_shape(op: Any) -> ConvShape | None:
    """The sizes of a static float channels-first convolution ``op``, or None when it is
    not one :func:`convolutions_to_gemm` can rewrite."""
    from stagegraph.mlir.bindings import ir

    rank = CONVOLUTIONS.get(op.name)
    if rank is None or len(op.operands) != 3 or len(op.results) != 1:
        return None
    types = [op.operands[i].type for i in range(3)]
    if not all(isinstance(t, ir.RankedTensorType) for t in types):
        return None
    image, kernel, out = (ir.RankedTensorType(t) for t in types)
    if not all(t.has_static_shape for t in (image, kernel, out)):
        return None
    elements = {str(t.element_type) for t in (image, kernel, out)}
    if len(elements) != 1 or elements.pop() not in _FLOATS:
        return None
    return ConvShape(
        n=image.shape[0],
        c=image.shape[1],
        f=kernel.shape[0],
        taps=tuple(kernel.shape[2:]),
        out=tuple(out.shape[2:]),
        strides=tuple(window_attr(op, "strides")),
        dilations=tuple(window_attr(op, "dilations")),
    )


def gemm_worth(shape: ConvShape, config: ConvGemmConfig) -> bool:
    """Whether the implicit GEMM should run ``shape`` (else the direct path does): a
    spatial rank the config takes, a window of more than one tap (a 1x1 one is a matmul
    already), enough filters to pay for the patch copy (2 flops per filter for each
    element moved), a patch matrix within ``config.max_patch_elements``."""
    if not config.conv_gemm or len(shape.taps) not in config.ranks:
        return False
    if math.prod(shape.taps) == 1 or shape.f < config.min_filters:
        return False
    return shape.depth * shape.columns <= config.max_patch_elements


def convolutions_to_gemm(
    module: Any, config: ConvGemmConfig | None = None, target: Target | None = None
) -> int:
    """Rewrite every channels-first convolution of ``module``'s functions that
    :func:`gemm_worth` admits and the cost model of :mod:`stagegraph.stages.x86.conv.choice`
    (for ``target``, by default the host) sends to the GEMM into patches and one
    ``linalg.matmul``; returns the count. Each decided op (the matmul made, or the
    convolution kept) carries the decision as ``choice.PATH_ATTRIBUTE``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import DefUse
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE, choose_path, path_attribute
    from stagegraph.stages.x86.conv.direct3d import padding
    from stagegraph.stages.x86.conv.gemm_blocks import block_rows, per_image
    from stagegraph.stages.x86.conv.image_groups import images_per_group
    from stagegraph.stages.x86.conv.patch_gather import gather_worth

    config = config or ConvGemmConfig()
    target = target or detect_target()
    found: list[Any] = []
    winograd: list[Any] = []
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        uses = DefUse(fn)
        for op in top_level_ops(fn):
            shape = conv_shape(op)
            if shape is None or not gemm_worth(shape, config):
                continue
            element = str(ir.RankedTensorType(op.operands[2].type).element_type)
            # a 3-D one's direct kernel skips the taps that read only a zero border
            pads = padding(op.operands[0], uses, (2, 3, 4)) if len(shape.taps) == 3 else None
            choice = choose_path(shape, target, config, element, pads)
            if choice.path == "winograd":
                winograd.append((op, shape, choice))
            elif choice.path == "direct":
                op.attributes[PATH_ATTRIBUTE] = path_attribute(choice)
            else:
                found.append((op, shape, choice))
    for op, shape, choice in found:
        element = str(ir.RankedTensorType(op.operands[2].type).element_type)
        rows = block_rows(shape, target, config, element)
        one_by_one = rows < shape.out[0] or per_image(shape, target, config, element)
        # (f32 only, the type measured: the others keep the window copy)
        gather = gather_worth(shape, config) and element == "f32"
        group = shape.n
        if not one_by_one and not gather:
            group = images_per_group(shape, target, config, element)
        with ir.InsertionPoint(op), op.location:
            result = _gemm(op, shape, choice, rows if one_by_one else 0, gather, group)
        init = op.operands[2].owner
        op.results[0].replace_all_uses_with(result)
        op.erase()
        erase_if_unused(init)  # a bias broadcast the blocks add in their epilogue
    if winograd:
        from stagegraph.stages.x86.conv.winograd import winograd_convolutions

        winograd_convolutions(module, winograd, config)
    return len(found) + len(winograd)


def _gemm(op: Any, shape: ConvShape, choice: Any, rows: int, gather: bool, group: int) -> Any:
    """``out = W @ P`` for the convolution ``op``, in its output's layout; the matmul
    carries ``choice``. With ``rows`` (not 0) the images run one by one in blocks of
    ``rows`` output rows (:mod:`stagegraph.stages.x86.conv.gemm_blocks`), else one GEMM
    takes the columns of ``group`` images at a time (:mod:`.image_groups`; all of them when
    ``group`` is the batch). ``gather``: ``P`` is the gather that B's packing absorbs
    (:mod:`stagegraph.stages.x86.conv.patch_gather`), else the window copy."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE, path_attribute
    from stagegraph.stages.x86.conv.gemm_blocks import blocked_gemm
    from stagegraph.stages.x86.conv.image_groups import grouped_gemm
    from stagegraph.stages.x86.conv.patch_gather import contiguous, patch_matrix

    image, kernel, init = op.operands
    element = ir.RankedTensorType(init.type).element_type
    rank = len(shape.taps)
    weights = collapse_shape(kernel, [[0], list(range(1, rank + 2))], [shape.f, shape.depth])
    attributes = {PATH_ATTRIBUTE: path_attribute(choice)}
    build_patches = patch_matrix if gather else _patches
    if gather:
        image = contiguous(image, element)
    if rows:
        build = (element, build_patches, attributes, gather)
        return blocked_gemm(image, weights, init, shape, rows, build)
    if group < shape.n:
        return grouped_gemm(
            image, weights, init, shape, group, (element, _patches, attributes, swap_leading)
        )
    patches = build_patches(image, shape, element)
    acc = _accumulator(init, shape, element)
    made = named_structured_op("linalg.matmul", [weights, patches], [acc], attributes)
    # out'[F, (N, O...)] -> [N, F, O...]
    by_filter = expand_shape(made, [[0], list(range(1, rank + 2))], [shape.f, shape.n, *shape.out])
    return swap_leading(by_filter, element)


def swap_leading(value: Any, element: Any) -> Any:
    """``value`` (a tensor of ``element``) with its first two dims swapped: a reshape when
    one of them is 1, else a ``linalg.transpose``."""
    from stagegraph.mlir.bindings import ir

    source = list(ir.RankedTensorType(value.type).shape)
    if 1 in source[:2]:
        groups = [[0, 1], *[[d] for d in range(2, len(source))]]
        flat = collapse_shape(value, groups, [source[0] * source[1], *source[2:]])
        return expand_shape(flat, groups, [source[1], source[0], *source[2:]])
    return transposed(value, [1, 0, *range(2, len(source))])


def _patches(image: Any, shape: ConvShape, element: Any) -> Any:
    """``P[(c, t), (n, o)] = X[n, c, o*s + t*d]`` as a ``[C*T, N*O]`` matrix, made by one
    ``linalg.generic`` over ``[C, T..., N, O...]`` whose input map takes each window's
    offsets. Measured as fast as one strided slice and transpose per tap (0.96-1.13x on
    ResNet-18 layers), in one op instead of two per tap; and no strided slice crosses an
    op boundary (outlined as a repeated group by ``stagegraph.stages.common.dedup``, the
    per-tap slices of ResNet-18's 7x7/2 layer reached a function argument that
    bufferization could not copy)."""
    from stagegraph.mlir.bindings import dialect, ir

    rank = len(shape.taps)
    full = [shape.c, *shape.taps, shape.n, *shape.out]
    patches = dialect("tensor").EmptyOp(full, element).result
    dims = [ir.AffineDimExpr.get(i) for i in range(len(full))]
    taps, n, outs = dims[1 : rank + 1], dims[rank + 1], dims[rank + 2 :]
    windows = [
        o * s + t * d for o, t, s, d in zip(outs, taps, shape.strides, shape.dilations, strict=True)
    ]
    maps = [
        ir.AffineMap.get(len(full), 0, [n, dims[0], *windows]),
        ir.AffineMap.get_identity(len(full)),
    ]
    made = generic([image], [patches], maps, ["parallel"] * len(full), lambda x, _: x)
    return collapse_shape(made, [list(range(rank + 1)), list(range(rank + 1, 2 * rank + 2))],
                          [shape.depth, shape.columns])  # fmt: skip


def _accumulator(init: Any, shape: ConvShape, element: Any) -> Any:
    """The matmul's ``[F, N*O]`` accumulator: a fill of the same value when ``init`` is a
    fill (the matmul schedule fuses it into its tiles), else ``init`` transposed."""
    from stagegraph.mlir.bindings import dialect, ir

    rank = len(shape.taps)
    owner = init.owner
    if isinstance(owner, ir.Operation | ir.OpView) and owner.operation.name == "linalg.fill":
        value = owner.operation.operands[0]
        empty = dialect("tensor").EmptyOp([shape.f, shape.columns], element).result
        return named_structured_op("linalg.fill", [value], [empty])
    swapped = swap_leading(init, element)
    return collapse_shape(swapped, [[0], list(range(1, rank + 2))], [shape.f, shape.columns])
