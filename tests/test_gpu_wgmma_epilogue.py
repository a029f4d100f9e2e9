"""Matmul epilogues on wgmma blocks (sm_90a), without a GPU: a matmul with an elementwise
consumer (bias along rows or columns, ReLU, a scaling, a residual add, a cast to bf16)
takes wgmma with the consumer folded into its plan; the rewrite applies the consumer's
body to the block's C tile after the K loop (no linalg op, no global buffer for C left);
the PTX is one kernel with ``wgmma.mma_async`` and ``cp.async.bulk.tensor``, the
epilogue's ops after the last wgmma, assembled by ptxas without spills; ``gpu_cpu`` runs
the fused block schedule by numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

import stagegraph as sg
from tests.test_gpu_epilogue import linear
from tests.test_gpu_graph import needs_llvmlite
from tests.test_gpu_wgmma import WGMMA, global_memref, payload

#: A bf16 Linear layer: x @ w (f32 accumulation) from a fill of ``init``, a bias along the
#: columns (or rows), ReLU, a scaling by 0.5, rounded to bf16.
CAST = """#id = affine_map<(d0, d1) -> (d0, d1)>
#bias = affine_map<(d0, d1) -> ({bias_dim})>
func.func @linear(%x: tensor<{m}x{k}xbf16>, %w: tensor<{k}x{n}xbf16>, %b: tensor<{bias_len}xf32>)
    -> tensor<{m}x{n}xbf16> {{
  %zero = arith.constant 0.0 : f32
  %start = arith.constant {init} : f32
  %half = arith.constant 0.5 : f32
  %empty = tensor.empty() : tensor<{m}x{n}xf32>
  %init = linalg.fill ins(%start : f32) outs(%empty : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %c = linalg.matmul ins(%x, %w : tensor<{m}x{k}xbf16>, tensor<{k}x{n}xbf16>)
                     outs(%init : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %out = tensor.empty() : tensor<{m}x{n}xbf16>
  %e = linalg.generic {{indexing_maps = [#id, #bias, #id],
                        iterator_types = ["parallel", "parallel"]}}
      ins(%c, %b : tensor<{m}x{n}xf32>, tensor<{bias_len}xf32>) outs(%out : tensor<{m}x{n}xbf16>) {{
  ^bb0(%in: f32, %bias: f32, %o: bf16):
    %s = arith.addf %in, %bias : f32
    %a = arith.maximumf %s, %zero : f32
    %h = arith.mulf %a, %half : f32
    %t = arith.truncf %h : f32 to bf16
    linalg.yield %t : bf16
  }} -> tensor<{m}x{n}xbf16>
  return %e : tensor<{m}x{n}xbf16>
}}
"""


def cast_linear(tmp_path: Path, m: int, n: int, k: int, rows: bool = False,
                init: float = 0.0) -> str:  # fmt: skip
    text = CAST.format(m=m, n=n, k=k, init=init, bias_dim="d0" if rows else "d1",
                       bias_len=m if rows else n)  # fmt: skip
    path = tmp_path / f"cast_linear_{m}x{n}x{k}_{'rows' if rows else 'cols'}_{init}.mlir"
    path.write_text(text)
    return str(path)


def plans(path: str, param: dict | None = None) -> tuple:
    return sg.run("gpu", path, target="h100", until="select",
                  param={**WGMMA, **(param or {})}).value("select").kernels  # fmt: skip


# -- cost model -----------------------------------------------------------------------


def test_a_matmul_with_a_consumer_takes_wgmma_with_the_consumer_folded_in(tmp_path):
    path = cast_linear(tmp_path, 256, 256, 256)
    fill, matmul, consumer = plans(path)
    assert matmul.stages and matmul.mma == (64, matmul.tile_n, 16)
    assert matmul.fused == (2, 0) and not fill.mapped and not consumer.mapped
    # epilogues off: wgmma without them, the consumer its own kernel (to compare)
    off = plans(path, param={"epilogues": False})
    assert off[1].stages and off[1].fused == () and off[2].mapped
    # wgmma off: mma.sync, with its epilogue in registers
    mma = plans(path, param={"wgmma": False})
    assert mma[1].stages == 0 and mma[1].mma == (16, 8, 16) and mma[1].fused == (2, 0)
    # Without a consumer the block drops its zero fill itself (zero_fill.py): nothing folds.
    assert plans(payload(tmp_path, 256, 256, 256))[-1].fused == ()


# -- the rewrite ----------------------------------------------------------------------


@pytest.mark.parametrize(("k", "init"), [(256, 0.0), (512, 0.0), (256, 1.0)])
def test_rewrite_applies_the_consumer_to_the_c_tile_after_the_k_loop(tmp_path, k, init):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.wgmma import WS_ATTR
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    module = sg.run("gpu", cast_linear(tmp_path, 256, 256, k, init=init), target="h100",
                    until="bufferized", param=WGMMA).module.ir  # fmt: skip
    (marked,) = collect(module, lambda op: op.name == "linalg.matmul")
    assert (WS_ATTR in marked.attributes) == (k == 512)  # 8 K steps: warp-specialized
    with module.context:
        assert rewrite_wgmma(module) == 1
    assert not collect(module, lambda op: op.name.startswith("linalg."))
    assert not [a for a in collect(module, "memref.alloc") if global_memref(a.results[0])]
    foralls = [op for op in collect(module, "scf.forall") if op.parent.name == "func.func"]
    assert len(foralls) == 1  # the fill, the matmul and its consumer: one kernel
    stores = collect(module, "nvgpu.warpgroup.mma.store")
    assert len(stores) == (1 if k == 512 else 2)  # one per m64 accumulator of a warpgroup
    assert not any(global_memref(store.operands[1]) for store in stores)  # the shared tile
    order = [op.name for op in collect(module)]
    last_mma = len(order) - 1 - order[::-1].index("nvgpu.warpgroup.mma")
    assert order.index("arith.maximumf") > order.index("nvgpu.warpgroup.mma.store") > last_mma
    # C never reaches global memory: the only global store is the bf16 result, the only
    # global load the bias.
    stores = [op for op in collect(module, "memref.store") if global_memref(op.operands[1])]
    assert [str(s.operands[0].type) for s in stores] == ["bf16"]
    assert len([op for op in collect(module, "memref.load")
                if global_memref(op.operands[0])]) == 1  # fmt: skip
    (loop,) = [op for op in collect(module, "scf.for") if collect(op, "arith.maximumf")]
    # The bias add, and the fill's start where it is not zero.
    assert len(collect(loop, "arith.addf")) == 1 + (init != 0.0)
    assert len(collect(loop, "arith.truncf")) == 1


# -- PTX ------------------------------------------------------------------------------


@needs_llvmlite
@pytest.mark.parametrize(("k", "rows"), [(256, False), (512, True)])
def test_bf16_linear_is_one_wgmma_kernel_with_its_epilogue_and_no_spills(tmp_path, k, rows):
    from stagegraph.stages.gpu.ptx import assemble

    path = cast_linear(tmp_path, 256, 256, k, rows=rows)
    plan = plans(path)[1]
    binary = sg.run("gpu", path, target="h100", until="emit", param=WGMMA).value("emit")
    (text,) = binary.ptx.values()  # fill, matmul and epilogue: one kernel
    assert len(binary.manifest["kernels"]) == 1
    assert f"wgmma.mma_async.sync.aligned.m64n{plan.tile_n}k16.f32.bf16.bf16" in text
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in text
    last_wgmma = text.rindex("wgmma.mma_async")
    assert text.index("max.NaN.f32") > last_wgmma  # the ReLU, after the K loop
    assert text.index("cvt.rn.bf16.f32") > last_wgmma and "st.global.b16" in text
    assert "st.global.f32" not in text  # C itself is never stored to global memory
    assert ("setmaxnreg.inc.sync.aligned.u32 \t240" in text) == plan.warp_specialized
    (report,) = assemble(text, "sm_90a")
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0
    unfused = sg.run("gpu", path, target="h100", param={**WGMMA, "epilogues": False},
                     until="emit").value("emit")  # fmt: skip
    assert len(unfused.manifest["kernels"]) == 2  # the matmul (its zero fill dropped), the consumer


# -- values on the CPU ----------------------------------------------------------------


@pytest.mark.parametrize(("k", "rows"), [(128, False), (512, True)])  # plain, specialized
def test_fused_wgmma_schedule_verifies_on_the_cpu(tmp_path, k, rows):
    # f16 x @ w + bias (columns or rows), ReLU, + residual: the gpu_cpu graph runs the
    # scheduled module (the consumer's 128 x tile_n block loop with the matmul and its
    # fill fused in, before the wgmma rewrite) serially on the CPU.
    path = linear(tmp_path, m=256, n=128, k=k, dtype="f16", out="f32", rows=rows)
    plan = sg.run("gpu_cpu", str(path), target="h100", until="select", param=WGMMA).value("select")
    matmul = plan.kernels[1]
    assert matmul.stages and matmul.fused == (2, 0)
    assert matmul.warp_specialized == (k == 512)
    report = sg.run("gpu_cpu", str(path), target="h100", param=WGMMA)
    assert report.verified is True, report.message
