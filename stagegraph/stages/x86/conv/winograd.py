"""3x3 stride-1 2-D convolutions by Winograd's minimal filtering F(m, 3), in ``x86.normalize``.

A channels-first convolution ``out[n, f] = sum_c W[f, c] (*) X[n, c]`` with a 3x3 window,
unit strides and dilations is cut into ``m x m`` output tiles; each tile's products become
``alpha^2`` (``alpha = m + 2``) independent matmuls over the channels
(:mod:`stagegraph.stages.x86.conv.winograd_math` has the matrices):

1. **Input transform**: the image goes channels-last (one ``linalg.transpose``, whose
   transposes between chained layers the layout sinking can cancel), zero-padded up to
   whole tiles; ``alpha^2`` strided ``tensor.extract_slice`` views read each tile's taps
   (contiguous along the channels), and one ``linalg.generic`` with ``alpha^2`` outputs
   computes ``V = B^T d B`` per tile and channel with only the nonzero terms of ``B``
   (adds and subtracts for F(2, 3)): ``V_k[(n, tile), c]``.
2. **Filter transform**: ``U_k[c, f] = (G W G^T)_k``. Weights that are constants
   (:mod:`stagegraph.stages.common.constant_eval`, also through folded BatchNorm) are
   transformed here with numpy at compile time, so nothing is recomputed per call and the
   matmul kernel packs them at compile time too (:mod:`stagegraph.stages.x86.matmul.constant_pack`);
   other weights get one ``linalg.generic`` (a contraction with ``G (x) G``) per call.
3. **Batched GEMM**: ``M_k = V_k @ U_k``, ``alpha^2`` ``linalg.matmul`` ops (tile positions
   x channels times channels x filters): each runs through the packed matmul kernel like any
   other matmul, with its own tile params (the x86 graph has no packed path for
   ``linalg.batch_matmul``). ``ConvGemmConfig.winograd_loop`` makes them one matmul in a
   loop over the taps instead (:mod:`stagegraph.stages.x86.conv.winograd_loop`: fewer
   kernels to compile, constant filters packed per call).
4. **Output transform**: one ``linalg.generic`` with ``m^2`` outputs computes ``Y = A^T M A``
   (nonzero terms only) into unit-dim slices of an ``[N, TH, m, TW, m, F]`` tensor, which is
   the channels-last output once reshaped; the part past the real output is cut off and the
   result transposed back to the payload's layout. A non-zero init (a bias broadcast) is
   added after.

Upstream MLIR has the same three transforms as ``linalg.winograd_*_transform`` ops
(``transform.structured.winograd_conv2d``), but only for ``linalg.conv_2d_nhwc_fhwc`` and
decomposed into per-tile loops of tiny matmuls; here the GEMM in the middle is one large
matmul per tap, which is what the packed kernel runs at its peak.

:mod:`stagegraph.stages.x86.conv.winograd_cost` says which convolutions may take this
path and what it costs; the cost model of :mod:`stagegraph.stages.x86.conv.choice` decides.
"""

from __future__ import annotations

import contextlib
from itertools import product
from typing import Any

import numpy as np

from stagegraph.mlir.build import (
    collapse_shape,
    expand_shape,
    generic,
    named_structured_op,
    transposed,
)
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.conv.conv_shape import ConvShape
from stagegraph.stages.x86.conv.winograd_cost import tiles
from stagegraph.stages.x86.conv.winograd_math import alpha, filter_transform, matrices

