"""A scan's row forall as a launch of a thread per row (gpu.row_kernels): the launch's
shape, the guard on the last block, the alignment each vector access keeps, and the PTX
the gpu graph makes of a cumsum over aligned and unaligned rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stagegraph as sg

#: The buffer-level host work of a scan: rows of ``COLS`` floats read and written in
#: 16-float vectors from an scf.for (aligned when COLS is a multiple of 4).
ROW_FORALL = """
module {
  func.func @main(%in: memref<ROWSxCOLSxf32>, %out: memref<ROWSxCOLSxf32>) {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c224 = arith.constant 224 : index
    %pad = arith.constant 0.000000e+00 : f32
    scf.forall (%row) in (ROWS) {
      %line = memref.subview %out[%row, 0] [1, COLS] [1, 1]
          : memref<ROWSxCOLSxf32> to memref<1xCOLSxf32, strided<[COLS, 1], offset: ?>>
      scf.for %col = %c0 to %c224 step %c16 {
        %v = vector.transfer_read %in[%row, %col], %pad {in_bounds = [true]}
            : memref<ROWSxCOLSxf32>, vector<16xf32>
        vector.transfer_write %v, %line[%c0, %col] {in_bounds = [true]}
            : vector<16xf32>, memref<1xCOLSxf32, strided<[COLS, 1], offset: ?>>
      }
    }
    return
  }
}
"""

#: A cumsum along the rows (the stepping form is built when the payload is parsed).
CUMSUM = """
module {
  func.func @main(%arg0: tensor<ROWSxCOLSxf32>) -> tensor<ROWSxCOLSxf32> {
    %zero = arith.constant 0.000000e+00 : f32
    %0 = tensor.empty() : tensor<ROWSxCOLSxf32>
    %1 = linalg.fill ins(%zero : f32) outs(%0 : tensor<ROWSxCOLSxf32>) -> tensor<ROWSxCOLSxf32>
    %2 = tensor.empty() : tensor<ROWSxf32>
    %3 = linalg.fill ins(%zero : f32) outs(%2 : tensor<ROWSxf32>) -> tensor<ROWSxf32>
    %4:2 = tm_tensor.scan dimension(1) inclusive(true) ins(%arg0 : tensor<ROWSxCOLSxf32>)
        outs(%1, %3 : tensor<ROWSxCOLSxf32>, tensor<ROWSxf32>) {
    ^bb0(%a: f32, %b: f32):
      %5 = arith.addf %a, %b : f32
      tm_tensor.yield %5 : f32
    } -> tensor<ROWSxCOLSxf32>, tensor<ROWSxf32>
    return %4#0 : tensor<ROWSxCOLSxf32>
  }
}
"""


def fill(text: str, rows: int, cols: int) -> str:
    return text.replace("ROWS", str(rows)).replace("COLS", str(cols))


def launched(rows: int, cols: int):
    """The row forall of :data:`ROW_FORALL` after :func:`launch_rows` (context kept)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect, top_level_ops
    from stagegraph.stages.gpu.host_kernels import host_runs
    from stagegraph.stages.gpu.row_kernels import launch_rows

    context = ir.Context()
    context.allow_unregistered_dialects = False
    with context, ir.Location.unknown():
        module = ir.Module.parse(fill(ROW_FORALL, rows, cols))
        entry = next(op for op in top_level_ops(module) if op.name == "func.func")
        (run,) = host_runs(entry)
        assert launch_rows(run, 32)  # a warp of rows per block
        module.operation.verify()
        return context, module, collect(module, "gpu.launch")


def constant_of(value) -> int:
    from stagegraph.mlir.bindings import ir

    return ir.IntegerAttr(value.owner.attributes["value"]).value


def alignments(module) -> list[tuple[str, int]]:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    return [(op.name, ir.IntegerAttr(op.attributes["alignment"]).value)
            for op in collect(module, {"vector.load", "vector.store"})]  # fmt: skip


def test_rows_become_threads_a_warp_of_rows_per_block():
    from stagegraph.mlir.walk import collect

    _context, module, (launch,) = launched(40, 256)
    grid, block = list(launch.operands)[:3], list(launch.operands)[3:6]
    assert [constant_of(v) for v in grid] == [2, 1, 1]  # 40 rows: two blocks of 32
    assert [constant_of(v) for v in block] == [32, 1, 1]
    assert not collect(module, "scf.forall")
    (guard,) = collect(launch, "scf.if")  # the second block's last 24 threads skip
    assert collect(guard, "scf.for")


def test_rows_that_fill_their_blocks_need_no_guard():
    from stagegraph.mlir.walk import collect

    _context, _module, (launch,) = launched(64, 256)
    assert constant_of(launch.operands[0]) == 2 and not collect(launch, "scf.if")


