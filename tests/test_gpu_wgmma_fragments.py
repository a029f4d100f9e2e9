"""Where the wgmma blocks' accumulators land in C (sm_90a), without a GPU.

The first H200 run of the wgmma path wrote wrong rows and left others unwritten: the
upstream ``nvgpu.warpgroup.mma.store`` lowering stores an accumulator of two ``m64``
fragments at a row offset that counts registers (32 rows at ``tile_n = 64``, not 64),
and it places a fragment's rows by the raw ``threadIdx.x`` (warpgroup ``g`` of the block
writes rows ``64g..``), so consumers in warpgroups 1 and 2 wrote 64 rows too low. These
tests hold the fixed structure: every accumulator is one ``m64`` fragment whose rows of A
(its wgmma's descriptor) are the rows it is stored to; a plain block stores its two
fragments at rows 0 and 64; a warp-specialized block's consumers are warpgroups 0 and 1
and its producer warpgroup 2; the PTX's stores of a plain block cover rows 0-127 of the
tile exactly. And a block with exactly 48 KiB of dynamic shared memory (plus its static
mbarriers) is launched with the opt-in the H200 refused it without.
"""

from __future__ import annotations

import re

import pytest

import stagegraph as sg
from tests.test_gpu_graph import needs_llvmlite
from tests.test_gpu_wgmma import WGMMA, global_memref, ir_int, payload


def rewritten(tmp_path, m: int, n: int, k: int, init: float = 0.0):
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    module = sg.run("gpu", payload(tmp_path, m, n, k, init=init), target="h100",
                    until="bufferized", param=WGMMA).module.ir  # fmt: skip
    with module.context:
        assert rewrite_wgmma(module) == 1
    return module


def owner(value):
    from stagegraph.mlir.walk import defining_op

    return defining_op(value)


def static(op, name: str) -> list[int]:
    from stagegraph.mlir.bindings import ir

    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def constant(value) -> int:
    from stagegraph.mlir.bindings import ir

    op = owner(value)
    assert op.name == "arith.constant", op.name
    return ir.IntegerAttr(op.attributes["value"]).value


def fragment(n: int):
    from stagegraph.mlir.bindings import ir

    return ir.Type.parse(f"!nvgpu.warpgroup.accumulator<fragmented = vector<64x{n}xf32>>")


def a_rows_at(mma):
    """The ``arith.addi`` of this wgmma's A view offset: the stage's A slot (operand 0) plus
    the byte offset of the rows this accumulator computes (operand 1)."""
    described = owner(mma.operands[0])
    assert described.name == "nvgpu.warpgroup.generate.descriptor"
    view = owner(described.operands[0])
    assert view.name == "memref.view"
    at = owner(view.operands[1])
    assert at.name == "arith.addi"
    return at


@pytest.mark.parametrize("init", [0.0, 1.0])  # stored to C; added to C through shared memory
def test_a_plain_block_stores_each_m64_accumulator_at_the_rows_it_computed(tmp_path, init):
    from stagegraph.mlir.walk import collect

    module = rewritten(tmp_path, 1024, 1024, 256, init)  # tile 64, one warpgroup
    with module.context:
        (loop,) = [op for op in collect(module, "scf.for") if collect(op, "nvgpu.warpgroup.mma")]
        mmas = collect(loop, "nvgpu.warpgroup.mma")
        assert [m.results[0].type == fragment(64) for m in mmas] == [True, True]
        # wgmma p reads A's rows 64p..64p+63 (8 KiB of 128-byte rows per 64) and is loop
        # result p; each waits until at most the step's two groups are in flight.
        assert [constant(a_rows_at(m).operands[1]) for m in mmas] == [0, 8192]
        assert [m.attributes["waitGroup"] for m in mmas] == [mmas[0].attributes["waitGroup"]] * 2
        stores = collect(module, "nvgpu.warpgroup.mma.store")
        assert len(stores) == 2
        rows = []
        for part, store in enumerate(stores):
            assert store.operands[0] == loop.results[part]
            into = owner(store.operands[1])
            assert into.name == "memref.subview"
            assert static(into, "static_sizes") == [64, 64] and len(list(into.operands)) == 1
            assert global_memref(into.operands[0]) == (init == 0.0)
            rows.append(static(into, "static_offsets"))
        assert rows == [[0, 0], [64, 0]]
        assert stores[0].operands[1].owner.operands[0] == stores[1].operands[1].owner.operands[0]


