"""Hopper wgmma matmuls (sm_90a) without a GPU: the cost model's routing and its search
space, the kernel the rewrite builds from nvgpu ops (TMA descriptors on the host, an
mbarrier pipeline, ``nvgpu.warpgroup.mma``), the PTX (``wgmma.mma_async``,
``cp.async.bulk.tensor``, mbarriers; assembled by ptxas without spills for the shipped tile
shapes), the host plan's ``tensor_map`` steps and their encoding by the runtime against a
recording driver."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.errors import CudaError
from stagegraph.stages.gpu.wgmma import (
    WGMMA_ATTR,
    block_shared_bytes,
    choose,
    dynamic_shared_bytes,
    stage_bytes,
)
from tests.test_gpu_graph import needs_llvmlite


def payload(tmp_path: Path, m: int, n: int, k: int, dtype: str = "bf16",
            init: float = 0.0) -> str:  # fmt: skip
    a, b, c = f"tensor<{m}x{k}x{dtype}>", f"tensor<{k}x{n}x{dtype}>", f"tensor<{m}x{n}xf32>"
    path = tmp_path / f"mm_{dtype}_{m}x{n}x{k}_{init}.mlir"
    path.write_text(
        f"func.func @mm(%a: {a}, %b: {b}) -> {c} {{\n"
        f"  %zero = arith.constant {init} : f32\n"
        f"  %empty = tensor.empty() : {c}\n"
        f"  %init = linalg.fill ins(%zero : f32) outs(%empty : {c}) -> {c}\n"
        f"  %r = linalg.matmul ins(%a, %b : {a}, {b}) outs(%init : {c}) -> {c}\n"
        f"  return %r : {c}\n}}\n"
    )
    return str(path)


#: wgmma is opt-in (``GpuParams.wgmma`` off: sm_90a matmuls take mma.sync by default).
WGMMA = {"wgmma": True}


def matmul_plan(path: str, target: str = "h100", **params):
    return sg.run("gpu", path, target=target, until="select", param={**WGMMA, **params}).value(
        "select").kernels[-1]  # fmt: skip


# -- cost model -----------------------------------------------------------------------


def test_sm90a_half_matmuls_take_wgmma_and_others_keep_mma_sync(tmp_path):
    big = payload(tmp_path, 4096, 4096, 4096)
    plan = matmul_plan(big)
    # 64 K steps: warp-specialized (a producer and two consumer warpgroups); 32x16 blocks
    # of 128x256 fill 132 SMs; 4 stages of 48 KiB fit 227 KiB of opt-in shared memory.
    assert (plan.tile_m, plan.tile_n, plan.stages, plan.threads) == (128, 256, 4, (384,))
    assert plan.warp_specialized and plan.mma == (64, 256, 16)
    assert matmul_plan(big, "sm_80").stages == 0  # Ampere: mma.sync
    assert matmul_plan(big, wgmma=False).stages == 0  # the param keeps mma.sync
    assert matmul_plan(payload(tmp_path, 4096, 4096, 4096, "f16")).stages == 4
    short = matmul_plan(payload(tmp_path, 4096, 4096, 256))  # 4 K steps: one warpgroup
    assert (short.tile_n, short.stages, short.threads, short.warp_specialized) == (
        128, 5, (128,), False)  # fmt: skip
    # Rows not in 128s, or K not in 64s: the mma.sync path takes them.
    assert matmul_plan(payload(tmp_path, 192, 256, 128)).stages == 0
    assert matmul_plan(payload(tmp_path, 256, 256, 96)).stages == 0


def test_pipeline_depth_and_width_follow_the_target_facts(tmp_path):
    # Fewer blocks than SMs: the narrower tile gives more blocks.
    assert choose(1024, 1024, 1024, 132, 227 * 1024, 255) == (64, 8, True)
    assert choose(4096, 4096, 4096, 132, 227 * 1024, 255) == (256, 4, True)
    # 100 KiB of shared memory: no room for 128x256 f32 of C; 3 stages of 32 KiB at 128.
    assert choose(4096, 4096, 4096, 132, 100 * 1024, 255) == (128, 3, True)
    assert choose(4096, 4096, 128, 132, 227 * 1024, 255) == (128, 3, False)  # 2 K steps
    assert choose(4096, 4096, 128, 132, 227 * 1024, 150) == (64, 3, False)  # 128 f32: no
    # A block without room for the register split of 384 threads: one warpgroup.
    assert choose(4096, 4096, 4096, 132, 227 * 1024, 255, 32768) == (128, 7, False)
    from stagegraph.stages.gpu.target import resolve_gpu_target
    from stagegraph.stages.gpu.wgmma import plan_wgmma

    facts = sg.run("gpu", payload(tmp_path, 4096, 4096, 4096), until="analyze").value("analyze")
    small = resolve_gpu_target("h100").model_copy(update={"shared_bytes_per_block_optin":
                                                          100 * 1024})  # fmt: skip
    assert (plan_wgmma(facts.ops[1], small).stages, plan_wgmma(facts.ops[1], small).tile_n) == (
        3, 128)  # fmt: skip
    assert plan_wgmma(facts.ops[1], resolve_gpu_target("sm_89")) is None
    assert stage_bytes(128) == 32768 and dynamic_shared_bytes(2, 128) == 65536  # C tile
    assert block_shared_bytes(7, 128) == 7 * 32768 + 1024


def test_the_wgmma_space_is_declared_with_shared_memory_and_register_rules(tmp_path):
    from stagegraph.core.search_space import build_space
    from stagegraph.stages.gpu.target import resolve_gpu_target

    path = payload(tmp_path, 4096, 4096, 4096)
    run = sg.run("gpu", path, target="h100", until="select", param=WGMMA)
    params, facts = run.value("select"), run.value("analyze")
    space = build_space(params, facts, resolve_gpu_target("h100"))
    assert set(space.variables) == {"op1.tile_n", "op1.stages", "op1.warp_specialized"}
    assert space.contains(space.values_of(params))
    # tile 64: 24 KiB stages, all of 2..8 fit; 128: 32 KiB, 2..7 (8 would need 257 KiB);
    # 256 (specialized only: 256 f32 per thread do not fit one warpgroup): 48 KiB, 2..4.
    assert space.count() == ((7 + 6) * 2 + 3, True)
    on = {"op1.warp_specialized": 1}
    assert "op1.stages_fit_shared=232448B" in space.violated({**on, "op1.tile_n": 128,
                                                              "op1.stages": 8})  # fmt: skip
    assert "op1.accumulator_fits_registers=255|240" in space.violated({
        "op1.warp_specialized": 0, "op1.tile_n": 256, "op1.stages": 2})  # fmt: skip
    tuned = space.to_params({"op1.tile_n": 64, "op1.stages": 4, "op1.warp_specialized": 0})
    plan = tuned.kernels[-1]
    assert (plan.tile_n, plan.stages, plan.warp_specialized) == (64, 4, False)
    from stagegraph.stages.gpu.wgmma import plan_threads

    assert plan_threads(plan) == (128,) and plan_threads(params.kernels[-1]) == (384,)
    shallow = build_space(params, sg.run("gpu", payload(tmp_path, 4096, 4096, 128),
                          target="h100", until="analyze").value("analyze"),
                          resolve_gpu_target("h100"))  # fmt: skip
    assert "op1.stages_within_k_steps=2" in shallow.violated(
        {"op1.tile_n": 128, "op1.stages": 4, "op1.warp_specialized": 0}
    )


# -- the kernel, as IR ----------------------------------------------------------------


def test_rewrite_builds_the_tma_mbarrier_wgmma_pipeline(tmp_path):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.tma import SWIZZLE_ATTR
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    path = payload(tmp_path, 1024, 1024, 256)  # tile 64, 5 stages: 4 K steps in flight
    module = sg.run("gpu", path, target="h100", until="bufferized", param=WGMMA).module.ir
    (marked,) = collect(module, lambda op: WGMMA_ATTR in op.attributes)
    assert ir.IntegerAttr(marked.attributes[WGMMA_ATTR]).value == 5
    with module.context:
        assert rewrite_wgmma(module) == 1
    descriptors = collect(module, "nvgpu.tma.create.descriptor")
    assert len(descriptors) == 2 and all(d.parent.name == "func.func" for d in descriptors)
    assert [ir.IntegerAttr(d.attributes[SWIZZLE_ATTR]).value for d in descriptors] == [128, 128]
    assert len(collect(module, "nvgpu.mbarrier.init")) == 5
    (loop,) = [op for op in collect(module, "scf.for") if collect(op, "nvgpu.warpgroup.mma")]
    mmas = collect(loop, "nvgpu.warpgroup.mma")  # one m64 accumulator each: rows 0-63, 64-127
    assert len(mmas) == 2 and all("transposeB" in mma.attributes for mma in mmas)
    assert len(loop.results) == 3  # the two accumulators, the phase
    assert collect(loop, "nvgpu.mbarrier.try_wait.parity")
    loads = collect(module, "nvgpu.tma.async.load")
    assert len(loads) == 4 * 2 + 2  # the prologue's 4 steps (A, one B box), the refill
    assert len(collect(loop, "nvgpu.tma.async.load")) == 2
    assert len(collect(module, "nvgpu.warpgroup.mma.store")) == 2  # one per accumulator
    assert not collect(module, "linalg.matmul")


@pytest.mark.parametrize("specialized", [False, True])
def test_a_zero_filled_c_is_stored_and_any_other_c_is_added_to(tmp_path, specialized):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    k = 512 if specialized else 256
    for init, fills, loads_of_c in ((0.0, 0, 0), (1.0, 1, 1)):
        path = payload(tmp_path, 1024, 1024, k, init=init)
        module = sg.run("gpu", path, target="h100", until="bufferized", param=WGMMA).module.ir
        with module.context:
            rewrite_wgmma(module)
        foralls = [op for op in collect(module, "scf.forall") if op.parent.name == "func.func"]
        assert len(foralls) == 1 + fills  # the fill kernel is dropped when it writes zeros
        stores = collect(module, "nvgpu.warpgroup.mma.store")
        assert len(stores) == (1 if specialized else 2)  # one per m64 accumulator
        # Zeros: the accumulator goes to C itself; else to shared memory, then C += tile.
        on_c = global_memref(stores[0].operands[1])
        assert on_c == (init == 0.0)
        loads = collect(module, "memref.load")
        assert len([op for op in loads if global_memref(op.operands[0])]) == loads_of_c


def global_memref(value) -> bool:
    from stagegraph.mlir.bindings import ir

    return ir.MemRefType(value.type).memory_space is None


def test_warp_specialized_blocks_split_producer_and_consumers(tmp_path):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.wgmma import WS_ATTR
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    # 8 K steps: specialized; tile 64, 8 stages; C = 1 + A @ B: the epilogue adds to C.
    path = payload(tmp_path, 1024, 1024, 512, init=1.0)
    module = sg.run("gpu", path, target="h100", until="bufferized", param=WGMMA).module.ir
    (marked,) = collect(module, lambda op: WGMMA_ATTR in op.attributes)
    assert WS_ATTR in marked.attributes
    with module.context:
        assert rewrite_wgmma(module) == 1
    assert len(collect(module, "nvgpu.mbarrier.create")) == 2  # full and empty
    assert len(collect(module, "nvgpu.mbarrier.init")) == 2 * 8
    regs = collect(module, "nvvm.setmaxregister")
    assert sorted(ir_int(r.attributes["regCount"]) for r in regs) == [24, 240]
    loops = [op for op in collect(module, "scf.for")
             if collect(op, "nvgpu.mbarrier.try_wait.parity")]  # fmt: skip
    producer, consumer = sorted(loops, key=lambda op: len(collect(op, "nvgpu.warpgroup.mma")))
    assert len(collect(producer, "nvgpu.tma.async.load")) == 2  # A and one B box a step
    assert not collect(consumer, "nvgpu.tma.async.load")
    assert len(collect(consumer, "nvgpu.mbarrier.arrive")) == 1  # frees the previous slot
    assert len(collect(module, "nvvm.barrier")) == 2  # the consumers' named barrier


def ir_int(attr) -> int:
    from stagegraph.mlir.bindings import ir

    return ir.IntegerAttr(attr).value


@needs_llvmlite
def test_lowering_leaves_no_nvgpu_ops_and_aligns_the_dynamic_shared_memory(tmp_path):
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    module = sg.run("gpu", payload(tmp_path, 256, 256, 256), target="h100",
                    until="lower", param=WGMMA).module.ir  # fmt: skip
    assert not collect(module, lambda op: op.name.startswith("nvgpu.")
                       and op.name != "nvgpu.tma.create.descriptor")  # fmt: skip
    dynamic = [
        g
        for g in collect(module, "llvm.mlir.global")
        if ir.StringAttr(g.attributes["sym_name"]).value.startswith("__dynamic_shmem")
    ]
    assert [ir.IntegerAttr(g.attributes["alignment"]).value for g in dynamic] == [1024]
    with module.context:
        assert dynamic[0].attributes["linkage"] == ir.Attribute.parse("#llvm.linkage<external>")


# -- PTX ------------------------------------------------------------------------------

#: The shipped tile shapes: (shape, dtype, C's initial value) -> (tile_n, stages,
#: warp-specialized). A zero C is stored; any other is added to through shared memory.
SHIPPED = {((4096, 4096, 256), "bf16", 0.0): (128, 5, False),
           ((4096, 4096, 256), "bf16", 1.0): (128, 5, False),
           ((1024, 1024, 256), "f16", 0.0): (64, 5, False),
           ((2048, 2048, 512), "bf16", 0.0): (128, 7, True),
           ((1024, 1024, 1024), "f16", 0.0): (64, 8, True),
           ((4096, 4096, 4096), "bf16", 0.0): (256, 4, True),
           ((4096, 4096, 4096), "bf16", 1.0): (256, 4, True)}  # fmt: skip


@needs_llvmlite
@pytest.mark.parametrize(("shape", "dtype", "init"), list(SHIPPED))
def test_ptx_holds_wgmma_and_tma_and_assembles_without_spills(tmp_path, shape, dtype, init):
    from stagegraph.stages.gpu.ptx import assemble

    tile_n, stages, specialized = SHIPPED[(shape, dtype, init)]
    binary = sg.run("gpu", payload(tmp_path, *shape, dtype, init), target="h100",
                    until="emit", param=WGMMA).value("emit")  # fmt: skip
    (name,) = [n for n, text in binary.ptx.items() if "wgmma" in text]
    text = binary.ptx[name]
    assert f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.{dtype}.{dtype}" in text
    count = text.count("wgmma.mma_async")  # m64 rows (2, or 1 per consumer) x four k16 per
    assert count and count % ((1 if specialized else 2) * 4) == 0  # step, times unrolling
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in text
    assert "mbarrier.try_wait.parity" in text and "mbarrier.arrive.expect_tx" in text
    assert "wgmma.fence.sync.aligned" in text and "wgmma.commit_group.sync.aligned" in text
    assert ".extern .shared .align 1024 .b8 __dynamic_shmem__0[]" in text
    assert f".shared .align 8 .b8 __mbarrier[{8 * stages}]" in text
    assert ("setmaxnreg.dec.sync.aligned.u32 \t24" in text) == specialized
    assert ("setmaxnreg.inc.sync.aligned.u32 \t240" in text) == specialized
    assert ("bar.sync \t1, 256" in text) == (specialized and init != 0.0)  # consumers only
    assert len(binary.manifest["kernels"]) == (1 if init == 0.0 else 2)  # the fill's kernel
    (report,) = assemble(text, "sm_90a")
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0
    # Static: the mbarriers, padded so the dynamic stages start on a 1024-byte boundary.
    assert report.shared_bytes == 1024
    # A specialized block starts at 65536 / 384 registers; setmaxnreg moves them after.
    assert report.registers <= (168 if specialized else 255)
    (kernel,) = [k for k in binary.manifest["kernels"] if k["ptx"] == f"{name}.ptx"]
    m, n, _ = shape
    threads = 384 if specialized else 128
    assert kernel["launch"] == {
        "grid": [n // tile_n, m // 128, 1],
        "block": [threads, 1, 1],
        "shared_mem_bytes": dynamic_shared_bytes(stages, tile_n),
    }


# -- host plan, manifest, runtime -----------------------------------------------------


@pytest.fixture(scope="module")
def wgmma_binary(tmp_path_factory):
    path = payload(tmp_path_factory.mktemp("wgmma"), 256, 128, 128, "f16")
    return sg.run("gpu", path, target="h100", until="emit", param=WGMMA).value("emit")


@needs_llvmlite
def test_plan_encodes_one_tensor_map_per_operand_and_passes_their_addresses(wgmma_binary):
    plan = wgmma_binary.manifest["plan"]
    maps = [s for s in plan if s["op"] == "tensor_map"]
    assert [(s["source"]["buffer"], s["source"]["sizes"], s["box"]) for s in maps] == [
        ("in0", [256, 128], [128, 64]), ("in1", [128, 128], [64, 64])]  # fmt: skip
    assert {(s["swizzle"], s["l2_promotion"], s["oob_fill"]) for s in maps} == {
        (128, 256, "zero")}  # fmt: skip
    names = [s["buffer"] for s in maps]
    assert [s["bytes"] for s in plan if s["op"] == "alloc" and s["buffer"] in names] == [128] * 2
    launch = [s for s in plan if s["op"] == "launch"][-1]
    assert launch["args"][-2:] == [{"tensor_map": names[0]}, {"tensor_map": names[1]}]
    assert [s["buffer"] for s in plan if s["op"] == "free"][-2:] == names


@needs_llvmlite
def test_manifest_refuses_bad_tensor_map_steps(wgmma_binary):
    from pydantic import ValidationError

    from stagegraph.artifact.manifest import CudaManifest

    manifest = wgmma_binary.manifest
    CudaManifest.model_validate(manifest)
    plan = list(manifest["plan"])
    at = next(i for i, s in enumerate(plan) if s["op"] == "tensor_map")
    wide = dict(plan[at], box=[512, 64])
    with pytest.raises(ValidationError, match="box"):
        CudaManifest.model_validate({**manifest, "plan": [*plan[:at], wide, *plan[at + 1 :]]})
    unallocated = [s for i, s in enumerate(plan) if i != at - 1]  # its alloc dropped
    with pytest.raises(ValidationError, match="before alloc"):
        CudaManifest.model_validate({**manifest, "plan": unallocated})


class TensorMap:
    """What ``cuTensorMapEncodeTiled`` returns: 128 bytes behind ``getPtr``."""

    def __init__(self) -> None:
        self.data = (ctypes.c_uint8 * 128)(*range(128))

    def getPtr(self) -> int:
        return ctypes.addressof(self.data)


def _enum(prefix: str, *names: str) -> type:
    return type(prefix, (), {f"{prefix}{n}": f"{prefix}{n}" for n in names})


@needs_llvmlite
def test_runtime_encodes_tensor_maps_and_opts_in_to_the_shared_memory(monkeypatch,
                                                                      wgmma_binary):  # fmt: skip
    from stagegraph.runtime import cuda
    from tests.test_cuda_runtime import FakeDriver, Result

    class Driver(FakeDriver):
        CUtensorMapDataType = _enum("CU_TENSOR_MAP_DATA_TYPE_", "FLOAT16", "BFLOAT16")
        CUtensorMapInterleave = _enum("CU_TENSOR_MAP_INTERLEAVE_", "NONE")
        CUtensorMapSwizzle = _enum("CU_TENSOR_MAP_SWIZZLE_", "128B")
        CUtensorMapL2promotion = _enum("CU_TENSOR_MAP_L2_PROMOTION_", "L2_256B")
        CUtensorMapFloatOOBfill = _enum("CU_TENSOR_MAP_FLOAT_OOB_FILL_", "NONE")
        CUfunction_attribute = _enum("CU_FUNC_ATTRIBUTE_", "MAX_DYNAMIC_SHARED_SIZE_BYTES")
        cuuint64_t = type("cuuint64_t", (int,), {})
        cuuint32_t = type("cuuint32_t", (int,), {})

        def do_cuTensorMapEncodeTiled(self, *args):
            return (Result.CUDA_SUCCESS, TensorMap())

        def do_cuLaunchKernel(self, function, *rest):
            return (Result.CUDA_SUCCESS,)

    driver = Driver()
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    program = cuda.CudaProgram(wgmma_binary.manifest, wgmma_binary.ptx, {})
    (opt_in,) = [c for c in driver.calls if c[0] == "cuFuncSetAttribute"]
    assert opt_in[2:] == ("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
                          dynamic_shared_bytes(3, 64))  # 3 stages of 128x64 and 64x64  # fmt: skip
    a, b = np.ones((256, 128), np.float16), np.ones((128, 128), np.float16)
    program.upload([a, b])
    encodes = [c[1:] for c in driver.calls if c[0] == "cuTensorMapEncodeTiled"]
    a_at, b_at = (program.buffers[n] for n in ("in0", "in1"))
    assert encodes[0] == ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2, a_at, [128, 256], [256],
                          [64, 128], [1, 1], "CU_TENSOR_MAP_INTERLEAVE_NONE",
                          "CU_TENSOR_MAP_SWIZZLE_128B", "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
                          "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")  # fmt: skip
    assert encodes[1][2:6] == (b_at, [128, 128], [256], [64, 64])  # dims, bytes, box
    # the arrays go as the driver's integer types (cuda-bindings refuses plain ints)
    assert [type(v).__name__ for v in (*encodes[0][3], *encodes[0][4])] == ["cuuint64_t"] * 3
    assert [type(v).__name__ for v in (*encodes[0][5], *encodes[0][6])] == ["cuuint32_t"] * 4
    maps = [s["buffer"] for s in wgmma_binary.manifest["plan"] if s["op"] == "tensor_map"]
    assert bytes(driver.memory[program.buffers[maps[0]]]) == bytes(range(128))
    program.close()


def test_encoding_refuses_views_tma_cannot_describe():
    from stagegraph.runtime.tensor_map import encode_arguments

    step = {"buffer": "t", "box": [8, 8], "swizzle": 0, "l2_promotion": 0, "oob_fill": "zero",
            "source": {"buffer": "x", "offset": 0, "sizes": [8, 12], "strides": [12, 1],
                       "dtype": "f16"}}  # fmt: skip
    with pytest.raises(CudaError, match="16-byte aligned rows"):
        encode_arguments(step, 0x1000)  # rows of 24 bytes
    args = encode_arguments({**step, "source": {**step["source"], "sizes": [8, 16],
                             "strides": [16, 1]}}, 0x1000)  # fmt: skip
    assert (args["dims"], args["strides"], args["swizzle"]) == ([16, 8], [32], "NONE")


def test_tune_explains_the_wgmma_space(capsys, tmp_path):
    from tests.test_cli_core import run_cli

    path = payload(tmp_path, 4096, 4096, 4096)
    code, out, _ = run_cli(capsys, "tune", "gpu", path, "--target", "h100", "--explain")
    assert code == 0, out
    assert "ops wgmma_matmul" in out and "op1.warp_specialized {0,1}" in out
    assert "op1.stages_fit_shared=232448B" in out and "size: 29" in out


@needs_llvmlite
def test_gpu_matmul_builds_wgmma_artifacts_for_sm90a(tmp_path):
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    build = [sys.executable, "benchmarks/gpu_matmul.py", "--build", str(tmp_path),
             "--target", "sm_90a", "--shapes", "256x128x128", "200x64x32"]  # fmt: skip
    done = subprocess.run(build, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    cases = {c["name"]: c for c in json.loads((tmp_path / "cases.json").read_text())["cases"]}
    paths = {name: (c["path"], c["stages"]) for name, c in cases.items()}
    assert paths["bf16_256x128x128"] == paths["f16_256x128x128"] == ("wgmma", 3)
    assert paths["bf16_200x64x32"][0] != "wgmma"  # 200 rows: another path
    manifest = json.loads((tmp_path / "bf16_256x128x128" / "manifest.json").read_text())
    assert [s["box"] for s in manifest["plan"] if s["op"] == "tensor_map"] == [[128, 64], [64, 64]]
    other = tmp_path / "sync"  # the same case on mma.sync too, to compare the paths
    done = subprocess.run(
        [*build[:3], str(other), "--shapes", "256x128x128", "--compare-mma-sync"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    cases = json.loads((other / "cases.json").read_text())["cases"]
    assert {c["name"]: c["path"] for c in cases} == {
        "bf16_256x128x128": "wgmma", "bf16_256x128x128_mmasync": "mma.sync",
        "f16_256x128x128": "wgmma", "f16_256x128x128_mmasync": "mma.sync"}  # fmt: skip


@pytest.mark.parametrize("k", [128, 512])  # a plain and a warp-specialized block
def test_wgmma_tiling_keeps_the_matmul_meaning_on_the_cpu(tmp_path, k):
    # The gpu_cpu graph runs the scheduled module (the 128 x tile_n block loop, before the
    # wgmma rewrite) serially on the CPU: the block tiling is checked by numbers.
    path = Path(payload(tmp_path, 256, 256, k, "f16"))
    rng = np.random.default_rng(4)
    a = rng.standard_normal((256, k)).astype(np.float16)
    b = rng.standard_normal((k, 256)).astype(np.float16)
    np.savez(path.with_suffix(".npz"), in0=a, in1=b,
             out0=a.astype(np.float32) @ b.astype(np.float32))  # fmt: skip
    plan = sg.run("gpu_cpu", str(path), target="h100", until="select", param=WGMMA).value("select")
    assert plan.kernels[-1].stages and plan.kernels[-1].warp_specialized == (k == 512)
    report = sg.run("gpu_cpu", str(path), target="h100", param=WGMMA)
    assert report.verified is True, report.message


@pytest.mark.parametrize(("rows", "cols", "group"), [(64, 32, 16), (32, 32, 11), (5, 7, 3),
                                                     (7, 3, 7), (1, 9, 1)])  # fmt: skip
def test_grouped_block_order_visits_every_tile_once(rows, cols, group):
    from stagegraph.stages.gpu.raster import grouped_tile

    tiles = [grouped_tile(n, rows, cols, group) for n in range(rows * cols)]
    assert sorted(tiles) == [(r, c) for r in range(rows) for c in range(cols)]
    # The first blocks stay within the first `group` tile rows.
    assert {r for r, _ in tiles[: group * cols]} == set(range(min(group, rows)))


def test_wgmma_blocks_run_in_groups_of_tile_rows(tmp_path):
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.raster import group_rows
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    path = payload(tmp_path, 4096, 4096, 4096)
    assert matmul_plan(path).group_m == 16 == group_rows(132, 128, 256, 32, 16)
    assert group_rows(132, 128, 64, 8, 16) == 0  # one wave: the plain order
    module = sg.run("gpu", path, target="h100", until="bufferized", param=WGMMA).module.ir
    with module.context:
        rewrite_wgmma(module)
    (forall,) = [op for op in collect(module, "scf.forall") if op.parent.name == "func.func"]
    row, col = forall.regions[0].blocks[0].arguments[:2]
    # The tile indices are read only by the renumbering; the tiles use its results.
    assert [use.owner.name for use in row.uses] == ["arith.muli"]
    assert [use.owner.name for use in col.uses] == ["arith.addi"]
    assert len(collect(forall, "arith.minui")) == 1
