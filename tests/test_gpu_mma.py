"""Tensor-core matmuls on the GPU graph without a GPU: the fragment layouts against the PTX
ISA, the cost model's routing, the schedule's block/warp/instruction tiling, the
``nvgpu.mma.sync`` rewrite, and the PTX (``mma.sync``, assembled by ptxas, no spills)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.stages.gpu.mma import HALF_SHAPE, TF32_SHAPE, lane_places
from stagegraph.stages.gpu.schedule import schedule_text
from tests.conftest import kernelbench_or_skip
from tests.test_gpu_graph import needs_gpu, needs_llvmlite

F16 = Path(__file__).parent / "data" / "gpu_matmul_f16.mlir"
#: Keeps sm_90a matmuls on mma.sync (the default there is wgmma: tests/test_gpu_wgmma.py).
MMA_SYNC = {"wgmma": False}


def payload(tmp_path: Path, dtype: str, m: int = 128, n: int = 256, k: int = 64) -> str:
    """The f16 payload with another input type and shape."""
    text = F16.read_text().replace("xf16", f"x{dtype}")
    for old, new in (("128x", f"{m}x"), ("x256", f"x{n}"), ("x64x", f"x{k}x"),
                     ("64x", f"{k}x")):  # fmt: skip
        text = text.replace(old, new)
    path = tmp_path / f"mm_{dtype}_{m}_{n}_{k}.mlir"
    path.write_text(text)
    return str(path)


# -- fragment layouts -----------------------------------------------------------------


@pytest.mark.parametrize("shape", [HALF_SHAPE, TF32_SHAPE])
def test_lanes_cover_every_tile_element_once(shape):
    m, n, k = shape
    places = lane_places(shape)
    for name, rows, cols in (("a", m, k), ("b", k, n), ("c", m, n)):
        held = [p for lane in places[name] for p in lane]
        assert sorted(held) == [(r, c) for r in range(rows) for c in range(cols)], name


def test_fragment_layouts_follow_the_ptx_isa():
    # mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type"):
    # lane 5 is groupID 1, threadID_in_group 1.
    half = lane_places(HALF_SHAPE)
    assert half["a"][5] == [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)]
    assert half["b"][5] == [(2, 1), (3, 1), (10, 1), (11, 1)]  # (k, n)
    assert half["c"][5] == [(1, 2), (1, 3), (9, 2), (9, 3)]
    tf32 = lane_places(TF32_SHAPE)  # mma.m16n8k8 .tf32
    assert tf32["a"][30] == [(7, 2), (15, 2), (7, 6), (15, 6)]
    assert tf32["b"][30] == [(2, 7), (6, 7)]


# -- cost model and schedule ----------------------------------------------------------


def test_half_matmuls_go_to_tensor_cores_and_f32_only_with_tf32(tmp_path):
    fill, matmul = sg.run("gpu", str(F16), target="sm_80", until="select").value("select").kernels
    assert fill.mma == () and matmul.mma == (16, 8, 16)
    # 128x256 on 108 SMs: no tile fills the GPU, so the one with the most blocks (64).
    assert (matmul.tile_m, matmul.tile_n, matmul.threads) == (32, 16, (128,))
    f32 = payload(tmp_path, "f32")
    plain = sg.run("gpu", f32, until="select").value("select").kernels[1]
    assert plain.mma == () and plain.thread_tile  # SIMT: one output per thread
    tf32 = sg.run("gpu", f32, until="select", param={"tf32": True}).value("select").kernels[1]
    assert tf32.mma == (16, 8, 8)
    simt = sg.run("gpu", str(F16), until="select", param={"tensor_cores": False})
    assert simt.value("select").kernels[1].mma == ()


def test_shapes_without_whole_tiles_go_to_tensor_cores_too(tmp_path):
    odd = sg.run("gpu", payload(tmp_path, "f16", m=100), until="select").value("select")
    assert odd.kernels[1].mma == (16, 8, 16)  # partial tiles (gpu.mma_bounds)
    big = sg.run("gpu", payload(tmp_path, "f16", m=4096, n=2048, k=128), target="h100",
                 until="select", param=MMA_SYNC).value("select").kernels[1]  # fmt: skip
    assert (big.tile_m, big.tile_n) == (128, 128)  # 512 blocks: the largest tile fills 132 SMs


def test_block_tiles_are_a_declared_search_space():
    from stagegraph.core.search_space import build_space
    from stagegraph.stages.gpu.mma import (
        BLOCK_TILES,
        fragment_registers,
        register_budget,
        tile_fits,
    )
    from stagegraph.stages.gpu.mma_staged import shared_bytes
    from stagegraph.stages.gpu.params import MMA_TILES
    from stagegraph.stages.gpu.target import resolve_gpu_target

    run = sg.run("gpu", str(F16), target="sm_80", until="select")
    params, facts = run.value("select"), run.value("analyze")
    space = build_space(params, facts, resolve_gpu_target("sm_80"))
    assert set(space.variables) == {"op1.tile_m", "op1.tile_n"}
    assert space.contains(space.values_of(params))
    budget = register_budget(65536)  # 191 of 255 for fragments
    fitting = [(bm, bn) for bm in MMA_TILES for bn in MMA_TILES
               if tile_fits(128, 256, 64, (16, 8, 16), (bm, bn))
               and fragment_registers(bm, bn) <= budget
               and shared_bytes(bm // 2, bn // 2, 16, 2, 4) <= 48 * 1024]  # fmt: skip
    assert space.count() == (len(fitting), True) and len(fitting) == 14  # not 128x256
    assert "op1.staging_fits_shared=49152B" in space.constraints
    assert "op1.fragments_fit_registers" in space.violated({"op1.tile_m": 128,
                                                            "op1.tile_n": 256})  # fmt: skip
    assert all(fragment_registers(*tile) <= budget for tile in BLOCK_TILES)
    assert "op1.warp_rows_whole_instructions" in space.violated({"op1.tile_m": 16,
                                                                 "op1.tile_n": 64})  # fmt: skip
    tuned = space.to_params({"op1.tile_m": 64, "op1.tile_n": 128})
    assert "tile_sizes [64, 128, 0]" in schedule_text(tuned)


def test_schedule_tiles_blocks_then_warps_and_marks_the_warp_matmul():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    module = sg.run("gpu", str(F16), target="sm_80", until="scheduled").module.ir
    warps = [op for op in collect(module, "scf.forall") if any(
        "gpu.warp" in str(m) for m in ir.ArrayAttr(op.attributes["mapping"]))]  # fmt: skip
    assert len(warps) == 1
    (inner,) = collect(warps[0], lambda op: "stagegraph.gpu_mma" in op.attributes)
    assert inner.name == "linalg.matmul"
    shapes = [ir.RankedTensorType(v.type).shape for v in inner.operands]
    assert shapes == [[16, 64], [64, 8], [16, 8]]  # a 32x16 block tile on 2x2 warps, all K


def test_rewrite_keeps_accumulators_in_loop_values_across_k(tmp_path):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.mma import rewrite_mma

    # Right after the rewrite: one loop over K per warp matmul, carrying one 2x2 f32
    # accumulator per 16x8 fragment of the warp's 64x64 tile, one mma.sync per fragment.
    big = payload(tmp_path, "bf16", m=4096, n=2048, k=128)
    module = sg.run("gpu", big, target="h100", until="bufferized", param=MMA_SYNC).module.ir
    with module.context:
        assert rewrite_mma(module) == 1
    (loop,) = [op for op in collect(module, "scf.for")
               if collect(op, "nvgpu.mma.sync")]  # fmt: skip
    assert len(loop.results) == 32 and str(loop.results[0].type) == "vector<2x2xf32>"
    assert len(collect(loop, "nvgpu.mma.sync")) == 32
    assert not collect(loop, "memref.store")  # C is stored once, after the loop


def test_lowering_rewrites_each_warp_matmul_to_nvvm_mma_sync():
    from stagegraph.mlir.walk import collect

    module = sg.run("gpu", str(F16), target="sm_80", until="lower").module.ir
    mmas = collect(module, "nvvm.mma.sync")
    assert len(mmas) == 1  # one 16x8 fragment per warp, in a loop over K (LLVM unrolls it)
    assert not collect(module, lambda op: op.name.startswith(("linalg.", "nvgpu.")))
    assert all(op.parent.name != "func.func" for op in mmas)  # inside the kernel


@needs_llvmlite
def test_the_largest_tile_assembles_without_spills(tmp_path):
    from stagegraph.stages.gpu.ptx import assemble

    big = payload(tmp_path, "bf16", m=4096, n=2048, k=128)
    binary = sg.run("gpu", big, target="h100", until="emit", param=MMA_SYNC).value("emit")
    (text,) = [t for t in binary.ptx.values() if "mma.sync" in t]
    (report,) = assemble(text, "sm_90a")
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0
    assert report.registers <= 255 and text.count("mma.sync.aligned.m16n8k16") == 32
    assert report.shared_bytes == 4 * 2 * (64 * 24 + 16 * 72) * 2  # 44 KiB of cp.async stages
    assert text.count("ldmatrix") == 4 + 8  # per K step: A's 4 row blocks, B's 8 column ones


# -- PTX ------------------------------------------------------------------------------


@needs_llvmlite
@pytest.mark.parametrize(
    ("dtype", "params", "instruction"),
    [("f16", {}, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
     ("bf16", {}, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
     ("f32", {"tf32": True}, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")],
)  # fmt: skip
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_holds_mma_sync_and_assembles_without_spills(tmp_path, dtype, params, instruction,
                                                         arch):  # fmt: skip
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", payload(tmp_path, dtype), target=arch, param={**params, **MMA_SYNC},
                    until="emit").value("emit")  # fmt: skip
    matmul = [text for text in binary.ptx.values() if "mma.sync" in text]
    assert len(matmul) == 1 and instruction in matmul[0]
    # Both operands staged through shared memory by cp.async, two stages deep.
    assert "cp.async.cg.shared.global" in matmul[0] and "cp.async.wait_group 	1" in matmul[0]
    # f16/bf16 fragments come from shared memory by ldmatrix (B transposed); TF32's by loads.
    ldmatrix = ("ldmatrix.sync.aligned.m8n8.x4.shared.b16" in matmul[0],
                "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in matmul[0])  # fmt: skip
    assert ldmatrix == ((True, True) if dtype != "f32" else (False, False))
    for text in binary.ptx.values():
        for report in assemble(text, arch):
            assert report.spill_stores == report.spill_loads == report.stack_bytes == 0
            if text is matmul[0]:  # 4 warps x 2 stages x (A + B), rows padded by 16 bytes:
                # 16x24 + 16x16 halves, or for TF32 16x12 + 8x12 floats
                assert report.shared_bytes == (9216 if dtype == "f32" else 10240)
    (launch,) = [k["launch"] for k in binary.manifest["kernels"] if "mma" in
                 binary.ptx[k["ptx"].removesuffix(".ptx")]]  # fmt: skip
    assert launch["block"] == [128, 1, 1] and launch["grid"] == [16, 4, 1]  # 256 / 16 by 128 / 32


@needs_gpu
def test_tensor_core_matmul_matches_numpy_on_a_gpu():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 256)).astype(np.float16)
    binary = sg.run("gpu", str(F16), target="cuda", until="emit").value("emit")
    (c,) = binary.call("matmul_f16", [a, b])
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c, want, rtol=1e-3, atol=1e-3)


# -- benchmarks/gpu_matmul.py ---------------------------------------------------------

RUN_SIDE = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pydantic', 'torch_mlir', 'mlir'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Blocker())
sys.argv = ['gpu_matmul.py', '--run', sys.argv[1]]
sys.path.insert(0, 'benchmarks')
import gpu_matmul
sys.exit(gpu_matmul.main())
"""


