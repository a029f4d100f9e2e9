"""Linear layers: a constant weight is packed at compile time into the kernel's panels
(``matmul.constant_pack``), so no packing of B runs per call, whatever M; the results
verify against numpy at small and odd shapes, transposed and not, on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.matmul.constant_pack import pack_panels
from stagegraph.stages.x86.matmul.params import partial_tiles
from tests.conftest import kernelbench_or_skip

TARGET = "x86-64-v4"  # 16 f32 lanes: the register tile is 32 columns wide (reg_n)


def _dense(array: np.ndarray) -> str:
    return f'dense<"0x{array.astype(np.float32).tobytes().hex().upper()}">'


def _linear(tmp_path, m: int, k: int, n: int, transposed: bool = True, constant: bool = True):
    """``relu(x @ W^T + bias)`` as torch-mlir imports ``nn.Linear`` (a constant ``W[n, k]``
    read through ``linalg.transpose``), or ``x @ W`` with ``W[k, n]``; an argument ``W``
    when not ``constant``. Writes the payload and its reference; returns its path."""
    rng = np.random.default_rng(m * 7 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((n, k) if transposed else (k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    b_type = f"tensor<{n}x{k}xf32>" if transposed else f"tensor<{k}x{n}xf32>"
    weight = f"%w = arith.constant {_dense(w)} : {b_type}" if constant else ""
    args = f"%x: tensor<{m}x{k}xf32>" + ("" if constant else f", %w: {b_type}")
    b = "%w"
    if transposed:
        b = "%wt"
        weight += f"""
  %et = tensor.empty() : tensor<{k}x{n}xf32>
  %wt = linalg.transpose ins(%w : {b_type}) outs(%et : tensor<{k}x{n}xf32>) permutation = [1, 0]"""
    text = f"""
func.func @main({args}) -> tensor<{m}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  {weight}
  %bias = arith.constant {_dense(bias)} : tensor<{n}xf32>
  %e = tensor.empty() : tensor<{m}x{n}xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %mm = linalg.matmul ins(%x, {b} : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>)
      outs(%f : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %r = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>,
      affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}}
      ins(%mm, %bias : tensor<{m}x{n}xf32>, tensor<{n}xf32>) outs(%e : tensor<{m}x{n}xf32>) {{
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    %y = arith.maximumf %s, %zero : f32
    linalg.yield %y : f32
  }} -> tensor<{m}x{n}xf32>
  return %r : tensor<{m}x{n}xf32>
}}"""
    stem = tmp_path / f"linear_{m}x{k}x{n}_{int(transposed)}{int(constant)}"
    stem.with_suffix(".mlir").write_text(text)
    reference = np.maximum((x @ (w.T if transposed else w)) + bias, 0)
    inputs = {"in0": x} if constant else {"in0": x, "in1": w}
    np.savez(stem.with_suffix(".npz"), **inputs, out0=reference)
    return str(stem.with_suffix(".mlir"))


def _tensor_shapes(module, op_name: str) -> list[tuple[int, ...]]:
    """The shapes of the tensor operands of every ``op_name`` op."""
    shapes = []
    for op in collect(module, op_name):
        for value in op.operands:
            if isinstance(value.type, ir.RankedTensorType):
                shapes.append(tuple(ir.RankedTensorType(value.type).shape))
    return shapes


def _constant_shapes(module) -> list[tuple[int, ...]]:
    return [
        tuple(ir.RankedTensorType(op.results[0].type).shape)
        for op in collect(module, "arith.constant")
        if isinstance(op.results[0].type, ir.RankedTensorType)
    ]


def test_panels_hold_b_columns_contiguous_over_k():
    b = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)  # [k, n]
    panels = pack_panels(b, 32, transposed=False)
    assert panels.shape == (2, 4, 32) and panels.flags.c_contiguous
    assert np.array_equal(panels[1, 3], b[3, 32:64])
    assert np.array_equal(pack_panels(np.ascontiguousarray(b.T), 32, transposed=True), panels)


@pytest.mark.parametrize("transposed", [True, False])
def test_a_constant_weight_is_packed_at_compile_time(tmp_path, transposed):
    """Batch 16 against a 256x256 weight: the heuristic would not pack B per call for so
    few rows, but a constant B is packed once; the kernel reads the [8, 256, 32] panel
    constant directly, and nothing reads or packs the weight's own layout at run time."""
    path = _linear(tmp_path, 16, 256, 256, transposed)
    scheduled = sg.run("x86", path, threads=1, target=TARGET, until="schedule")
    assert scheduled.params.matmul[0].pack is True
    module = scheduled.module.ir
    assert (8, 256, 32) in _constant_shapes(module)
    assert (256, 256) not in _constant_shapes(module)  # the weight's own layout is gone
    assert collect(module, {"linalg.pack", "linalg.unpack", "linalg.transpose"}) == []
    reads = _tensor_shapes(module, "vector.transfer_read")
    assert (8, 256, 32) in reads and (256, 256) not in reads
    # Packing steps write only A's panels ([2, 256, 8]: 16 rows in panels of 8).
    written = {s for s in _tensor_shapes(module, "vector.transfer_write") if len(s) == 3}
    assert all(s[-1] == 8 for s in written)
    # One global holds the weight, packed: no copy in its own layout is left in the binary.
    bufferized = sg.run("x86", path, threads=1, target=TARGET, until="bufferized")
    globals_ = [
        tuple(ir.MemRefType(ir.TypeAttr(op.attributes["type"]).value).shape)
        for op in collect(bufferized.module.ir, "memref.global")
    ]
    assert sorted(globals_, key=len) == [(256,), (8, 256, 32)]


