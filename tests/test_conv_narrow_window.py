"""Channels-first convolutions whose window is one element wide (a ``(3, 3, 1)`` 3-D filter,
a ``(3, 1)`` 2-D one) run channels-last like any other whose filters fill whole vectors:
in NCW their tiles gathered the channel vectors element by element (KernelBench's l1_059,
a 3-D convolution of 3 -> 16 channels, ran at 4% of the FMA peak that way)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_generic_schedule import (
    _conv3d_reference,
    _jit,
    _op_names,
    _prepared,
    _scheduled_op_names,
)


def _conv_payload(n: int, c: int, f: int, spatial: tuple, kernel: tuple, strides: tuple) -> tuple:
    """An NCHW (2-D) or NCDHW (3-D) convolution payload and its (input, filter) shapes."""
    rank = len(kernel)
    out = tuple((s - k) // st + 1 for s, k, st in zip(spatial, kernel, strides, strict=True))
    x_shape, w_shape, o_shape = (n, c, *spatial), (f, c, *kernel), (n, f, *out)
    tx, tw, to = (f"tensor<{'x'.join(map(str, s))}xf32>" for s in (x_shape, w_shape, o_shape))
    name = "conv_2d_nchw_fchw" if rank == 2 else "conv_3d_ncdhw_fcdhw"
    text = f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.{name} {{dilations = dense<1> : vector<{rank}xi64>,
      strides = dense<{list(strides)}> : vector<{rank}xi64>}}
      ins(%x, %w : {tx}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    return text, x_shape, w_shape


@pytest.mark.parametrize(
    ("f", "spatial", "kernel", "strides"),
    [
        (16, (5, 6, 7), (3, 3, 1), (1, 1, 1)),
        (8, (6, 7, 5), (2, 3, 1), (2, 1, 2)),
        (8, (9, 11), (3, 1), (1, 1)),
    ],
    ids=["3d-unit", "3d-strided", "2d"],
)
def test_a_one_wide_window_runs_channels_last_and_matches_the_definition(
    f: int, spatial: tuple, kernel: tuple, strides: tuple
) -> None:
    """The channels-first convolution is gone after the rewrites: a channels-last 2-D one
    (in depth loops for 3-D) between transposes; the schedule vectorizes it with FMAs over
    whole vectors of filters; the result matches the sum over the taps."""
    text, x_shape, w_shape = _conv_payload(2, 3, f, spatial, kernel, strides)
    names = _op_names(_prepared(text))
    assert "linalg.conv_2d_nhwc_hwcf" in names
    assert "linalg.conv_2d_nchw_fchw" not in names
    assert "linalg.conv_3d_ncdhw_fcdhw" not in names
    assert "vector.fma" in _scheduled_op_names(text)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    if len(kernel) == 2:  # the 3-D reference with a depth of one
        expected = _conv3d_reference(x[:, :, None], w[:, :, None], (1, *strides), (1, 1, 1))[
            :, :, 0
        ]
    else:
        expected = _conv3d_reference(x, w, strides, (1, 1, 1))
    (out,) = _jit(text).call("main", [x, w])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_a_one_wide_window_with_partial_filter_vectors_stays_channels_first() -> None:
    """Six filters would be partial vectors: the convolution keeps its NCDHW form (the
    3-D loops make it NCHW 2-D ones), and still computes the definition."""
    text, x_shape, w_shape = _conv_payload(1, 3, 6, (4, 5, 6), (3, 3, 1), (1, 1, 1))
    names = _op_names(_prepared(text))
    assert "linalg.conv_2d_nchw_fchw" in names and "linalg.conv_2d_nhwc_hwcf" not in names
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    (out,) = _jit(text).call("main", [x, w])
    np.testing.assert_allclose(out, _conv3d_reference(x, w, (1, 1, 1), (1, 1, 1)), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