_NCHW_TO_NHWC, _NHWC_TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def convolution_to_winograd(
    op: Any, shape: ConvShape, m: int, attributes: dict, values: Any, loop: bool = False
) -> Any:
    """Build F(``m``, 3) of the NCHW convolution ``op`` before it and return the value that
    replaces its result; the first matmul carries ``attributes`` (the path stamp);
    ``values``: the module's :class:`~stagegraph.stages.common.constant_eval.ConstantValues`
    (constant weights are transformed at compile time); ``loop``: the matmuls as one in a
    loop over the taps (:mod:`stagegraph.stages.x86.conv.winograd_loop`)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.conv.winograd_loop import (
        looped_products,
        restack,
        stacked_outputs,
    )
    from stagegraph.stages.x86.generic.layout_sinking import SINKS_ATTRIBUTE

    image, kernel, init = op.operands
    element = ir.RankedTensorType(init.type).element_type
    th, tw = tiles(shape, m)
    side = alpha(m)
    taps = _input_taps(image, shape, m, element)
    if loop:
        stacked, outs = stacked_outputs(side * side, [shape.n, th, tw, shape.c], element)
        v = restack(stacked, _input_transform(taps, m, element, outs))
        [u] = _filter_operands(values, kernel, shape, m, element, stacked=True)
        products = looped_products(v, u, element, attributes)
    else:
        v = _input_transform(taps, m, element)
        u = _filter_operands(values, kernel, shape, m, element)
        products = []
        for k in range(side * side):
            flat = collapse_shape(v[k], [[0, 1, 2], [3]], [shape.n * th * tw, shape.c])
            acc = _zeros([shape.n * th * tw, shape.f], element)
            made = named_structured_op("linalg.matmul", [flat, u[k]], [acc],
                                       attributes if k == 0 else None)  # fmt: skip
            products.append(expand_shape(made, [[0, 1, 2], [3]], [shape.n, th, tw, shape.f]))
    tiled = _output_transform(products, m, element)
    full = collapse_shape(tiled, [[0], [1, 2], [3, 4], [5]], [shape.n, th * m, tw * m, shape.f])
    if (th * m, tw * m) != tuple(shape.out):
        full = _slice(full, [0, 0, 0, 0], [shape.n, *shape.out, shape.f], [1, 1, 1, 1])
    result = transposed(full, _NHWC_TO_NCHW)
    # sunk like a channels-last convolution's (conv/chain_layout.py): between two Winograd
    # layers, it meets the next one's input transpose and both go
    result.owner.attributes[SINKS_ATTRIBUTE] = ir.UnitAttr.get()
    if _is_zero_fill(init):
        return result
    return _added(result, init)


# ------------------------------------------------------------------------------ transforms


def _input_taps(image: Any, shape: ConvShape, m: int, element: Any) -> list[Any]:
    """The ``alpha^2`` views ``d[i, j][n, y, x, c] = X[n, c, y*m + i, x*m + j]`` of the
    channels-last image, zero-padded to whole tiles."""
    from stagegraph.mlir.bindings import dialect, ir

    th, tw = tiles(shape, m)
    nhwc = transposed(image, _NCHW_TO_NHWC)
    _, height, width, _ = ir.RankedTensorType(nhwc.type).shape
    need = (th * m + 2, tw * m + 2)
    if need != (height, width):
        zero = _zeros([shape.n, *need, shape.c], element)
        nhwc = (
            dialect("tensor")
            .InsertSliceOp(
                nhwc, zero, [], [], [], [0, 0, 0, 0], [shape.n, height, width, shape.c], [1] * 4
            )
            .result
        )
    side = alpha(m)
    return [
        _slice(nhwc, [0, i, j, 0], [shape.n, th, tw, shape.c], [1, m, m, 1])
        for i, j in product(range(side), repeat=2)
    ]


def _input_transform(
    taps: list[Any], m: int, element: Any, outs: list[Any] | None = None
) -> list[Any]:
    """``V = B^T d B`` per tile and channel: one generic, ``alpha^2`` outputs (into
    ``outs`` if given, else fresh tensors)."""
    from stagegraph.mlir.bindings import dialect, ir

    bt, _, _ = matrices(m)
    shape = ir.RankedTensorType(taps[0].type).shape
    outs = outs or [dialect("tensor").EmptyOp(shape, element).result for _ in taps]
    maps = [ir.AffineMap.get_identity(4)] * (2 * len(taps))

    def body(*args: Any) -> list[Any]:
        side = alpha(m)
        d = [list(args[i * side : (i + 1) * side]) for i in range(side)]
        rows = [[_combination(bt[e], [d[i][j] for i in range(side)], element)
                 for j in range(side)] for e in range(side)]  # fmt: skip
        return [_combination(bt[b], rows[a], element) for a in range(side) for b in range(side)]

    made = generic(taps, outs, maps, ["parallel"] * 4, body)
    return list(made.results)


def _output_transform(products: list[Any], m: int, element: Any) -> Any:
    """``Y = A^T M A`` per tile and filter, written into the unit-dim slices of an
    ``[N, TH, m, TW, m, F]`` tensor."""
    from stagegraph.mlir.bindings import dialect, ir

    _, _, at = matrices(m)
    n, th, tw, f = ir.RankedTensorType(products[0].type).shape
    outs = [dialect("tensor").EmptyOp([n, th, tw, f], element).result for _ in range(m * m)]
    maps = [ir.AffineMap.get_identity(4)] * (len(products) + m * m)

    def body(*args: Any) -> list[Any]:
        side = alpha(m)
        prods = [list(args[a * side : (a + 1) * side]) for a in range(side)]
        rows = [[_combination(at[i], [prods[a][b] for a in range(side)], element)
                 for b in range(side)] for i in range(m)]  # fmt: skip
        return [_combination(at[j], rows[i], element) for i in range(m) for j in range(m)]

    made = generic(products, outs, maps, ["parallel"] * 4, body)
    results = [made] if m * m == 1 else list(made.results)
    tiled = dialect("tensor").EmptyOp([n, th, m, tw, m, f], element).result
    for (i, j), value in zip(product(range(m), repeat=2), results, strict=True):
        tiled = (
            dialect("tensor")
            .InsertSliceOp(
                value, tiled, [], [], [], [0, 0, i, 0, j, 0], [n, th, 1, tw, 1, f], [1] * 6
            )
            .result
        )
    return tiled


def _combination(coefficients: np.ndarray, values: list[Any], element: Any) -> Any:
    """``sum_i coefficients[i] * values[i]`` as scalar arith, skipping zeros and
    multiplying only by coefficients other than +-1."""
    from stagegraph.mlir.bindings import arith, ir

    total = None
    for coefficient, value in zip(coefficients, values, strict=True):
        if coefficient == 0:
            continue
        term, negative = value, coefficient < 0
        if abs(coefficient) != 1:
            scale = arith.ConstantOp(element, ir.FloatAttr.get(element, float(abs(coefficient))))
            term = arith.MulFOp(value, scale.result).result
        if total is None:
            total = arith.NegFOp(term).result if negative else term
        else:
            total = (arith.SubFOp if negative else arith.AddFOp)(total, term).result
    if total is None:
        return arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
    return total


def _filter_operands(
    values: Any, kernel: Any, shape: ConvShape, m: int, element: Any, stacked: bool = False
) -> list[Any]:
    """``U_k`` (``[C, F]``) per tap of the transformed tile: constants computed here when the
    weights are constants, else slices of one generic's contraction; ``stacked``: one
    ``[alpha^2, C, F]`` value instead."""
    from stagegraph.mlir.bindings import arith, ir
    from stagegraph.stages.common.constant_eval import NotConstantError

    side = alpha(m)
    leaves = values.leaves(kernel)
    if leaves is not None:
        try:
            values.load(leaves)
            weights = np.asarray(values.value(kernel))
        except NotConstantError:
            weights = None
        if weights is not None:
            u = filter_transform(weights, m)
            if stacked:
                return [_blob_constant(u, element)]
            return [_blob_constant(u[k], element) for k in range(side * side)]
    _, g, _ = matrices(m)
    gg = np.einsum("ar,bs->abrs", g, g).reshape(side * side, 3, 3).astype(np.float32)
    coeffs_type = ir.RankedTensorType.get([side * side, 3, 3], element)
    coeffs = arith.ConstantOp(coeffs_type, ir.DenseElementsAttr.get(gg, type=coeffs_type)).result
    acc = _zeros([side * side, shape.c, shape.f], element)
    dims = [ir.AffineDimExpr.get(i) for i in range(5)]  # k, c, f, r, s
    k, c, f, r, s = dims
    maps = [ir.AffineMap.get(5, 0, [k, r, s]), ir.AffineMap.get(5, 0, [f, c, r, s]),
            ir.AffineMap.get(5, 0, [k, c, f])]  # fmt: skip
    kinds = ["parallel"] * 3 + ["reduction"] * 2

    def body(gv: Any, wv: Any, out: Any) -> Any:
        return arith.AddFOp(out, arith.MulFOp(gv, wv).result).result

    u_all = generic([coeffs, kernel], [acc], maps, kinds, body)
    if stacked:
        return [u_all]
    return [
        _slice(u_all, [t, 0, 0], [1, shape.c, shape.f], [1, 1, 1], [shape.c, shape.f])
        for t in range(side * side)
    ]


# ------------------------------------------------------------------------------ helpers


def _slice(
    source: Any, offsets: list[int], sizes: list[int], strides: list[int],
    result_shape: list[int] | None = None,
) -> Any:  # fmt: skip
    """A static ``tensor.extract_slice`` (rank-reduced to ``result_shape`` if given)."""
    from stagegraph.mlir.bindings import dialect, ir

    element = ir.RankedTensorType(source.type).element_type
    result = ir.RankedTensorType.get(list(result_shape or sizes), element)
    return (
        dialect("tensor").ExtractSliceOp(result, source, [], [], [], offsets, sizes, strides).result
    )


def _blob_constant(array: np.ndarray, element: Any) -> Any:
    """An ``arith.constant`` of ``array`` held as a ``dense_resource`` blob, as imported
    weights are: a dense attribute of the transformed filters (4x the weights for
    F(4, 3)) is uniqued, hashed and copied by every later stage."""
    from stagegraph.mlir.bindings import ir

    data = np.ascontiguousarray(array)
    kind = ir.RankedTensorType.get(list(data.shape), element)
    attr = ir.DenseResourceElementsAttr.get_from_buffer(
        memoryview(data), f"stagegraph_winograd_{id(data):x}", kind
    )
    made = ir.Operation.create("arith.constant", results=[kind], attributes={"value": attr})
    return made.results[0]


def _zeros(shape: list[int], element: Any) -> Any:
    """A zero-filled tensor of ``shape``: a ``linalg.fill`` the matmul schedule fuses."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    zero = arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
    empty = dialect("tensor").EmptyOp(shape, element).result
    return named_structured_op("linalg.fill", [zero], [empty])


