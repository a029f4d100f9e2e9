"""A Linear layer's Mish epilogue (``x * tanh(softplus(x))``, softplus as PyTorch imports it:
``select(x > 20, x, log1p(exp(x)))`` with the comparison an i1 tensor of its own) merges
into one elementwise op that reads C once, rides on the matmul's register tiles, and its
gate becomes ``n / (n + 2)`` (``stages.common.softplus_tanh``); values verify over the
whole range (large, very negative, past the softplus threshold)."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.common.softplus_tanh import fold_softplus_tanh

TARGET = "x86-64-v4"
MAP = "affine_map<(i, j) -> (i, j)>"


def _dense(array: np.ndarray) -> str:
    return f'dense<"0x{array.astype(np.float32).tobytes().hex().upper()}">'


def _unary(name: str, source: str, body: str, n: str, out: str = "f32", init: str = "%e") -> str:
    return f"""
  {name} = linalg.generic {{indexing_maps = [{MAP}, {MAP}], iterator_types = ["parallel", "parallel"]}}
      ins({source} : tensor<{n}xf32>) outs({init} : tensor<{n}x{out}>) {{
  ^bb0(%a: f32, %o: {out}):
    {body}
  }} -> tensor<{n}x{out}>"""  # noqa: E501


def _mish(prefix: str, x: str, n: str) -> str:
    """Mish of ``x`` as torch-mlir imports it: exp, log1p, x > 20 (an i1 tensor), select,
    tanh, multiply; each its own generic."""
    p = prefix
    return "".join([
        _unary(f"%{p}exp", x, "%r = math.exp %a : f32\n    linalg.yield %r : f32", n),
        _unary(f"%{p}log", f"%{p}exp", "%r = math.log1p %a : f32\n    linalg.yield %r : f32", n),
        _unary(f"%{p}gt", x, "%r = arith.cmpf ogt, %a, %c20 : f32\n    linalg.yield %r : i1",
               n, "i1", "%eb"),
        f"""
  %{p}sp = linalg.generic {{indexing_maps = [{MAP}, {MAP}, {MAP}, {MAP}], iterator_types = ["parallel", "parallel"]}}
      ins(%{p}gt, {x}, %{p}log : tensor<{n}xi1>, tensor<{n}xf32>, tensor<{n}xf32>) outs(%e : tensor<{n}xf32>) {{
  ^bb0(%c: i1, %a: f32, %b: f32, %o: f32):
    %r = arith.select %c, %a, %b : f32
    linalg.yield %r : f32
  }} -> tensor<{n}xf32>""",  # noqa: E501
        _unary(f"%{p}th", f"%{p}sp", "%r = math.tanh %a : f32\n    linalg.yield %r : f32", n),
        f"""
  %{p}out = linalg.generic {{indexing_maps = [{MAP}, {MAP}, {MAP}], iterator_types = ["parallel", "parallel"]}}
      ins({x}, %{p}th : tensor<{n}xf32>, tensor<{n}xf32>) outs(%e : tensor<{n}xf32>) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  }} -> tensor<{n}xf32>""",  # noqa: E501
    ])  # fmt: skip


def _reference_mish(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    softplus = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    return x * np.tanh(softplus)


def _linear_mish_mish(tmp_path, m: int = 16, k: int = 64, n: int = 64) -> str:
    """``mish(mish(x @ W^T + bias))`` with a constant ``W[n, k]``; inputs spread so C spans
    about -60 .. 60 (past exp's square overflow at 44 and the threshold 20)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    w = rng.uniform(-1, 1, (n, k)).astype(np.float32) * 8
    bias = rng.uniform(-20, 20, n).astype(np.float32)
    shape = f"{m}x{n}"
    text = f"""
func.func @main(%x: tensor<{m}x{k}xf32>) -> tensor<{shape}xf32> {{
  %zero = arith.constant 0.0 : f32
  %c20 = arith.constant 20.0 : f32
  %w = arith.constant {_dense(w)} : tensor<{n}x{k}xf32>
  %bias = arith.constant {_dense(bias)} : tensor<{n}xf32>
  %et = tensor.empty() : tensor<{k}x{n}xf32>
  %wt = linalg.transpose ins(%w : tensor<{n}x{k}xf32>) outs(%et : tensor<{k}x{n}xf32>) permutation = [1, 0]
  %e = tensor.empty() : tensor<{shape}xf32>
  %eb = tensor.empty() : tensor<{shape}xi1>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<{shape}xf32>) -> tensor<{shape}xf32>
  %mm = linalg.matmul ins(%x, %wt : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>)
      outs(%f : tensor<{shape}xf32>) -> tensor<{shape}xf32>
  %y = linalg.generic {{indexing_maps = [{MAP}, affine_map<(i, j) -> (j)>, {MAP}], iterator_types = ["parallel", "parallel"]}}
      ins(%mm, %bias : tensor<{shape}xf32>, tensor<{n}xf32>) outs(%e : tensor<{shape}xf32>) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  }} -> tensor<{shape}xf32>
  {_mish("a", "%y", shape)}
  {_mish("b", "%aout", shape)}
  return %bout : tensor<{shape}xf32>
}}"""  # noqa: E501
    stem = tmp_path / "linear_mish_mish"
    stem.with_suffix(".mlir").write_text(text)
    c = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    assert c.min() < -40 and c.max() > 45  # the ranges the rewrite must get right
    np.savez(
        stem.with_suffix(".npz"), in0=x, out0=_reference_mish(_reference_mish(c)).astype(np.float32)
    )
    return str(stem.with_suffix(".mlir"))


def test_the_epilogue_merges_into_one_op_reading_c_once(tmp_path):
    """After the generic rewrites (the comparison's unread i1 init no longer blocks the
    merge; the bias adds that each of Mish's reads of x had become read C through one
    input), the matmul has one consumer, reading it in one operand."""
    from stagegraph.stages.x86.generic.prepare import prepare

    path = _linear_mish_mish(tmp_path)
    module = sg.run("x86", path, threads=1, target=TARGET, until="normalize").module.ir
    fn = collect(module, "func.func")[0]
    with module.context, ir.Location.unknown():
        assert prepare(module, fn)
    generics = collect(fn, "linalg.generic")
    assert len(generics) == 1
    matmul = collect(fn, "linalg.matmul")[0]
    uses = list(matmul.results[0].uses)
    assert len(uses) == 1 and uses[0].owner.operation == generics[0].operation
    body = [op.name for op in generics[0].regions[0].blocks[0].operations]
    assert body.count("math.tanh") == 2 and body.count("arith.cmpf") == 2


def test_the_epilogue_rides_on_the_register_tiles_and_verifies(tmp_path):
    path = _linear_mish_mish(tmp_path)
    bufferized = sg.run("x86", path, threads=1, target=TARGET, until="bufferized")
    module = bufferized.module.ir
    # One pass writes C (the register tiles' store), no parallel pass over C after it, no
    # buffer of C and no byte buffer of comparisons.
    assert collect(module, "scf.forall") == []
    allocs = [ir.MemRefType(op.results[0].type) for op in collect(module, "memref.alloc")]
    assert all(t.shape != [16, 64] for t in allocs)
    assert all(not isinstance(t.element_type, ir.IntegerType) for t in allocs)
    report = sg.run("x86", path, threads=1, target=TARGET)
    assert report.verified is True
    assert sg.run("x86", path, threads=1, target="x86-64-v3").verified is True


def _gate_module(threshold: float, with_select: bool = True) -> ir.Module:
    select = f"""
    %c = arith.constant dense<{threshold}> : vector<16xf32>
    %gt = arith.cmpf ogt, %x, %c : vector<16xf32>
    %s = arith.select %gt, %x, %l : vector<16xi1>, vector<16xf32>"""
    argument = "%s" if with_select else "%l"
    return ir.Module.parse(f"""
func.func @gate(%x: vector<16xf32>) -> vector<16xf32> {{
    %e = math.exp %x : vector<16xf32>
    %l = math.log1p %e : vector<16xf32>{select if with_select else ""}
    %t = math.tanh {argument} : vector<16xf32>
    return %t : vector<16xf32>
}}""")


@pytest.mark.parametrize("with_select", [True, False])
def test_the_gate_becomes_one_exp_and_a_division(with_select):
    with ir.Context():
        module = _gate_module(20.0, with_select)
        assert fold_softplus_tanh(module) == 1
        names = [op.name for op in collect(module, lambda op: op.name != "func.func")]
        assert "math.tanh" not in names and "math.log1p" not in names
        assert names.count("math.exp") == 1 and names.count("arith.divf") == 1
        assert "arith.cmpf" not in names and "arith.select" not in names  # erased, unused
        clamp = collect(module, "arith.minimumf")
        assert len(clamp) == 1


def test_a_low_threshold_keeps_the_select():
    """Past a threshold of 2, tanh(x) is not 1 in f32 and differs from tanh(softplus(x)):
    the rewrite would change the values, so it leaves the chain."""
    with ir.Context():
        module = _gate_module(2.0)
        assert fold_softplus_tanh(module) == 0
        assert len(collect(module, "math.log1p")) == 1


def test_the_gate_values_match_float64():
    """n / (n + 2) with e = exp(min(x, 20)) against tanh(softplus(x)) in float64."""
    from stagegraph.stages.common.softplus_tanh import CLAMP

    x = np.concatenate([np.linspace(-100, 100, 20001), [-1e-6, 0.0, 1e-6]]).astype(np.float32)
    e = np.exp(np.minimum(x, np.float32(CLAMP)))
    n = e * (e + np.float32(2))
    gate = n / (n + np.float32(2))
    expected = np.tanh(np.where(x > 20, x, np.log1p(np.exp(np.minimum(x.astype(float), 20)))))
    assert np.all(np.isfinite(gate))
    assert np.max(np.abs(gate - expected)) < 4e-7
