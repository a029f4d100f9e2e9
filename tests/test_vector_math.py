"""Vector math ops to libmvec calls: IR rewrite, ISA gating and JIT results vs numpy."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.stages.target import detect_target
from stagegraph.stages.x86.vector_math import call_vector_math, libmvec_path, vector_symbol

pytestmark = pytest.mark.skipif(libmvec_path() is None, reason="no libmvec on this host")

HOST = detect_target().isa
AVX512 = frozenset({"avx512f", "avx2"})
AVX2 = frozenset({"avx2"})
SSE = frozenset()


def _generic(shape: tuple[int, ...], dtype: str, body: list[str], name: str = "main") -> str:
    t = f"tensor<{'x'.join(map(str, shape))}x{dtype}>"
    dims = ", ".join(f"d{i}" for i in range(len(shape)))
    amap = f"affine_map<({dims}) -> ({dims})>"
    iters = ", ".join(['"parallel"'] * len(shape))
    lines = "\n".join(f"      {line}" for line in body)
    return f"""
func.func @{name}(%x: {t}) -> {t} {{
  %one = arith.constant 1.0 : {dtype}
  %e = tensor.empty() : {t}
  %r = linalg.generic {{indexing_maps = [{amap}, {amap}], iterator_types = [{iters}]}}
      ins(%x : {t}) outs(%e : {t}) {{
    ^bb0(%in: {dtype}, %out: {dtype}):
{lines}
  }} -> {t}
  return %r : {t}
}}
"""


def _sigmoid(shape: tuple[int, ...], dtype: str = "f32") -> str:
    return _generic(
        shape,
        dtype,
        [
            f"%n = arith.negf %in : {dtype}",
            f"%ex = math.exp %n : {dtype}",
            f"%d = arith.addf %ex, %one : {dtype}",
            f"%s = arith.divf %one, %d : {dtype}",
            f"linalg.yield %s : {dtype}",
        ],
    )


def _softplus(shape: tuple[int, ...], dtype: str = "f32") -> str:
    return _generic(
        shape,
        dtype,
        [
            f"%ex = math.exp %in : {dtype}",
            f"%l = math.log1p %ex : {dtype}",
            f"linalg.yield %l : {dtype}",
        ],
    )


def _ops(module) -> list[tuple[str, str]]:
    """(op name, callee or '') of every op in the module."""
    from stagegraph.mlir.bindings import ir

    found = []

    def visit(op):
        callee = op.attributes["callee"].value if op.name == "func.call" else ""
        found.append((op.name, callee))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _compile(text: str, isa: frozenset[str] | None, threads: int | None = None):
    """The x86 stages by hand: params, schedule, bufferize, then (unless ``isa`` is None)
    the libmvec rewrite, the x86 lowering and the JIT. Returns (binary, symbols, op list)."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.common.emit import runtime_libraries
    from stagegraph.stages.common.passes import BufferizeConfig, bufferize
    from stagegraph.stages.x86.ir_stages import LowerConfig, lower, schedule
    from stagegraph.stages.x86.params_stage import heuristic

    with new_context(), ir.Location.unknown():
        payload = ir.Module.parse(text)
        facts = analyze(payload)
        params = heuristic.fn(facts, detect_target(), CostModelConfig(threads=threads))
        schedule.fn(Module["tensor"](payload), facts, params)
        bufferize.fn(Module["tensor"](payload), BufferizeConfig())
        symbols = set() if isa is None else call_vector_math(payload, isa)
        assert payload.operation.verify()
        ops = _ops(payload)
        lower.fn(Module["buffer"](payload), params, detect_target(), LowerConfig(vector_math=False))
        libs = [*runtime_libraries(payload), *([libmvec_path()] if symbols else [])]
        return JitBinary(payload, shared_libs=libs), symbols, ops


def _check(text: str, isa, reference, dtype=np.float32, scale: float = 4.0) -> set[str]:
    binary, symbols, ops = _compile(text, isa)
    spec = binary.signature("main").inputs[0]
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(tuple(spec.shape)) * scale).astype(dtype)
    out = binary.call("main", [x])[0]
    ref = reference(x.astype(np.float64))
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=0)
    calls = {callee for name, callee in ops if name == "func.call"}
    assert calls == symbols
    if symbols:
        assert not any(name in ("math.exp", "math.log1p") for name, _ in ops)
    return symbols


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus_ref(x):
    return np.log1p(np.exp(x))


needs_avx512 = pytest.mark.skipif("avx512f" not in HOST, reason="host has no AVX-512")
needs_avx2 = pytest.mark.skipif("avx2" not in HOST, reason="host has no AVX2")


@needs_avx512
def test_sigmoid_avx512():
    assert _check(_sigmoid((64, 128)), AVX512, _sig) == {"_ZGVeN16v_expf"}


@needs_avx2
def test_sigmoid_avx2():
    assert _check(_sigmoid((64, 128)), AVX2, _sig) == {"_ZGVdN8v_expf"}


def test_sigmoid_sse():
    assert _check(_sigmoid((64, 128)), SSE, _sig) == {"_ZGVbN4v_expf"}


@needs_avx512
def test_softplus_avx512():
    got = _check(_softplus((32, 192)), AVX512, _softplus_ref)
    assert got == {"_ZGVeN16v_expf", "_ZGVeN16v_log1pf"}