def test_vector_accesses_keep_16_bytes_only_on_aligned_rows():
    _context, aligned, _ = launched(40, 256)
    assert alignments(aligned) == [("vector.load", 16), ("vector.store", 16)]
    _context, unaligned, _ = launched(40, 255)  # row r starts at 255 * r floats
    assert alignments(unaligned) == [("vector.load", 4), ("vector.store", 4)]
    _context, even, _ = launched(40, 258)  # rows of 258 floats: 8-byte boundaries
    assert alignments(even) == [("vector.load", 8), ("vector.store", 8)]


def cumsum_artifact(tmp_path: Path, rows: int, cols: int) -> Path:
    pytest.importorskip("llvmlite")
    path = tmp_path / f"cumsum_{rows}x{cols}.mlir"
    path.write_text(fill(CUMSUM, rows, cols))
    out = tmp_path / f"artifact_{cols}"
    sg.run("gpu", str(path), target="sm_90a", emit="object", output=str(out))
    return out


@pytest.mark.parametrize(("cols", "vectors"), [(256, True), (255, False)])
def test_a_cumsum_runs_a_thread_per_row(tmp_path, cols, vectors):
    from stagegraph.stages.gpu.ptx import assemble

    out = cumsum_artifact(tmp_path, 40, cols)
    manifest = json.loads((out / "manifest.json").read_text())
    launches = [(k["launch"]["grid"], k["launch"]["block"]) for k in manifest["kernels"]]
    assert ([2, 1, 1], [32, 1, 1]) in launches
    ptx = "".join(p.read_text() for p in sorted(out.glob("*.ptx")))
    assert ("ld.global.v4" in ptx) == vectors  # 16-byte loads only where rows allow them
    for kernel in sorted(out.glob("*.ptx")):
        reports = assemble(kernel.read_text(), "sm_90a")
        assert all(not r.spill_stores and not r.spill_loads for r in reports)


def test_dynamic_strides_claim_only_element_alignment():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.row_kernels import access_alignment

    text = """
    func.func @f(%m: memref<8x64xf32, strided<[?, 1]>>, %i: index) -> vector<4xf32> {
      %c16 = arith.constant 16 : index
      %pad = arith.constant 0.0 : f32
      %v = vector.transfer_read %m[%i, %c16], %pad {in_bounds = [true]}
          : memref<8x64xf32, strided<[?, 1]>>, vector<4xf32>
      return %v : vector<4xf32>
    }
    """
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        (read,) = collect(module, "vector.transfer_read")
        memref, row, column = list(read.operands)[:3]
        assert access_alignment(memref, [row, column], 4) == 4  # rows of unknown stride


def serial_launch(launch) -> None:
    """Run ``launch``'s body in loops over its blocks and threads instead (the CPU's view
    of the grid: every thread in turn), the block and thread ids the loops' indices."""
    from stagegraph.mlir.bindings import arith, ir, scf

    grid, block = launch.operands[0], launch.operands[3]
    index = ir.IndexType.get()
    with ir.InsertionPoint(launch), launch.location:
        zero, one = (arith.ConstantOp(index, n).result for n in (0, 1))
        blocks = scf.ForOp(zero, grid, one)
        with ir.InsertionPoint(blocks.body):
            threads = scf.ForOp(zero, block, one)
            with ir.InsertionPoint(threads.body):
                anchor = scf.YieldOp([])
            scf.YieldOp([])
    ids = {"gpu.block_id": blocks.induction_variable, "gpu.thread_id": threads.induction_variable}
    body = launch.regions[0].blocks[0]
    for op in list(body.operations)[:-1]:  # all but gpu.terminator
        if op.name in ids:
            op.results[0].replace_all_uses_with(ids[op.name])
            op.erase()
        else:
            op.move_before(anchor)
    launch.erase()


@pytest.mark.parametrize("cols", [256, 255])
def test_every_row_is_written_once_by_its_thread(cols):
    """Through the JIT, the grid run serially: each of 40 rows (two blocks of 32 threads,
    the last 24 guarded off) copies its first 224 elements, the rest stays untouched."""
    import ctypes

    import numpy as np

    from stagegraph.mlir.bindings import execution_engine, ir, passmanager, runtime
    from stagegraph.mlir.walk import top_level_ops
    from stagegraph.stages.common import lowering

    rows = 40
    _context, module, (launch,) = launched(rows, cols)
    with _context, ir.Location.unknown():
        serial_launch(launch)
        entry = next(op for op in top_level_ops(module) if op.name == "func.func")
        entry.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        module.operation.verify()
        pm = passmanager.PassManager.parse(f"builtin.module({lowering.LOWER_TO_LLVM})")
        pm.run(module.operation)
        engine = execution_engine.ExecutionEngine(module, opt_level=2)
        source = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
        result = np.full((rows, cols), np.nan, np.float32)
        engine.invoke("main", *[ctypes.pointer(ctypes.pointer(
            runtime.get_ranked_memref_descriptor(x))) for x in (source, result)])  # fmt: skip
    np.testing.assert_array_equal(result[:, :224], source[:, :224])
    assert np.isnan(result[:, 224:]).all()