@pytest.mark.parametrize("init", [0.0, 1.0])
def test_specialized_consumers_are_warpgroups_0_and_1_and_the_producer_is_2(tmp_path, init):
    from stagegraph.mlir.walk import collect

    module = rewritten(tmp_path, 1024, 1024, 512, init)  # 8 K steps: warp-specialized
    with module.context:
        decrease, increase = sorted(collect(module, "nvvm.setmaxregister"),
                                    key=lambda op: ir_int(op.attributes["regCount"]))  # fmt: skip
        roles = decrease.parent  # the scf.if of the roles (producer: then, consumers: else)
        assert roles.name == "scf.if" and increase.parent == roles
        test = owner(roles.operands[0])
        group = owner(test.operands[0])
        assert test.name == "arith.cmpi" and constant(test.operands[1]) == 2
        assert group.name == "arith.divui" and constant(group.operands[1]) == 128
        # The producer's loads run on the first thread of warpgroup 2.
        (guard,) = [op for op in collect(roles, "scf.if") if collect(op, "nvgpu.tma.async.load")]
        assert constant(owner(guard.operands[0]).operands[1]) == 256
        # Consumer g (= the warpgroup index) computes A's rows 64g.. and stores its one
        # m64 fragment to the first 64 rows' view, where the lowering adds 64g rows.
        (mma,) = collect(roles, "nvgpu.warpgroup.mma")
        assert mma.results[0].type == fragment(64)
        assert constant(a_rows_at(mma).operands[1]) == 0  # its only part
        slot_and_consumer = owner(a_rows_at(mma).operands[0])
        assert slot_and_consumer.name == "arith.addi"
        scaled = owner(slot_and_consumer.operands[1])
        assert scaled.name == "arith.muli" and scaled.operands[0] == group.results[0]
        assert constant(scaled.operands[1]) == 64 * 64 * 2
        (store,) = collect(module, "nvgpu.warpgroup.mma.store")
        into = owner(store.operands[1])
        assert into.name == "memref.subview" and len(list(into.operands)) == 1  # no consumer
        assert static(into, "static_offsets") == [0, 0]
        assert static(into, "static_sizes") == [64, 64]
        assert global_memref(into.operands[0]) == (init == 0.0)
        # C += tile: the consumers' 256 threads take elements thread id + 256 i.
        if init:
            (tile_out,) = [op for op in collect(roles, "scf.for") if collect(op, "memref.store")]
            (flat,) = [op for op in collect(tile_out, "arith.addi")
                       if owner(op.operands[1]).name == "gpu.thread_id"]  # fmt: skip
            assert constant(owner(flat.operands[0]).operands[1]) == 256


def store_offsets(text: str) -> set[int]:
    """The byte offsets of the f32 stores after the K loop (``[%rdN+OFF]``, one base)."""
    tail = text[text.index("wgmma.wait_group.sync.aligned \t0") :]
    found = re.findall(r"st\.global\.b32 \t\[(%rd\d+)(?:\+(\d+))?\]", tail)
    assert len({base for base, _ in found}) == 1
    return {int(offset or 0) for _, offset in found}


@needs_llvmlite
def test_ptx_stores_of_a_plain_block_cover_its_128_rows(tmp_path):
    # 128 x 256 C (1024-byte rows), tile 64: a thread holds rows r and r + 8 of each
    # fragment (r = its warp's 16 rows + lane / 4) and columns 2c, 2c + 1 of each 8.
    binary = sg.run("gpu", payload(tmp_path, 128, 256, 128), target="h100", until="emit",
                    param=WGMMA).value("emit")  # fmt: skip
    (text,) = [t for t in binary.ptx.values() if "wgmma.mma_async" in t]
    rows = (0, 8, 64, 72)  # fragment 0's two rows, fragment 1's 64 rows below them
    expected = {r * 1024 + (8 * j + c) * 4 for r in rows for j in range(8) for c in (0, 1)}
    assert store_offsets(text) == expected  # (the first build: 32 and 40, never 64)


@needs_llvmlite
def test_blocks_with_48_kib_of_dynamic_shared_memory_opt_in(monkeypatch, tmp_path):
    from stagegraph.runtime import cuda
    from tests.test_cuda_runtime import FakeDriver
    from tests.test_gpu_wgmma import _enum

    class Driver(FakeDriver):
        CUfunction_attribute = _enum("CU_FUNC_ATTRIBUTE_", "MAX_DYNAMIC_SHARED_SIZE_BYTES")

    # One K step: two stages of 24 KiB, exactly the 48 KiB a launch gets without the
    # opt-in less the block's static 1 KiB of mbarriers (CUDA_ERROR_INVALID_VALUE).
    binary = sg.run("gpu", payload(tmp_path, 128, 128, 64), target="h100", until="emit",
                    param=WGMMA).value("emit")  # fmt: skip
    (kernel,) = binary.manifest["kernels"]
    assert kernel["launch"]["shared_mem_bytes"] == 48 * 1024
    driver = Driver()
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    program = cuda.CudaProgram(binary.manifest, binary.ptx, {})
    (opt_in,) = [c for c in driver.calls if c[0] == "cuFuncSetAttribute"]
    assert opt_in[2:] == ("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 48 * 1024)
    program.close()