@pytest.mark.parametrize(
    ("m", "k", "n", "transposed", "threads", "param"),
    [
        (16, 256, 256, True, 1, {}),
        (16, 256, 256, False, 1, {}),
        (37, 96, 128, True, 1, {}),  # rows in no whole register tile
        (64, 256, 256, True, 2, {"tile_n": 64, "tile_k": 64, "threads": 2}),  # blocks, K blocks
        (16, 256, 80, True, 1, {}),  # 80 columns: no whole panels, packed per call instead
        (16, 128, 96, True, 1, {"tile_n": 64, "pack": True}),  # narrower last block: per call
    ],
)  # fmt: skip
def test_linear_layers_verify(tmp_path, m, k, n, transposed, threads, param):
    if threads > 1:
        pytest.importorskip("stagegraph.runtime.openmp").library_path()
    path = _linear(tmp_path, m, k, n, transposed)
    report = sg.run("x86", path, threads=threads, param=param or None)
    assert report.verified is True


def test_an_argument_weight_is_packed_per_call_as_before(tmp_path):
    path = _linear(tmp_path, 16, 256, 256, transposed=False, constant=False)
    scheduled = sg.run("x86", path, threads=1, target=TARGET, until="schedule")
    assert scheduled.params.matmul[0].pack is False  # few rows, B in cache: not worth it
    assert sg.run("x86", path, threads=1).verified is True


def test_a_tile_of_one_row_is_never_partial():
    """Row blocks of 63 over 64 rows in tiles of one row: no partial tile to peel (the
    schedule failed on such tuner candidates)."""
    assert partial_tiles(64, 63, 1) is False and partial_tiles(64, 63, 2) is True
    param = {"tile_m": 63, "tile_n": 64, "reg_m": 1, "reg_n": 16, "k_unroll": 16}
    assert sg.run("x86", "matmul:m=64,n=64,k=64", threads=1, param=param).verified is True


def test_an_imported_linear_weight_blob_is_packed_and_verifies():
    """KernelBench's Linear + epilogue payload: its weight is a ``dense_resource`` blob
    (read by evaluating it), packed into [256 / 32, 256, 32] panels."""
    path = str(kernelbench_or_skip("level2") / "l2_009_Matmul_Subtract_Multiply_ReLU.mlir")
    scheduled = sg.run("x86", path, threads=1, target=TARGET, until="schedule")
    assert (8, 256, 32) in _constant_shapes(scheduled.module.ir)
    assert collect(scheduled.module.ir, {"linalg.pack", "linalg.unpack"}) == []
    assert sg.run("x86", path, threads=1).verified is True


def test_threads_share_no_packing_of_a_constant_weight():
    """Where two threads would share each K block's packing of B (many rows, a B block
    larger than L2), a constant B has no packing to share: the threads take blocks of
    their own, and the packing stays on (a few rows against a cached B included)."""
    from stagegraph.stages.target import Target
    from stagegraph.stages.x86.matmul.heuristic import heuristic_matmul_params

    mib = 1024 * 1024
    avx512 = Target(isa=frozenset({"avx512f", "avx2", "fma"}), cores=2, vector_bits=512,
                    l1d_bytes=48 * 1024, l2_bytes=mib, l3_bytes=32 * mib)  # fmt: skip
    per_call = heuristic_matmul_params(2048, 2048, 2048, "f32", avx512, threads=2)
    constant = heuristic_matmul_params(2048, 2048, 2048, "f32", avx512, 2, constant_b=True)
    assert per_call.share_b is True
    assert constant.share_b is False and constant.pack is True
    blocks = -(-2048 // (constant.block_m or constant.tile_m)) * -(-2048 // constant.tile_n)
    assert blocks >= 2  # every thread has a block
    few_rows = heuristic_matmul_params(16, 256, 256, "f32", avx512)
    assert few_rows.pack is False
    assert heuristic_matmul_params(16, 256, 256, "f32", avx512, constant_b=True).pack is True


def test_outlined_steps_keep_their_per_call_choice():
    """An unrolled LSTM has more ops than x86.schedule keeps inline: its repeated steps are
    outlined, their weights become function arguments, so no step's B is packed at compile
    time and the few-row steps stay unpacked, as before."""
    from stagegraph.stages.analysis import PayloadFacts
    from stagegraph.stages.x86.params_stage import DEDUPLICATE_ABOVE

    path = str(kernelbench_or_skip("level3") / "l3_037_LSTMCn.mlir")
    chosen = sg.run("x86", path, threads=1, target=TARGET, until="select")
    facts = next(v for v in chosen.values.values() if isinstance(v, PayloadFacts))
    assert len(facts.ops) > DEDUPLICATE_ABOVE
    steps = [p for p in chosen.params.matmul if p.tile_m <= 16]
    assert steps and not any(p.pack for p in steps)