@needs_llvmlite
def test_gpu_matmul_builds_cases_and_its_run_side_needs_no_pydantic_or_mlir(tmp_path):
    import json
    import subprocess
    import sys

    from tests.test_gpu_graph import gpu_present

    root = Path(__file__).resolve().parents[1]
    build = [sys.executable, "benchmarks/gpu_matmul.py", "--build", str(tmp_path),
             "--target", "sm_80", "--shapes", "64x64x32", "100x64x32"]  # fmt: skip
    done = subprocess.run(build, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "cases.json").read_text())
    mma = {case["name"]: case["mma"] for case in meta["cases"]}
    assert mma == {"bf16_64x64x32": [16, 8, 16], "f16_64x64x32": [16, 8, 16],
                   "bf16_100x64x32": [16, 8, 16], "f16_100x64x32": [16, 8, 16]}  # fmt: skip
    assert meta["peak_tflops"]["bf16"] > 0
    assert (tmp_path / "f16_64x64x32" / "manifest.json").exists()
    ran = subprocess.run([sys.executable, "-c", RUN_SIDE, str(tmp_path)], capture_output=True,
                         text=True, cwd=root)  # fmt: skip
    if gpu_present():
        assert ran.returncode == 0, ran.stdout + ran.stderr
    else:
        assert ran.returncode == 2 and "no NVIDIA GPU" in ran.stderr, ran.stderr


