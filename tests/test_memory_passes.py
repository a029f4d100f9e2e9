"""Passes over memory (``stages.common.memory_passes``): counted on hand-written bufferized
modules whose answer is known, and through the x86 graph
(``app.memory_passes.payload_memory_passes``)."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.diagnostics import parse_module
from stagegraph.stages.common.memory_passes import count_memory_passes

BIG, SMALL = "memref<64x1024xf32>", "memref<4x4xf32>"
IDENTITY = "affine_map<(d0, d1) -> (d0, d1)>"


def _copy(src: str, dst: str, memref: str) -> str:
    """One elementwise loop nest (a ``linalg.generic`` on buffers) from ``src`` to ``dst``."""
    return (
        f"  linalg.generic {{indexing_maps = [{IDENTITY}, {IDENTITY}], "
        f'iterator_types = ["parallel", "parallel"]}} ins({src} : {memref}) '
        f"outs({dst} : {memref}) {{\n  ^bb0(%i: f32, %o: f32):\n"
        f"    %n = arith.negf %i : f32\n    linalg.yield %n : f32\n  }}\n"
    )


def _count(text: str, resident_bytes: int = 32 * 1024) -> tuple[int, dict[str, int]]:
    context = new_context()
    with context, ir.Location.unknown():
        module = parse_module(text, context, "test")
        found = count_memory_passes(module, resident_bytes=resident_bytes)
    return found.total, found.by_function


def test_each_loop_over_a_large_buffer_is_a_pass() -> None:
    text = (
        f"func.func @main(%a: {BIG}, %b: {BIG}) {{\n"
        f"  %t = memref.alloc() : {BIG}\n" + _copy("%a", "%t", BIG) + _copy("%t", "%b", BIG)
        + f"  memref.dealloc %t : {BIG}\n  return\n}}\n"
    )  # fmt: skip
    assert _count(text)[0] == 2
    # The same buffers resident in a cache larger than them: no pass at all.
    assert _count(text, resident_bytes=1 << 20)[0] == 0


def test_small_buffers_and_data_free_ops_are_no_passes() -> None:
    text = (
        f"func.func @main(%a: {SMALL}, %b: {SMALL}, %c: {BIG}) {{\n"
        f"  %t = memref.alloc() : {BIG}\n"
        f"  %v = memref.subview %c[0, 0] [4, 4] [1, 1] : {BIG} to "
        "memref<4x4xf32, strided<[1024, 1]>>\n" + _copy("%a", "%b", SMALL)
        + f"  memref.dealloc %t : {BIG}\n  return\n}}\n"
    )  # fmt: skip
    assert _count(text)[0] == 0


def test_a_tiled_loop_over_views_of_a_large_buffer_is_one_pass() -> None:
    """Tiles are views made inside the loop: they are traced to the buffer they view."""
    tile = "memref<4x1024xf32, strided<[1024, 1], offset: ?>>"
    text = (
        f"func.func @main(%a: {BIG}, %b: {BIG}) {{\n"
        "  %c0 = arith.constant 0 : index\n  %c4 = arith.constant 4 : index\n"
        "  %c64 = arith.constant 64 : index\n"
        "  scf.for %row = %c0 to %c64 step %c4 {\n"
        f"    %x = memref.subview %a[%row, 0] [4, 1024] [1, 1] : {BIG} to {tile}\n"
        f"    %y = memref.subview %b[%row, 0] [4, 1024] [1, 1] : {BIG} to {tile}\n"
        + _copy("%x", "%y", tile) + "  }\n  return\n}\n"
    )  # fmt: skip
    assert _count(text)[0] == 1


def test_calls_count_their_callee_times_the_loop_trips() -> None:
    callee = (
        f"func.func private @step(%a: {BIG}, %b: {BIG}) {{\n"
        + _copy("%a", "%b", BIG) + _copy("%b", "%a", BIG) + "  return\n}\n"
    )  # fmt: skip
    text = callee + (
        f"func.func @main(%a: {BIG}, %b: {BIG}) {{\n"
        "  %c0 = arith.constant 0 : index\n  %c1 = arith.constant 1 : index\n"
        "  %c3 = arith.constant 3 : index\n"
        f"  func.call @step(%a, %b) : ({BIG}, {BIG}) -> ()\n"
        "  scf.for %k = %c0 to %c3 step %c1 {\n"
        f"    func.call @step(%a, %b) : ({BIG}, {BIG}) -> ()\n  }}\n  return\n}}\n"
    )
    total, by_function = _count(text)
    assert by_function["step"] == 2
    assert total == 2 + 3 * 2


def test_x86_counts_a_matmul_with_its_fused_epilogue_once(tmp_path) -> None:
    """Through the graph: a matmul whose bias and ReLU ride on its tiles is one pass over
    the output (plus its operands' packing); the same matmul whose result is also returned
    before the epilogue cannot fuse in place and makes more passes."""
    from stagegraph.app.memory_passes import payload_memory_passes

    def payload(extra_result: bool) -> str:
        t = "tensor<256x256xf32>"
        results = f"{t}, {t}" if extra_result else t
        returned = "%m, %r" if extra_result else "%r"
        return (
            f"func.func @main(%a: {t}, %b: {t}, %bias: tensor<256xf32>) -> ({results}) {{\n"
            "  %z = arith.constant 0.0 : f32\n"
            f"  %e = tensor.empty() : {t}\n"
            f"  %f = linalg.fill ins(%z : f32) outs(%e : {t}) -> {t}\n"
            f"  %m = linalg.matmul ins(%a, %b : {t}, {t}) outs(%f : {t}) -> {t}\n"
            "  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, "
            "affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], "
            'iterator_types = ["parallel", "parallel"]} '
            f"ins(%m, %bias : {t}, tensor<256xf32>) outs(%e : {t}) {{\n"
            "  ^bb0(%x: f32, %y: f32, %o: f32):\n"
            "    %s = arith.addf %x, %y : f32\n    %q = arith.maximumf %s, %z : f32\n"
            f"    linalg.yield %q : f32\n  }} -> {t}\n  return {returned} : {results}\n}}\n"
        )

    counts = []
    for extra in (False, True):
        path = tmp_path / f"m{int(extra)}.mlir"
        path.write_text(payload(extra))
        counts.append(payload_memory_passes(str(path), threads=1, target="x86-64-v4").total)
    assert 1 <= counts[0] < counts[1]
    assert np.isfinite(counts).all()


def test_run_reports_the_passes(tmp_path, capsys) -> None:
    """``stagegraph run`` reports the same count (``RunReport.memory_passes``, and a line of
    its text output) as the function others call."""
    import stagegraph as sg
    from stagegraph.app.memory_passes import payload_memory_passes
    from stagegraph.cli.main import main

    t = "tensor<64x1024xf32>"
    path = tmp_path / "neg.mlir"
    path.write_text(
        f"func.func @main(%a: {t}) -> {t} {{\n  %e = tensor.empty() : {t}\n"
        f"  %r = linalg.generic {{indexing_maps = [{IDENTITY}, {IDENTITY}], "
        f'iterator_types = ["parallel", "parallel"]}} ins(%a : {t}) outs(%e : {t}) {{\n'
        "  ^bb0(%i: f32, %o: f32):\n    %n = arith.negf %i : f32\n    linalg.yield %n : f32\n"
        f"  }} -> {t}\n  return %r : {t}\n}}\n"
    )
    a = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    np.savez(tmp_path / "neg.npz", in0=a, out0=-a)
    report = sg.run("x86", str(path), threads=1)
    assert report.verified is True
    assert report.memory_passes == payload_memory_passes(str(path)).total == 1
    assert main(["run", "x86", str(path), "--threads", "1"]) == 0
    assert "passes over memory: 1" in capsys.readouterr().out
