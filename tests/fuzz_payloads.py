"""Hypothesis strategies for small linalg payloads with a numpy reference.

Each strategy draws a :class:`Case`: MLIR text (static shapes), the inputs, and the
expected outputs computed by numpy in float64 and stored as float32. Writing ``STEM.mlir``
and ``STEM.npz`` beside each other makes a workload whose reference is numpy's, so a
graph's result is judged against an independent computation, not against another graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from tests.test_pool_unit_dims import numpy_pool, pool_payload


@dataclass
class Case:
    text: str
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]

    def write(self, folder: Path, stem: str) -> Path:
        path = folder / f"{stem}.mlir"
        path.write_text(self.text)
        arrays = {f"in{i}": a for i, a in enumerate(self.inputs)}
        arrays.update({f"out{i}": a for i, a in enumerate(self.outputs)})
        np.savez(path.with_suffix(".npz"), **arrays)
        return path


def tensor(shape) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + "f32>"


def _map(rank: int, dims) -> str:
    head = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({head}) -> ({', '.join(dims)})>"


def _inputs(seed: int, *shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]


def shapes(max_dim: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(1, max_dim), min_size=1, max_size=3).map(tuple)


# (MLIR body with %a %b operands, numpy function); unary ops ignore %b
ELEMENTWISE = {
    "add": ("arith.addf %a, %b : f32", np.add),
    "sub": ("arith.subf %a, %b : f32", np.subtract),
    "mul": ("arith.mulf %a, %b : f32", np.multiply),
    "max": ("arith.maximumf %a, %b : f32", np.maximum),
    "min": ("arith.minimumf %a, %b : f32", np.minimum),
    "neg": ("arith.negf %a : f32", lambda a, _b: -a),
    "tanh": ("math.tanh %a : f32", lambda a, _b: np.tanh(a)),
    "exp": ("math.exp %a : f32", lambda a, _b: np.exp(a)),
    "abs": ("math.absf %a : f32", lambda a, _b: np.abs(a)),
}


@st.composite
def elementwise_chains(draw, max_dim: int = 7) -> Case:
    """A chain of elementwise generics, each combining the previous result with an input."""
    shape = draw(shapes(max_dim))
    ops = draw(st.lists(st.sampled_from(sorted(ELEMENTWISE)), min_size=1, max_size=4))
    x, y = _inputs(draw(st.integers(0, 2**16)), shape, shape)
    rank, t = len(shape), tensor(shape)
    identity = _map(rank, [f"d{i}" for i in range(rank)])
    kinds = ", ".join(['"parallel"'] * rank)
    lines = [f"func.func @main(%x: {t}, %y: {t}) -> {t} {{"]
    current, value = "%x", x.astype(np.float64)
    for i, name in enumerate(ops):
        body, fn = ELEMENTWISE[name]
        lines += [
            f"  %e{i} = tensor.empty() : {t}",
            f"  %r{i} = linalg.generic {{indexing_maps = [{identity}, {identity}, {identity}], "
            f"iterator_types = [{kinds}]}} ins({current}, %y : {t}, {t}) outs(%e{i} : {t}) {{",
            "  ^bb0(%a: f32, %b: f32, %o: f32):",
            f"    %v = {body}",
            "    linalg.yield %v : f32",
            f"  }} -> {t}",
        ]
        current, value = f"%r{i}", fn(value, y.astype(np.float64))
    lines += [f"  return {current} : {t}", "}", ""]
    return Case("\n".join(lines), [x, y], [value.astype(np.float32)])


@st.composite
def reductions(draw, max_dim: int = 7) -> Case:
    """A sum or max over a non-empty subset of the dims of a rank 1-3 tensor."""
    shape = draw(shapes(max_dim))
    rank = len(shape)
    reduced = draw(st.sets(st.integers(0, rank - 1), min_size=1))
    kind = draw(st.sampled_from(["sum", "max"]))
    (x,) = _inputs(draw(st.integers(0, 2**16)), shape)
    kept = [i for i in range(rank) if i not in reduced]
    out = tuple(shape[i] for i in kept)
    op, init = ("arith.addf", "0.0") if kind == "sum" else ("arith.maximumf", "0xFF800000")
    kinds = ", ".join('"reduction"' if i in reduced else '"parallel"' for i in range(rank))
    t_in, t_out = tensor(shape), tensor(out)
    text = f"""\