@needs_avx2
def test_softplus_avx2():
    got = _check(_softplus((32, 192)), AVX2, _softplus_ref)
    assert got == {"_ZGVdN8v_expf", "_ZGVdN8v_log1pf"}


@needs_avx512
def test_mixed_widths_split():
    """24 lanes: one 16-lane call and one 8-lane call on strided slices."""
    got = _check(_softplus((8, 24)), AVX512, _softplus_ref)
    assert got == {"_ZGVeN16v_expf", "_ZGVdN8v_expf", "_ZGVeN16v_log1pf", "_ZGVdN8v_log1pf"}


@needs_avx512
def test_f64():
    assert _check(_sigmoid((16, 64), "f64"), AVX512, _sig, np.float64) == {"_ZGVeN8v_exp"}


@needs_avx512
def test_matmul_epilogue_2d_openmp():
    """tanh fused into the matmul micro-kernel's epilogue is a vector<8x32xf32> op (rows
    unrolled); two threads take the OpenMP path."""
    t = "tensor<256x256xf32>"
    ident = "affine_map<(d0, d1) -> (d0, d1)>"
    text = f"""
func.func @main(%a: {t}, %b: {t}) -> {t} {{
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : {t}
  %f = linalg.fill ins(%c0 : f32) outs(%e : {t}) -> {t}
  %m = linalg.matmul ins(%a, %b : {t}, {t}) outs(%f : {t}) -> {t}
  %r = linalg.generic {{indexing_maps = [{ident}, {ident}],
      iterator_types = ["parallel", "parallel"]}} ins(%m : {t}) outs(%e : {t}) {{
  ^bb0(%in: f32, %out: f32):
    %h = math.tanh %in : f32
    linalg.yield %h : f32
  }} -> {t}
  return %r : {t}
}}"""
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((256, 256), np.float32) / 8 for _ in range(2))
    outs = {}
    for isa in (None, AVX512):
        binary, symbols, _ = _compile(text, isa, threads=2)
        outs[isa] = binary.call("main", [a, b])[0]
    assert symbols == {"_ZGVeN16v_tanhf"}
    # Same matmul, tanh by libmvec instead of libm: within a few ulp of the f32 baseline.
    np.testing.assert_allclose(outs[AVX512], outs[None], rtol=1e-6, atol=1e-7)


def test_baseline_unchanged():
    """Without the rewrite the same payload still matches numpy (reference for the above)."""
    assert _check(_sigmoid((64, 128)), None, _sig) == set()


def test_uneven_rows_end_in_a_padded_call():
    """vector<6xf32> is no register multiple: one 8-lane call on the 6 lanes padded with
    1.0, its first 6 lanes taken back (LLVM would call libm's expf once per lane)."""
    from stagegraph.mlir.bindings import ir, new_context

    text = """
func.func @f(%v: vector<6xf32>, %w: vector<4xf32>, %s: f32) -> (vector<6xf32>, vector<4xf32>, f32) {
  %a = math.exp %v : vector<6xf32>
  %b = math.tanh %w : vector<4xf32>
  %c = math.exp %s : f32
  return %a, %b, %c : vector<6xf32>, vector<4xf32>, f32
}
"""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert call_vector_math(module, AVX512) == {"_ZGVdN8v_expf", "_ZGVbN4v_tanhf"}
        assert module.operation.verify()
        names = [name for name, _ in _ops(module)]
        assert names.count("math.exp") == 1 and "math.tanh" not in names  # the scalar stays
        assert names.count("func.call") == 2
        module = ir.Module.parse(text.replace("6xf32", "30xf32"))
        assert call_vector_math(module, AVX512) == {"_ZGVeN16v_expf", "_ZGVbN4v_tanhf"}
        calls = [callee for name, callee in _ops(module) if name == "func.call"]
        assert calls.count("_ZGVeN16v_expf") == 2  # 16 lanes, then 14 in a padded 16


def test_padded_rows_match_numpy():
    """Softplus on rows 14 wide (a 14x14 conv output's): padded calls, numpy's values."""
    isa = AVX512 if "avx512f" in HOST else AVX2 if "avx2" in HOST else SSE
    symbols = _check(_softplus((6, 14)), isa, lambda x: np.log1p(np.exp(x)))
    assert symbols and all(s.startswith("_ZGV") for s in symbols)


def test_nd_rows_split():
    """vector<2x24xf32>: each row becomes a 16-lane and an 8-lane call."""
    from stagegraph.mlir.bindings import ir, new_context

    text = """
func.func @f(%v: vector<2x24xf32>) -> vector<2x24xf32> {
  %a = math.erf %v : vector<2x24xf32>
  return %a : vector<2x24xf32>
}
"""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        assert call_vector_math(module, AVX512) == {"_ZGVeN16v_erff", "_ZGVdN8v_erff"}
        assert module.operation.verify()
        calls = [callee for name, callee in _ops(module) if name == "func.call"]
        assert sorted(calls) == sorted(["_ZGVeN16v_erff", "_ZGVdN8v_erff"] * 2)


def test_symbol_names():
    assert vector_symbol("exp", "e", 16, 1, True) == "_ZGVeN16v_expf"
    assert vector_symbol("pow", "d", 4, 2, False) == "_ZGVdN4vv_pow"