@pytest.mark.slow  # torch.export and a compile in a subprocess: about 20 s
@needs_llvmlite
def test_gpu_matmul_builds_a_level2_linear_case_in_bf16(tmp_path):
    import json
    import shutil
    import subprocess
    import sys

    pytest.importorskip("torch")
    source = kernelbench_or_skip("level2").parent / "src" / "level2"
    problems = tmp_path / "problems"  # two problem files, read from ../shared
    problems.mkdir()
    for stem in ("l2_059_Matmul_Swish_Scaling", "l2_063_Gemm_ReLU_Divide"):
        shutil.copy(source / f"{stem}.py", problems)
    root = Path(__file__).resolve().parents[1]
    build = [sys.executable, "benchmarks/gpu_matmul.py", "--build", str(tmp_path / "out"),
             "--target", "sm_90a", "--shapes", "--linear", str(problems), "--batch", "64",
             "--features", "64", "--only", "*Swish*"]  # fmt: skip
    done = subprocess.run(build, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    (case,) = json.loads((tmp_path / "out" / "cases.json").read_text())["cases"]
    # bf16 Linear + Swish + scale: one tensor-core kernel (weights transposed when compiled).
    assert case["mma"] == [16, 8, 16] and case["kernels"] == 1 and case["linear"]
    folder = tmp_path / "out" / case["name"]
    # What the run side will time on the GPU, run here on the CPU: the saved program on
    # the saved inputs is the reference the compiled payload (through gpu_cpu) matches.
    import torch

    from stagegraph.dtypes import to_bf16

    bits = np.load(folder / "inputs.npz")["arr_0"]
    x = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    with torch.no_grad():
        ref = torch.export.load(folder / "model.pt2").module()(x)
    payload = tmp_path / "out-src" / f"{case['name']}.mlir"
    np.savez(payload.with_suffix(".npz"), in0=bits, out0=to_bf16(ref.float().numpy()))
    report = sg.run("gpu_cpu", str(payload))
    assert report.verified is True, report.message


# -- the tiling, run on the CPU (gpu_cpu graph) ---------------------------------------


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_tensor_core_tiling_keeps_the_matmul_meaning_on_the_cpu(tmp_path, dtype):
    # The gpu_cpu graph runs the scheduled module (block, warp and instruction-tile loops,
    # before the mma.sync rewrite) serially on the CPU: the tiling is checked by numbers.
    path = Path(payload(tmp_path, dtype))
    kind = np.float16 if dtype == "f16" else np.float32
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((128, 64)).astype(kind), rng.standard_normal((64, 256)).astype(kind)
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.savez(path.with_suffix(".npz"), in0=a, in1=b, out0=want)
    params = {"tf32": True} if dtype == "f32" else {}
    run = sg.run("gpu_cpu", str(path), until="select", param=params)
    assert run.value("select").kernels[1].mma  # the tensor-core plan is what runs
    report = sg.run("gpu_cpu", str(path), param=params)
    assert report.verified is True, report.message


# -- batch matmuls (attention) --------------------------------------------------------


def batch_payload(tmp_path: Path, dtype: str) -> Path:
    b, m, n, k = 4, 64, 128, 32
    a_t, b_t = f"tensor<{b}x{m}x{k}x{dtype}>", f"tensor<{b}x{k}x{n}x{dtype}>"
    c_t = f"tensor<{b}x{m}x{n}xf32>"
    path = tmp_path / f"bmm_{dtype}.mlir"
    path.write_text(
        f"func.func @bmm(%a: {a_t}, %b: {b_t}) -> {c_t} {{\n"
        "  %zero = arith.constant 0.0 : f32\n"
        f"  %empty = tensor.empty() : {c_t}\n"
        f"  %init = linalg.fill ins(%zero : f32) outs(%empty : {c_t}) -> {c_t}\n"
        f"  %c = linalg.batch_matmul ins(%a, %b : {a_t}, {b_t}) outs(%init : {c_t}) -> {c_t}\n"
        f"  return %c : {c_t}\n}}\n"
    )
    return path


def test_batch_matmul_tiling_verifies_on_the_cpu(tmp_path):
    path = batch_payload(tmp_path, "f16")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 64, 32)).astype(np.float16)
    b = rng.standard_normal((4, 32, 128)).astype(np.float16)
    np.savez(
        path.with_suffix(".npz"), in0=a, in1=b, out0=a.astype(np.float32) @ b.astype(np.float32)
    )
    plan = sg.run("gpu_cpu", str(path), until="select").value("select").kernels[1]
    assert plan.mma == (16, 8, 16)
    report = sg.run("gpu_cpu", str(path))
    assert report.verified is True, report.message