def _is_zero_fill(init: Any) -> bool:
    """Whether the convolution's init is a fill with zero (nothing to add)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.constants import is_zero

    owner = init.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return False
    owner = owner.operation
    return owner.name == "linalg.fill" and is_zero(owner.operands[0])


def _added(value: Any, init: Any) -> Any:
    """``value + init`` elementwise (the convolution accumulated into ``init``)."""
    from stagegraph.mlir.bindings import arith, dialect, ir

    kind = ir.RankedTensorType(value.type)
    empty = dialect("tensor").EmptyOp(kind.shape, kind.element_type).result
    maps = [ir.AffineMap.get_identity(kind.rank)] * 3
    return generic([value, init], [empty], maps, ["parallel"] * kind.rank,
                   lambda a, b, _o: arith.AddFOp(a, b).result)  # fmt: skip


def winograd_convolutions(module: Any, decided: list[Any], config: ConvGemmConfig) -> int:
    """Rewrite each ``(op, shape, choice)`` of ``decided`` (convolutions of ``module`` the
    cost model sent to Winograd) as F(``config.winograd_tile``, 3); returns the count."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.constant_eval import ConstantValues, NotConstantError
    from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE, path_attribute

    values = ConstantValues(module)
    # every constant filter read at once: dense_resource blobs take one compiled probe
    leaves = [leaf for op, _, _ in decided for leaf in values.leaves(op.operands[1]) or []]
    with contextlib.suppress(NotConstantError):  # then each filter on its own, below
        values.load(leaves)
    for op, shape, choice in decided:
        attributes = {PATH_ATTRIBUTE: path_attribute(choice)}
        with ir.InsertionPoint(op), op.location:
            result = convolution_to_winograd(
                op, shape, config.winograd_tile, attributes, values, config.winograd_loop
            )
        op.results[0].replace_all_uses_with(result)
        op.erase()
    return len(decided)
