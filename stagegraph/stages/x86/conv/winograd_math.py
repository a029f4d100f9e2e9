"""The Winograd minimal-filtering matrices F(m, 3) and their numpy reference, no MLIR.

``Y = A^T [(G g G^T) * (B^T d B)] A`` computes an ``m x m`` tile of a 3x3 correlation (what
``linalg.conv_2d_*`` computes) from an ``(m + 2) x (m + 2)`` input tile ``d`` and the 3x3
filter ``g`` (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016;
the points 0, +-1, +-2, infinity for F(4, 3), as in their paper and in MLIR's
``linalg.winograd_*_transform`` ops). Per output tile and channel pair it takes
``(m + 2)^2`` multiplications instead of ``9 m^2``: 2.25x fewer for F(2, 3), 4x for F(4, 3).

Kept apart from the IR rewrite (:mod:`stagegraph.stages.x86.conv.winograd`) so that the
cost model, the tests and the filter folding (the transform of constant weights, computed
once here at compile time) share one copy of the matrices.
"""

from __future__ import annotations

import numpy as np

#: (B^T, G, A^T) per output tile size m, for 3-tap filters.
_MATRICES: dict[int, tuple[list[list[float]], list[list[float]], list[list[float]]]] = {
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: (
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}

#: The output tile sizes implemented (``ConvGemmConfig.winograd_tile``).
TILES = tuple(sorted(_MATRICES))


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B^T, G, A^T)`` of F(m, 3) as float64 arrays (``ValueError`` for another ``m``)."""
    if m not in _MATRICES:
        raise ValueError(f"Winograd F({m}, 3) is not implemented (tiles: {TILES})")
    return tuple(np.asarray(x, np.float64) for x in _MATRICES[m])  # type: ignore[return-value]


def alpha(m: int) -> int:
    """The input tile's side, ``m + 2``."""
    return m + 2


def filter_transform(weights: np.ndarray, m: int) -> np.ndarray:
    """``U[a, b, c, f] = (G W[f, c] G^T)[a, b]`` of ``FCHW`` 3x3 ``weights``, computed in
    float64 and rounded once to the weights' dtype: the batched GEMM's right-hand sides
    ``[alpha^2, C, F]`` (flattened ``a * alpha + b``)."""
    _, g, _ = matrices(m)
    u = np.einsum("ar,fcrs,bs->abcf", g, weights.astype(np.float64), g)
    side = alpha(m)
    return u.reshape(side * side, weights.shape[1], weights.shape[0]).astype(weights.dtype)


def conv2d_winograd(x: np.ndarray, weights: np.ndarray, m: int) -> np.ndarray:
    """The unpadded stride-1 3x3 correlation of ``NCHW`` ``x`` with ``FCHW`` ``weights`` by
    F(m, 3) in ``x``'s dtype throughout (the order the compiled code rounds in, up to the
    GEMM's summation order): the accuracy reference of the tests and of the tile choice."""
    bt, _, at = (a.astype(x.dtype) for a in matrices(m))
    n, c, h, w = x.shape
    oh, ow = h - 2, w - 2
    th, tw = -(-oh // m), -(-ow // m)
    side = alpha(m)
    padded = np.zeros((n, c, th * m + 2, tw * m + 2), x.dtype)
    padded[:, :, :h, :w] = x
    rows = np.arange(th)[:, None] * m + np.arange(side)[None, :]  # [th, side]
    cols = np.arange(tw)[:, None] * m + np.arange(side)[None, :]
    tiles = padded[:, :, rows[:, :, None, None], cols[None, None, :, :]]  # n c th i tw j
    v = np.einsum("ei,ncxiyj,gj->egncxy", bt, tiles, bt)
    u = filter_transform(weights, m).reshape(side, side, c, -1)
    product = np.einsum("egcf,egncxy->egnfxy", u, v)
    y = np.einsum("ie,egnfxy,jg->nfxiyj", at, product, at)
    return y.reshape(n, -1, th * m, tw * m)[:, :, :oh, :ow]
