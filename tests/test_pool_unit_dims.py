"""Pools through the x86 graph, swept over windows, strides and extents (1-D, 2-D, 3-D;
window <= extent; remainders; unit output dims), against numpy.

The case that used to miscompile: a pool whose output has a unit dim while its window covers
only part of that input dim (window 2 over a depth of 3). ``normalize`` drops unit dims, and
the window index became a bare loop dim indexing the whole input dim: an invalid
``linalg.generic`` (see :mod:`stagegraph.stages.common.read_extents`).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from stagegraph.app.run import run_report
from stagegraph.app.session import Session, SessionRequest

REDUCE = {"max": ("arith.maximumf", "0xFF800000", np.max), "sum": ("arith.addf", "0.0", np.sum)}


def pool_payload(shape: tuple[int, ...], window: tuple[int, ...], stride: tuple[int, ...],
                 kind: str) -> tuple[str, tuple[int, ...]]:  # fmt: skip
    """A ``linalg.generic`` pool over the trailing dims of an N x C x spatial input, as
    torch-mlir writes them (window operand, ``d_out * stride + d_win`` indices)."""
    spatial = len(window)
    out_spatial = tuple((d - k) // s + 1 for d, k, s in zip(shape[2:], window, stride, strict=True))
    out = shape[:2] + out_spatial
    loops = 2 + 2 * spatial
    dims = [f"d{i}" for i in range(loops)]
    head = ", ".join(dims)
    image = ["d0", "d1"] + [f"d{2 + i} * {stride[i]} + d{2 + spatial + i}" for i in range(spatial)]
    kernel = [f"d{2 + spatial + i}" for i in range(spatial)]
    result = dims[: 2 + spatial]
    op, init, _ = REDUCE[kind]
    kinds = ", ".join(['"parallel"'] * (2 + spatial) + ['"reduction"'] * spatial)

    def t(s):
        return "tensor<" + "x".join(map(str, s)) + "xf32>"

    text = f"""\
#in = affine_map<({head}) -> ({", ".join(image)})>
#win = affine_map<({head}) -> ({", ".join(kernel)})>
#out = affine_map<({head}) -> ({", ".join(result)})>
func.func @main(%x: {t(shape)}) -> {t(out)} {{
  %init = arith.constant {init} : f32
  %e = tensor.empty() : {t(out)}
  %f = linalg.fill ins(%init : f32) outs(%e : {t(out)}) -> {t(out)}
  %w = tensor.empty() : {t(window)}
  %r = linalg.generic {{indexing_maps = [#in, #win, #out], iterator_types = [{kinds}]}}
      ins(%x, %w : {t(shape)}, {t(window)}) outs(%f : {t(out)}) {{
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = {op} %a, %acc : f32
    linalg.yield %m : f32
  }} -> {t(out)}
  return %r : {t(out)}
}}
"""
    return text, out


def numpy_pool(x: np.ndarray, window: tuple[int, ...], stride: tuple[int, ...], kind: str):
    axes = tuple(range(2, x.ndim))
    views = sliding_window_view(x, window, axis=axes)
    views = views[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]
    return REDUCE[kind][2](views, axis=tuple(range(x.ndim, views.ndim))).astype(np.float32)


def check(tmp_path, shape, window, stride, kind="max"):
    text, out = pool_payload(shape, window, stride, kind)
    stem = "pool_" + "_".join(map(str, (*shape, *window, *stride))) + kind
    rng = np.random.default_rng(len(stem))
    x = rng.standard_normal(shape).astype(np.float32)
    expected = numpy_pool(x, window, stride, kind)
    assert expected.shape == out
    (tmp_path / f"{stem}.mlir").write_text(text)
    np.savez(tmp_path / f"{stem}.npz", in0=x, out0=expected)
    request = SessionRequest(graph="x86", workload=str(tmp_path / f"{stem}.mlir"))
    with Session(request, cache=False) as session:
        report = run_report(session)
    assert report.reference == "npz"
    assert report.verified is True, (shape, window, stride, report.message)


# (input shape N x C x spatial, window, stride): unit output dims with partial windows
# (the miscompile), remainders, window == extent, unit strides, mixed dims
CASES = [
    ((1, 2, 3, 4, 4), (2, 2, 2), (2, 2, 2)),  # depth 3, window 2: unit output depth
    ((2, 3, 3, 5, 4), (2, 3, 2), (2, 2, 2)),  # unit depth and height, remainders
    ((1, 1, 3, 3, 3), (2, 2, 2), (2, 2, 2)),  # every dim unit, batch and channel too
    ((2, 2, 5), (3,), (3,)),  # 1-D: window 3 over 5, unit output
    ((1, 3, 3, 6), (2, 2), (2, 2)),  # 2-D: unit output height
    ((2, 2, 4, 4), (4, 4), (1, 1)),  # window == extent (global pool)
    ((1, 2, 7, 6), (3, 2), (2, 2)),  # remainders, no unit output dim
]


@pytest.mark.parametrize(("shape", "window", "stride"), CASES)
def test_pools_match_numpy(tmp_path, shape, window, stride):
    check(tmp_path, shape, window, stride)


def test_sum_pool_with_unit_output_dim(tmp_path):
    check(tmp_path, (1, 2, 3, 4, 4), (2, 2, 2), (2, 2, 2), kind="sum")


def _sweep() -> list[tuple]:
    cases = []
    for spatial in (1, 2, 3):
        for extent, window, stride in itertools.product((1, 2, 3, 5), (1, 2, 3), (1, 2, 3)):
            if window > extent:
                continue
            shape = (1, 2) + (extent,) + (4,) * (spatial - 1)
            cases.append(
                (shape, (window,) + (2,) * (spatial - 1), (stride,) + (2,) * (spatial - 1))
            )
    return cases


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "window", "stride"), _sweep())
def test_pool_sweep(tmp_path, shape, window, stride):
    check(tmp_path, shape, window, stride)


def test_only_inputs_the_fold_would_break_are_sliced():
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.diagnostics import parse_module
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.read_extents import trim_unread_inputs

    broken, _ = pool_payload((1, 2, 3, 4, 4), (2, 2, 2), (2, 2, 2), "max")
    fine, _ = pool_payload((1, 2, 7, 6), (3, 2), (2, 2), "max")
    context = new_context()
    with context:
        module = parse_module(broken, context)
        assert trim_unread_inputs(module.operation) == 1
        slices = collect(module.operation, "tensor.extract_slice")
        assert [list(s.results[0].type.shape) for s in slices] == [[1, 2, 2, 4, 4]]
        assert module.operation.verify()
        untouched = parse_module(fine, context)
        before = str(untouched)
        assert trim_unread_inputs(untouched.operation) == 0
        assert str(untouched) == before
