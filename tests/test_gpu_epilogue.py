"""Matmul epilogues and partial tiles on the GPU graph, without a GPU.

A matmul's elementwise consumer (bias, activation, scaling, residual add, a cast) and its
zero fill run in the matmul's kernel (``gpu.epilogue``): counted in kernels and PTX, checked
in the rewritten IR (the consumer's body on the accumulators after the K loop, no buffer for
C), assembled by ptxas without spills, and run by numbers through ``gpu_cpu`` (the fused
schedule serially on the CPU). Shapes that do not divide the tiles (100x72x40, a batch of
65x17 by 17x33) take the tensor cores with masked edges (``gpu.mma_bounds``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from tests.conftest import kernelbench_or_skip
from tests.test_gpu_graph import needs_llvmlite

#: A Linear layer: x @ w, a bias along the columns (or rows), ReLU, a residual add.
LINEAR = """#id = affine_map<(d0, d1) -> (d0, d1)>
#bias = affine_map<(d0, d1) -> ({bias_dim})>
func.func @linear(%x: tensor<{m}x{k}x{t}>, %w: tensor<{k}x{n}x{t}>, %b: tensor<{bias_len}x{o}>,
                  %r: tensor<{m}x{n}x{o}>) -> tensor<{m}x{n}x{o}> {{
  %zero = arith.constant 0.0 : {o}
  %empty = tensor.empty() : tensor<{m}x{n}x{o}>
  %init = linalg.fill ins(%zero : {o}) outs(%empty : tensor<{m}x{n}x{o}>) -> tensor<{m}x{n}x{o}>
  %c = linalg.matmul ins(%x, %w : tensor<{m}x{k}x{t}>, tensor<{k}x{n}x{t}>)
                     outs(%init : tensor<{m}x{n}x{o}>) -> tensor<{m}x{n}x{o}>
  %e = linalg.generic {{indexing_maps = [#id, #bias, #id, #id],
                        iterator_types = ["parallel", "parallel"]}}
      ins(%c, %b, %r : tensor<{m}x{n}x{o}>, tensor<{bias_len}x{o}>, tensor<{m}x{n}x{o}>)
      outs(%empty : tensor<{m}x{n}x{o}>) {{
  ^bb0(%in: {o}, %bias: {o}, %res: {o}, %out: {o}):
    %s = arith.addf %in, %bias : {o}
    %a = arith.maximumf %s, %zero : {o}
    %y = arith.addf %a, %res : {o}
    linalg.yield %y : {o}
  }} -> tensor<{m}x{n}x{o}>
  return %e : tensor<{m}x{n}x{o}>
}}
"""
NUMPY = {"f16": np.float16, "f32": np.float32}


def linear(tmp_path: Path, m: int = 128, n: int = 256, k: int = 64, dtype: str = "f16",
           out: str = "f32", rows: bool = False, seed: int = 0) -> Path:  # fmt: skip
    """The Linear payload and its inputs and expected output (computed in f32, rounded to
    the output type at the matmul and at the end, as the payload rounds)."""
    text = LINEAR.format(m=m, n=n, k=k, t=dtype, o=out, bias_dim="d0" if rows else "d1",
                         bias_len=m if rows else n)  # fmt: skip
    path = tmp_path / f"linear_{m}x{n}x{k}_{dtype}_{out}{'_rows' if rows else ''}.mlir"
    path.write_text(text)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) / 4).astype(NUMPY[dtype])
    w = (rng.standard_normal((k, n)) / 4).astype(NUMPY[dtype])
    bias = rng.standard_normal(m if rows else n).astype(NUMPY[out])
    res = rng.standard_normal((m, n)).astype(NUMPY[out])
    c = (x.astype(np.float32) @ w.astype(np.float32)).astype(NUMPY[out]).astype(np.float32)
    b32 = bias.astype(np.float32)[:, None] if rows else bias.astype(np.float32)
    want = np.maximum(c + b32, 0) + res.astype(np.float32)
    np.savez(path.with_suffix(".npz"), in0=x, in1=w, in2=bias, in3=res,
             out0=want.astype(NUMPY[out]))  # fmt: skip
    return path


def plans(path: Path, **kwargs) -> tuple:
    return sg.run("gpu", str(path), until="select", **kwargs).value("select").kernels


# -- the cost model folds the consumer and the fill into the matmul's plan --------------


def test_consumer_and_fill_fold_into_the_matmul_plan(tmp_path):
    fill, matmul, consumer = plans(linear(tmp_path), target="sm_80")
    assert matmul.mma == (16, 8, 16) and matmul.fused == (2, 0)
    assert not fill.mapped and not consumer.mapped  # no kernel of their own
    off = plans(linear(tmp_path), target="sm_80", param={"epilogues": False})
    assert off[1].fused == () and off[0].mapped and off[2].mapped


# -- tensor-core path ------------------------------------------------------------------


def test_rewrite_applies_the_consumer_to_the_accumulators_in_registers(tmp_path):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.epilogue import EPILOGUE_ATTR
    from stagegraph.stages.gpu.mma import rewrite_mma

    module = sg.run("gpu", str(linear(tmp_path)), target="sm_80", until="bufferized").module.ir
    (consumer,) = collect(module, lambda op: EPILOGUE_ATTR in op.attributes)
    assert consumer.name == "linalg.generic"
    with module.context:
        assert rewrite_mma(module) == 1
    assert not collect(module, lambda op: op.name.startswith("linalg."))
    assert not [a for a in collect(module, "memref.alloc")
                if "workgroup" not in str(a.results[0].type)]  # no buffer for C  # fmt: skip
    (loop,) = [op for op in collect(module, "scf.for") if collect(op, "nvgpu.mma.sync")]
    # The accumulators start at the fill's zero (a broadcast, not a load of C) ...
    starts = [v.owner.name for v in loop.operands[3:]]
    assert starts == ["vector.broadcast"] * len(starts)
    # ... and each extracted accumulator element goes through addf, maximumf, addf.
    extracts = [u.owner for r in loop.results for u in r.uses]
    assert extracts and all(e.name == "vector.extract" for e in extracts)
    chains = [[u.owner.name for u in e.results[0].uses] for e in extracts]
    assert all(chain == ["arith.addf"] for chain in chains)
    assert len(collect(module, "arith.maximumf")) == 4 * len(loop.results)


@needs_llvmlite
@pytest.mark.parametrize(("dtype", "out", "params", "arch"),
                         [("f16", "f32", {}, "sm_80"), ("f16", "f16", {}, "sm_90a"),
                          ("f32", "f32", {"tf32": True}, "sm_80")])  # fmt: skip
def test_linear_layer_is_one_mma_kernel_without_spills(tmp_path, dtype, out, params, arch):
    from stagegraph.stages.gpu.ptx import assemble

    path = linear(tmp_path, dtype=dtype, out=out)
    binary = sg.run("gpu", str(path), target=arch, param=params, until="emit").value("emit")
    (text,) = binary.ptx.values()  # fill, matmul and epilogue: one kernel
    assert "mma.sync.aligned" in text and "max.NaN.f" in text  # the ReLU beside the mma
    (report,) = assemble(text, arch)
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0
    # C is written once: one store per accumulator element (4 per 16x8 fragment, a 16x8
    # warp tile here), none before the loop.
    assert text.count("st.global") == 4
    assert text.index("st.global") > text.rindex("mma.sync")
    unfused = sg.run("gpu", str(path), target=arch, param={**params, "epilogues": False},
                     until="emit").value("emit")  # fmt: skip
    assert len(unfused.ptx) == 3


@pytest.mark.parametrize(
    ("dtype", "out", "rows", "params"),
    [("f16", "f32", False, {}), ("f16", "f16", False, {}), ("f16", "f32", True, {}),
     ("f32", "f32", False, {"tf32": True})],
)  # fmt: skip
def test_fused_schedule_verifies_on_the_cpu(tmp_path, dtype, out, rows, params):
    path = linear(tmp_path, m=64, n=32, k=32, dtype=dtype, out=out, rows=rows)
    assert plans(path, param=params)[1].fused == (2, 0)
    report = sg.run("gpu_cpu", str(path), param=params)
    assert report.verified is True, report.message


# -- SIMT path -------------------------------------------------------------------------


def test_simt_epilogue_runs_on_scalar_accumulators(tmp_path):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.epilogue import rewrite_simt_epilogues

    path = linear(tmp_path, m=64, n=32, k=32, dtype="f32")
    matmul = plans(path)[1]
    assert matmul.mma == () and matmul.fused == (2, 0)  # f32 without tf32: SIMT
    assert sg.run("gpu_cpu", str(path)).verified is True
    module = sg.run("gpu", str(path), until="bufferized").module.ir
    with module.context:
        assert rewrite_simt_epilogues(module) == 1
    assert not collect(module, lambda op: op.name.startswith("linalg."))
    assert not collect(module, "memref.alloc")
    (loop,) = collect(module, "scf.for")
    assert [v.owner.name for v in loop.operands[3:]] == ["arith.constant"]  # the fill's 0


@needs_llvmlite
def test_simt_linear_layer_is_one_kernel(tmp_path):
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", str(linear(tmp_path, m=64, n=32, k=32, dtype="f32")),
                    target="sm_80", until="emit").value("emit")  # fmt: skip
    (text,) = binary.ptx.values()
    (report,) = assemble(text, "sm_80")
    assert report.spill_stores == 0 and "max.NaN.f32" in text and "fma.rn.f32" in text


@pytest.mark.parametrize("stem", ["l2_059_Matmul_Swish_Scaling", "l2_063_Gemm_ReLU_Divide"])
def test_level2_linear_payloads_are_one_kernel(stem):
    # transpose of the constant weights (now at compile time), fill, matmul, epilogue
    from stagegraph.mlir.walk import collect

    folder = kernelbench_or_skip("level2")
    payload = str(folder / f"{stem}.mlir")
    normalized = sg.run("gpu", payload, until="normalize").module.ir
    assert not collect(normalized, "linalg.transpose")
    for params in ({}, {"tf32": True}):
        fused = plans(Path(payload), param=params)
        off = plans(Path(payload), param={**params, "epilogues": False})
        assert sum(p.mapped for p in off) == 3 and sum(p.mapped for p in fused) == 1
        report = sg.run("gpu_cpu", payload, param=params)  # the folded weights' values too
        assert report.verified is True, report.message


# -- shapes that do not divide the tiles --------------------------------------------------


def batch_payload(tmp_path: Path) -> Path:
    """tanh(A @ B / 8) for a batch of 3 (65x17 by 17x33), f16 into f32."""
    a_t, b_t, c_t = "tensor<3x65x17xf16>", "tensor<3x17x33xf16>", "tensor<3x65x33xf32>"
    ident = "affine_map<(b, m, n) -> (b, m, n)>"
    path = tmp_path / "bmm.mlir"
    path.write_text(
        f"func.func @bmm(%a: {a_t}, %b: {b_t}) -> {c_t} {{\n"
        "  %zero = arith.constant 0.0 : f32\n  %eighth = arith.constant 0.125 : f32\n"
        f"  %empty = tensor.empty() : {c_t}\n"
        f"  %init = linalg.fill ins(%zero : f32) outs(%empty : {c_t}) -> {c_t}\n"
        f"  %c = linalg.batch_matmul ins(%a, %b : {a_t}, {b_t}) outs(%init : {c_t}) -> {c_t}\n"
        f"  %s = linalg.generic {{indexing_maps = [{ident}, {ident}], iterator_types = "
        f'["parallel", "parallel", "parallel"]}} ins(%c : {c_t}) outs(%empty : {c_t}) {{\n'
        "  ^bb0(%in: f32, %out: f32):\n    %m = arith.mulf %in, %eighth : f32\n"
        f"    %t = math.tanh %m : f32\n    linalg.yield %t : f32\n  }} -> {c_t}\n"
        f"  return %s : {c_t}\n}}\n"
    )
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 65, 17)).astype(np.float16)
    b = rng.standard_normal((3, 17, 33)).astype(np.float16)
    want = np.tanh((a.astype(np.float32) @ b.astype(np.float32)) / 8)
    np.savez(path.with_suffix(".npz"), in0=a, in1=b, out0=want)
    return path


def test_partial_tiles_take_tensor_cores_and_verify_on_the_cpu(tmp_path):
    odd = linear(tmp_path, m=100, n=72, k=40)
    matmul = plans(odd, target="sm_80")[1]
    assert matmul.mma == (16, 8, 16) and 100 % matmul.tile_m and matmul.fused
    assert sg.run("gpu_cpu", str(odd)).verified is True
    bmm = batch_payload(tmp_path)
    plan = plans(bmm, target="sm_80")[1]
    assert plan.mma == (16, 8, 16) and plan.fused == (2, 0)
    report = sg.run("gpu_cpu", str(bmm))
    assert report.verified is True, report.message


def test_partial_tiles_are_masked_in_the_rewrite(tmp_path):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.mma import rewrite_mma
    from stagegraph.stages.gpu.mma_bounds import static_warp_grids

    module = sg.run("gpu", str(linear(tmp_path, m=100, n=72, k=40)), target="sm_80",
                    until="bufferized").module.ir  # fmt: skip
    # The copies the fusion left (the whole matmul, the block's) are gone: one per warp.
    assert len(collect(module, "linalg.matmul")) == len(collect(module, "linalg.fill")) == 1
    with module.context:
        assert static_warp_grids(module) == 1
        rewrite_mma(module)
    warps = [op for op in collect(module, "scf.forall")
             if "gpu.warp" in str(op.attributes["mapping"])]  # fmt: skip
    assert all(v.owner.name == "arith.constant" for op in warps for v in op.operands)
    # Every cp.async has a src-size (zero-filled past the edge) ...
    copies = collect(module, "nvgpu.device_async_copy")
    assert copies and all(len(c.operands) == 5 + 3 + 1 for c in copies)  # dst, src, size
    # ... the K loop runs to 48 (40 rounded up to 16), and C's elements are stored in ifs.
    (loop,) = [op for op in collect(module, "scf.for") if collect(op, "nvgpu.mma.sync")]
    assert ir.IntegerAttr(loop.operands[1].owner.attributes["value"]).value == 48
    stores = collect(module, "memref.store")
    assert stores and all(s.parent.name == "scf.if" for s in stores)


@needs_llvmlite
def test_partial_tiles_assemble_with_zero_filling_copies(tmp_path):
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", str(linear(tmp_path, m=100, n=72, k=40)), target="sm_80",
                    until="emit").value("emit")  # fmt: skip
    (text,) = binary.ptx.values()
    (launch,) = [k["launch"] for k in binary.manifest["kernels"]]
    assert launch["grid"] == [5, 4, 1]  # ceil(72 / 16), ceil(100 / 32)
    # cp.async with a src-size register operand: [dst], [src], 16, %r
    copies = [line for line in text.splitlines() if "cp.async.cg.shared.global" in line]
    assert copies and all(line.count(",") == 3 for line in copies)
    (report,) = assemble(text, "sm_80")
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0
    bmm = sg.run("gpu", str(batch_payload(tmp_path)), target="sm_80", until="emit").value("emit")
    (text,) = bmm.ptx.values()
    assert "mma.sync.aligned.m16n8k16" in text and "tanh" not in text.split("mma.sync")[0]
    (report,) = assemble(text, "sm_80")
    assert report.spill_stores == 0


def test_less_than_one_instruction_stays_simt(tmp_path):
    assert plans(linear(tmp_path, m=64, n=4, k=32), target="sm_80")[1].mma == ()  # n < 8
    assert plans(linear(tmp_path, m=64, n=8, k=32), target="sm_80")[1].mma == (16, 8, 16)


def test_tiles_follow_the_shape_and_the_sm_count():
    from stagegraph.stages.gpu.mma import HALF_SHAPE
    from stagegraph.stages.gpu.mma_bounds import choose_block_tile, tile_cost
    from stagegraph.stages.gpu.target import resolve_gpu_target

    h100 = resolve_gpu_target("h100")
    # Big square: the largest tile (two waves of 2 blocks per SM beat 128x64's three).
    assert choose_block_tile(4096, 2048, 128, 1, HALF_SHAPE, 2, h100) == (128, 128)
    # 1000^3: 128x128 gives 64 blocks, leaving 68 of 132 SMs idle; 128x64 gives 128 blocks,
    # still one wave, each block half the work.
    assert choose_block_tile(1000, 1000, 1000, 1, HALF_SHAPE, 2, h100) == (128, 64)
    # Wave quantization: one block more than a full wave costs a second wave.
    assert tile_cost(128 * 132, 128, 1, (128, 128), 132, 1) * 2 == tile_cost(
        128 * 133, 128, 1, (128, 128), 132, 1)  # fmt: skip
    for m, n in ((4096, 4096), (8192, 1024)):
        assert choose_block_tile(m, n, 4096, 1, HALF_SHAPE, 2, h100) is not None


# -- half Linear layers as PyTorch imports them ----------------------------------------------

WIDENED = """#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @half_linear(%x: tensor<64x32xbf16>, %w: tensor<32x48xbf16>, %b: tensor<48xf32>)
    -> tensor<64x48xbf16> {
  %zero = arith.constant 0.0 : f32
  %xe = tensor.empty() : tensor<64x32xf32>
  %we = tensor.empty() : tensor<32x48xf32>
  %x32 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<64x32xbf16>) outs(%xe : tensor<64x32xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %v = arith.extf %in : bf16 to f32
    linalg.yield %v : f32
  } -> tensor<64x32xf32>
  %w32 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%w : tensor<32x48xbf16>) outs(%we : tensor<32x48xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %v = arith.extf %in : bf16 to f32
    linalg.yield %v : f32
  } -> tensor<32x48xf32>
  %ce = tensor.empty() : tensor<64x48xf32>
  %init = linalg.fill ins(%zero : f32) outs(%ce : tensor<64x48xf32>) -> tensor<64x48xf32>
  %c = linalg.matmul ins(%x32, %w32 : tensor<64x32xf32>, tensor<32x48xf32>)
                     outs(%init : tensor<64x48xf32>) -> tensor<64x48xf32>
  %oe = tensor.empty() : tensor<64x48xbf16>
  %o = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c, %b : tensor<64x48xf32>, tensor<48xf32>) outs(%oe : tensor<64x48xbf16>) {
  ^bb0(%in: f32, %bias: f32, %out: bf16):
    %s = arith.addf %in, %bias : f32
    %t = math.tanh %s : f32
    %r = arith.truncf %t : f32 to bf16
    linalg.yield %r : bf16
  } -> tensor<64x48xbf16>
  return %o : tensor<64x48xbf16>
}
"""


def test_widened_half_linear_takes_tensor_cores_with_the_cast_in_its_epilogue(tmp_path):
    from stagegraph.dtypes import from_bf16, to_bf16

    path = tmp_path / "half_linear.mlir"
    path.write_text(WIDENED)
    rng = np.random.default_rng(5)
    x = to_bf16(rng.standard_normal((64, 32)).astype(np.float32) / 4)
    w = to_bf16(rng.standard_normal((32, 48)).astype(np.float32) / 4)
    bias = rng.standard_normal(48).astype(np.float32)
    want = np.tanh(from_bf16(x) @ from_bf16(w) + bias)
    np.savez(path.with_suffix(".npz"), in0=x, in1=w, in2=bias, out0=to_bf16(want))
    kernels = plans(path, target="sm_80")
    matmul = next(p for p in kernels if p.name == "linalg.matmul")
    assert matmul.mma == (16, 8, 16) and sum(p.mapped for p in kernels) == 1  # no copies
    report = sg.run("gpu_cpu", str(path))
    assert report.verified is True, report.message


def test_a_zero_filled_matmul_is_one_kernel_whose_accumulators_start_in_registers():
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.mma import rewrite_mma

    f16 = Path(__file__).parent / "data" / "gpu_matmul_f16.mlir"
    fill, matmul = plans(f16, target="sm_80")
    assert matmul.fused == (0,) and not fill.mapped
    module = sg.run("gpu", str(f16), target="sm_80", until="bufferized").module.ir
    with module.context:
        rewrite_mma(module)
    assert not collect(module, "linalg.fill")  # C is never zeroed in memory, nor read
    (loop,) = [op for op in collect(module, "scf.for") if collect(op, "nvgpu.mma.sync")]
    assert {v.owner.name for v in loop.operands[3:]} == {"vector.broadcast"}
    unfused = plans(f16, target="sm_80", param={"epilogues": False})
    assert unfused[0].mapped and unfused[1].fused == ()


SHARED_FILL = """func.func @two(%a: tensor<64x32xf16>, %b: tensor<32x48xf16>, %c: tensor<32x48xf16>)
    -> (tensor<64x48xf32>, tensor<64x48xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x48xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<64x48xf32>) -> tensor<64x48xf32>
  %x = linalg.matmul ins(%a, %b : tensor<64x32xf16>, tensor<32x48xf16>)
                     outs(%init : tensor<64x48xf32>) -> tensor<64x48xf32>
  %y = linalg.matmul ins(%a, %c : tensor<64x32xf16>, tensor<32x48xf16>)
                     outs(%init : tensor<64x48xf32>) -> tensor<64x48xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
      affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%x, %y : tensor<64x48xf32>, tensor<64x48xf32>) outs(%e : tensor<64x48xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %r = arith.addf %p, %q : f32
    linalg.yield %r : f32
  } -> tensor<64x48xf32>
  return %s, %y : tensor<64x48xf32>, tensor<64x48xf32>
}
"""


def test_a_shared_fill_and_a_consumer_of_two_matmuls_fuse_once(tmp_path):
    from stagegraph.mlir.walk import collect

    path = tmp_path / "two.mlir"
    path.write_text(SHARED_FILL)
    rng = np.random.default_rng(6)
    a, b, c = (rng.standard_normal(s).astype(np.float16) for s in ((64, 32), (32, 48), (32, 48)))
    x, y = (a.astype(np.float32) @ w.astype(np.float32) for w in (b, c))
    np.savez(path.with_suffix(".npz"), in0=a, in1=b, in2=c, out0=x + y, out1=y)
    fill, first, second, consumer = plans(path, target="sm_80")
    # The sum fuses with the first matmul only; the fill both read stays its own kernel.
    assert first.fused == (3,) and second.fused == () and fill.mapped and not consumer.mapped
    assert sg.run("gpu_cpu", str(path)).verified is True
    module = sg.run("gpu", str(path), target="sm_80", until="lower").module.ir
    assert len(collect(module, "nvvm.mma.sync")) == 2  # two kernels of 16x8 warp tiles
    assert not collect(module, "llvm.call")  # no buffer for C (no malloc) in either kernel


def test_the_tuner_may_pick_partial_tiles_within_the_masks_registers(tmp_path):
    from stagegraph.core.search_space import build_space
    from stagegraph.stages.gpu.target import resolve_gpu_target

    run = sg.run("gpu", str(linear(tmp_path, m=1000, n=1000, k=1000)), target="sm_80",
                 until="select")  # fmt: skip
    params, facts = run.value("select"), run.value("analyze")
    space = build_space(params, facts, resolve_gpu_target("sm_80"))
    assert space.contains(space.values_of(params))  # the cost model's partial tile
    # 1000 is a multiple of no tile: 128x128's fragments leave no room for the masks
    # (ptxas spills it on sm_80), 128x64's do.
    assert "op1.masked_fragments_fit_registers" in space.violated(
        {"op1.tile_m": 128, "op1.tile_n": 128})  # fmt: skip
    assert not space.violated({"op1.tile_m": 128, "op1.tile_n": 64})


def test_constant_weights_are_transposed_when_compiled(tmp_path):
    from stagegraph.mlir.walk import collect

    path = tmp_path / "wt.mlir"
    path.write_text("""func.func @wt(%x: tensor<16x3xf16>) -> tensor<16x2xf32> {
  %zero = arith.constant 0.0 : f32
  %w = arith.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf16>
  %te = tensor.empty() : tensor<3x2xf16>
  %wt = linalg.transpose ins(%w : tensor<2x3xf16>) outs(%te : tensor<3x2xf16>)
      permutation = [1, 0]
  %e = tensor.empty() : tensor<16x2xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<16x2xf32>) -> tensor<16x2xf32>
  %y = linalg.matmul ins(%x, %wt : tensor<16x3xf16>, tensor<3x2xf16>)
                     outs(%init : tensor<16x2xf32>) -> tensor<16x2xf32>
  return %y : tensor<16x2xf32>
}
""")
    x = np.random.default_rng(7).standard_normal((16, 3)).astype(np.float16)
    w = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    np.savez(path.with_suffix(".npz"), in0=x, out0=x.astype(np.float32) @ w.T)
    normalized = sg.run("gpu", str(path), until="normalize").module.ir
    assert not collect(normalized, "linalg.transpose")
    report = sg.run("gpu_cpu", str(path))
    assert report.verified is True, report.message