@needs_llvmlite
def test_batch_matmul_ptx_holds_mma_sync_with_the_batch_on_the_grid(tmp_path):
    from stagegraph.stages.gpu.ptx import assemble

    binary = sg.run("gpu", str(batch_payload(tmp_path, "bf16")), target="sm_80",
                    until="emit").value("emit")  # fmt: skip
    (name,) = [n for n, t in binary.ptx.items() if "mma.sync" in t]
    assert "m16n8k16.row.col.f32.bf16.bf16.f32" in binary.ptx[name]
    (report,) = assemble(binary.ptx[name], "sm_80")
    assert report.spill_stores == report.spill_loads == 0
    (launch,) = [k["launch"] for k in binary.manifest["kernels"] if k["ptx"] == f"{name}.ptx"]
    assert launch["grid"] == [8, 2, 4] and launch["block"] == [128, 1, 1]  # n/16, m/32, batch


def test_tune_explains_the_tensor_core_space(capsys):
    from tests.test_cli_core import run_cli

    code, out, _ = run_cli(capsys, "tune", "gpu", str(F16), "--target", "sm_80", "--explain")
    assert code == 0, out
    assert "op1.tile_m {16,32,64,128,256}" in out and "op1.fragments_fit_registers" in out
    assert "op1.staging_fits_shared=49152B" in out
    assert "size: 14" in out