func.func @main(%x: {t_in}) -> {t_out} {{
  %init = arith.constant {init} : f32
  %e = tensor.empty() : {t_out}
  %f = linalg.fill ins(%init : f32) outs(%e : {t_out}) -> {t_out}
  %r = linalg.generic {{indexing_maps = [{_map(rank, [f"d{i}" for i in range(rank)])},
      {_map(rank, [f"d{i}" for i in kept])}], iterator_types = [{kinds}]}}
      ins(%x : {t_in}) outs(%f : {t_out}) {{
  ^bb0(%a: f32, %o: f32):
    %v = {op} %a, %o : f32
    linalg.yield %v : f32
  }} -> {t_out}
  return %r : {t_out}
}}
"""
    axis = tuple(sorted(reduced))
    value = x.astype(np.float64).sum(axis) if kind == "sum" else x.max(axis)
    return Case(text, [x], [np.asarray(value, dtype=np.float32).reshape(out)])


@st.composite
def pools(draw, max_dim: int = 6) -> Case:
    """A max or sum pool over 1-3 spatial dims: window <= extent, any stride, remainders."""
    spatial = draw(st.integers(1, 3))
    extents = draw(st.lists(st.integers(1, max_dim), min_size=spatial, max_size=spatial))
    windows = [draw(st.integers(1, e)) for e in extents]
    strides = draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *extents)
    kind = draw(st.sampled_from(["max", "sum"]))
    text, _ = pool_payload(shape, tuple(windows), tuple(strides), kind)
    (x,) = _inputs(draw(st.integers(0, 2**16)), shape)
    return Case(text, [x], [numpy_pool(x, tuple(windows), tuple(strides), kind)])


@st.composite
def convolutions(draw, max_dim: int = 7) -> Case:
    """``linalg.conv_2d_nchw_fchw`` with random sizes and strides (input and filter given)."""
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, max(4, max_dim // 2)))
    f = draw(st.integers(1, max(4, max_dim // 2)))
    h, w = draw(st.integers(1, max_dim)), draw(st.integers(1, max_dim))
    kh, kw = draw(st.integers(1, h)), draw(st.integers(1, w))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    x, k = _inputs(draw(st.integers(0, 2**16)), (n, c, h, w), (f, c, kh, kw))
    t_x, t_k, t_o = tensor((n, c, h, w)), tensor((f, c, kh, kw)), tensor((n, f, oh, ow))
    text = f"""\
func.func @main(%x: {t_x}, %k: {t_k}) -> {t_o} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {t_o}
  %f = linalg.fill ins(%zero : f32) outs(%e : {t_o}) -> {t_o}
  %r = linalg.conv_2d_nchw_fchw {{dilations = dense<1> : tensor<2xi64>,
      strides = dense<[{sh}, {sw}]> : tensor<2xi64>}}
      ins(%x, %k : {t_x}, {t_k}) outs(%f : {t_o}) -> {t_o}
  return %r : {t_o}
}}
"""
    windows = sliding_window_view(x.astype(np.float64), (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    value = np.einsum("nchwij,fcij->nfhw", windows, k.astype(np.float64))
    return Case(text, [x, k], [value.astype(np.float32)])


def payloads(max_dim: int) -> st.SearchStrategy[Case]:
    return st.one_of(elementwise_chains(max_dim), reductions(max_dim), pools(max_dim),
                     convolutions(max_dim))  # fmt: skip


PAYLOADS = payloads(7)
#: Larger shapes (vector widths, tiles, remainders of both) for the long run.
LARGE_PAYLOADS = payloads(40)
