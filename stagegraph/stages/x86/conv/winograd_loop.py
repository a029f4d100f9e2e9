"""Winograd's ``alpha^2`` matmuls as one ``linalg.matmul`` in an ``scf.for`` over the taps
(``ConvGemmConfig.winograd_loop``), for :mod:`stagegraph.stages.x86.conv.winograd`.

Unrolled, a layer makes ``alpha^2`` matmuls (36 for F(4, 3)) that the schedule and LLVM
compile one by one: ResNet-18's ten Winograd layers made 360 packed micro-kernels and
multiplied its compile time. In a loop, the transformed inputs ``V[k]`` and filters
``U[k]`` are slices of stacked tensors (``[alpha^2, N, TH, TW, C]``, ``[alpha^2, C, F]``)
and one matmul per layer is compiled. The price: a constant ``U`` read through a slice at
a loop-dependent offset is not packed at compile time
(:mod:`stagegraph.stages.x86.matmul.constant_pack` takes a constant operand only), so
each call packs it.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.build import collapse_shape, expand_shape, named_structured_op


def stacked_outputs(count: int, shape: list[int], element: Any) -> tuple[Any, list[Any]]:
    """A fresh ``[count, *shape]`` tensor and its ``count`` slices (rank-reduced to
    ``shape``), for a generic to write its results into in place."""
    from stagegraph.mlir.bindings import dialect

    stacked = dialect("tensor").EmptyOp([count, *shape], element).result
    rank = len(shape)
    slices = [_static_slice(stacked, [k, *[0] * rank], [1, *shape], shape) for k in range(count)]
    return stacked, slices


def restack(stacked: Any, values: list[Any]) -> Any:
    """``stacked`` with ``values[k]`` inserted at ``[k]`` (each the slice it was made from)."""
    from stagegraph.mlir.bindings import dialect, ir

    shape = list(ir.RankedTensorType(stacked.type).shape)
    for k, value in enumerate(values):
        stacked = dialect("tensor").InsertSliceOp(
            value, stacked, [], [], [], [k, *[0] * (len(shape) - 1)], [1, *shape[1:]],
            [1] * len(shape),
        ).result  # fmt: skip
    return stacked


def looped_products(v: Any, u: Any, element: Any, attributes: dict) -> list[Any]:
    """``M[k] = V[k] @ U[k]`` for every tap ``k`` (``v``: ``[alpha^2, N, TH, TW, C]``,
    ``u``: ``[alpha^2, C, F]``) in one ``scf.for``; returns the ``alpha^2`` products as
    ``[N, TH, TW, F]`` slices of the stacked result. The matmul carries ``attributes``."""
    from stagegraph.mlir.bindings import arith, dialect, ir, scf

    taps, n, th, tw, c = ir.RankedTensorType(v.type).shape
    f = ir.RankedTensorType(u.type).shape[2]
    positions = n * th * tw
    index = ir.IndexType.get()
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    tensor = dialect("tensor")

    def constant(value: int) -> Any:
        return arith.ConstantOp(index, value).result

    stacked = tensor.EmptyOp([taps, positions, f], element).result
    loop = scf.ForOp(constant(0), constant(taps), constant(1), [stacked])
    with ir.InsertionPoint(loop.body):
        k, current = loop.induction_variable, loop.inner_iter_args[0]

        def at(source: Any, sizes: list[int]) -> Any:
            result = ir.RankedTensorType.get(sizes[1:], element)
            offsets = [dynamic, *[0] * (len(sizes) - 1)]
            return tensor.ExtractSliceOp(
                result, source, [k], [], [], offsets, sizes, [1] * len(sizes)
            ).result

        inputs = collapse_shape(at(v, [1, n, th, tw, c]), [[0, 1, 2], [3]], [positions, c])
        zero = arith.ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result
        acc = named_structured_op("linalg.fill", [zero], [at(current, [1, positions, f])])
        made = named_structured_op("linalg.matmul", [inputs, at(u, [1, c, f])], [acc],
                                   attributes)  # fmt: skip
        written = tensor.InsertSliceOp(
            made, current, [k], [], [], [dynamic, 0, 0], [1, positions, f], [1, 1, 1]
        ).result
        scf.YieldOp([written])
    products = loop.results[0]
    return [
        expand_shape(
            _static_slice(products, [t, 0, 0], [1, positions, f], [positions, f]),
            [[0, 1, 2], [3]], [n, th, tw, f],
        )
        for t in range(taps)
    ]  # fmt: skip


def _static_slice(source: Any, offsets: list[int], sizes: list[int], shape: list[int]) -> Any:
    from stagegraph.mlir.bindings import dialect, ir

    element = ir.RankedTensorType(source.type).element_type
    result = ir.RankedTensorType.get(shape, element)
    return (
        dialect("tensor")
        .ExtractSliceOp(result, source, [], [], [], offsets, sizes, [1] * len(sizes))
        .result
    )