def test_staging_copies_each_step_with_cp_async_into_two_stages(tmp_path):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.mma import rewrite_mma

    big = payload(tmp_path, "bf16", m=4096, n=2048, k=128)  # 64x64 warp tiles, 16-deep steps
    module = sg.run("gpu", big, target="h100", until="bufferized", param=MMA_SYNC).module.ir
    with module.context:
        rewrite_mma(module)
    (loop,) = [op for op in collect(module, "scf.for") if collect(op, "nvgpu.mma.sync")]
    # 64x16 of A and 16x64 of B are 128 16-byte chunks each: 4 per lane, per step.
    assert len(collect(loop, "nvgpu.device_async_copy")) == 8
    waits = collect(module, "nvgpu.device_async_wait")
    assert [ir.IntegerAttr(w.attributes["numGroups"]).value for w in waits] == [1, 0]
    (a_stages, b_stages) = collect(module, "memref.alloc")
    assert [ir.MemRefType(x.results[0].type).shape for x in (a_stages, b_stages)] == [
        [4, 2, 64, 24], [4, 2, 16, 72]]  # rows padded by 16 bytes  # fmt: skip


def test_shared_buffers_become_module_globals_in_shared_memory():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    module = sg.run("gpu", str(F16), target="sm_80", until="lower").module.ir
    globals_ = [g for g in collect(module, "llvm.mlir.global") if "addr_space" in g.attributes]
    spaces = [ir.IntegerAttr(g.attributes["addr_space"]).value for g in globals_]
    assert spaces == [3, 3] and not collect(module, "memref.alloc")  # NVVM's shared space
