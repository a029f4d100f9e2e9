"""What keeps compile time linear in the payload's size: schedules applied per matmul site in
a scratch module (``stages.common.scope``), and bounded users per ``tensor.empty`` before
one-shot bufferization (``rewrites.split_shared_empties``)."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.diagnostics import parse_payload

STEPS = (
    """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%h0: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<8x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<8x16xf32>) -> tensor<8x16xf32>
"""
    + "".join(
        f"""
  %m{s} = linalg.matmul ins(%h{s}, %w : tensor<8x16xf32>, tensor<16x16xf32>)
                       outs(%acc : tensor<8x16xf32>) -> tensor<8x16xf32>
  %h{s + 1} = linalg.generic {{indexing_maps = [#id, #id],
                              iterator_types = ["parallel", "parallel"]}}
      ins(%m{s} : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %r = math.tanh %x : f32
    linalg.yield %r : f32
  }} -> tensor<8x16xf32>"""
        for s in range(12)
    )
    + """
  return %h12 : tensor<8x16xf32>
}
"""
)


def _names(module) -> list[str]:
    from stagegraph.mlir.walk import collect

    return [op.name for op in collect(module.operation)]


def test_outline_and_inline_give_back_the_same_function():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.scope import outline

    module = parse_payload(STEPS)
    before = _names(module)
    with module.context, ir.Location.unknown():
        matmul = collect(module.operation, "linalg.matmul")[5]
        tanh = next(iter(matmul.results[0].uses)).owner.operation
        scope = outline([matmul, tanh])
        assert scope is not None
        # The scratch function holds the two ops and clones of what they read that is
        # free to recompute (the fill with its empty and zero); h5 and w are arguments.
        inner = [op.name for op in collect(scope.function)]
        assert inner.count("linalg.matmul") == 1 and "linalg.fill" in inner
        assert len(scope.arguments) == 2
        assert scope.module.operation.verify()
        # Outside, the users of the tanh read a placeholder meanwhile.
        assert "builtin.unrealized_conversion_cast" in _names(module)
        scope.inline()
        assert module.operation.verify()
    after = _names(module)
    assert "builtin.unrealized_conversion_cast" not in after
    assert after.count("linalg.matmul") == before.count("linalg.matmul")
    assert after.count("linalg.fill") == before.count("linalg.fill") + 1  # the clone


def test_group_whose_result_is_read_inside_its_span_stays():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.scope import outline

    module = parse_payload(STEPS)
    with module.context, ir.Location.unknown():
        matmuls = collect(module.operation, "linalg.matmul")
        # The first matmul is read by its tanh, outside the group and before its last op:
        # moved back at the second matmul, the result would come after its reader.
        assert outline([matmuls[0], matmuls[1]]) is None
        assert module.operation.verify()


def test_unrolled_steps_compile_per_site_and_compute_the_same(tmp_path):
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine
    from stagegraph.workload import parse_workload

    path = tmp_path / "steps.mlir"
    path.write_text(STEPS)
    rng = np.random.default_rng(0)
    h0 = rng.standard_normal((8, 16), dtype=np.float32)
    w = (rng.standard_normal((16, 16), dtype=np.float32) / 4).astype(np.float32)
    result = Engine().run(load_graph("x86"), parse_workload(str(path)))
    (out,) = result.binary.call("main", [h0, w])
    expected = h0
    for _ in range(12):
        expected = np.tanh(expected @ w)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_shared_empty_is_split_to_bounded_users():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.rewrites import split_shared_empties

    module = parse_payload(STEPS)
    with module.context, ir.Location.unknown():
        (empty,) = collect(module.operation, "tensor.empty")
        users = len(list(empty.results[0].uses))  # the fill and 12 steps
        assert split_shared_empties(module, users=4) == (users - 1) // 4
        empties = collect(module.operation, "tensor.empty")
        assert all(len(list(e.results[0].uses)) <= 4 for e in empties)
        assert sum(len(list(e.results[0].uses)) for e in empties) == users
        assert module.operation.verify()


BUFFER_STEPS = """
func.func private @step(memref<4xf32>, memref<4xf32>)
func.func private @make() -> memref<4xf32>
func.func @main(%x: memref<4xf32>, %out: memref<4xf32>) {
  %a = memref.alloc() : memref<4xf32>
  func.call @step(%x, %a) : (memref<4xf32>, memref<4xf32>) -> ()
  %b = memref.alloc() : memref<4xf32>
  func.call @step(%a, %b) : (memref<4xf32>, memref<4xf32>) -> ()
  %c = memref.alloc() : memref<4xf32>
  func.call @step(%b, %c) : (memref<4xf32>, memref<4xf32>) -> ()
  memref.copy %c, %out : memref<4xf32> to memref<4xf32>
  return
}
func.func @other(%x: memref<4xf32>, %out: memref<4xf32>) {
  %a = memref.alloc() : memref<4xf32>
  func.call @step(%x, %a) : (memref<4xf32>, memref<4xf32>) -> ()
  %m = func.call @make() : () -> memref<4xf32>
  func.call @step(%a, %m) : (memref<4xf32>, memref<4xf32>) -> ()
  memref.copy %m, %out : memref<4xf32> to memref<4xf32>
  return
}
"""


def _deallocs(module, name: str) -> list[int]:
    """Buffers freed by each ``bufferization.dealloc`` of function ``name``."""
    from stagegraph.mlir.walk import collect

    fn = next(f for f in module.body.operations if f.attributes["sym_name"].value == name)
    return [len(op.operands) // 2 for op in collect(fn, "bufferization.dealloc")]


def test_deallocation_of_fresh_buffers_is_split_per_buffer():
    """A block's one dealloc of several fresh allocations becomes one per buffer (nothing for
    the simplification to compare pairwise); with a buffer of another origin (a call's
    result may alias anything) it stays whole. The lowering frees the same buffers as
    ``buffer-deallocation-pipeline``."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.passes import (
        LOWER_DEALLOCATIONS,
        PLACE_DEALLOCATIONS,
        run_lowering,
        run_pipeline,
    )
    from stagegraph.stages.common.rewrites import split_fresh_deallocations

    module = Module(parse_payload(BUFFER_STEPS), "buffer")
    with module.ir.context:
        run_pipeline(module, PLACE_DEALLOCATIONS)
        assert _deallocs(module.ir, "main") == [3] and _deallocs(module.ir, "other") == [2]
        assert split_fresh_deallocations(module.ir) == 1
        assert _deallocs(module.ir, "main") == [1, 1, 1] and _deallocs(module.ir, "other") == [2]
        run_pipeline(module, LOWER_DEALLOCATIONS)
        split = [op.name for op in collect(module.ir, lambda op: "dealloc" in op.name)]

        reference = Module(parse_payload(BUFFER_STEPS), "buffer")
        run_pipeline(reference, "buffer-deallocation-pipeline")
        expected = [op.name for op in collect(reference.ir, lambda op: "dealloc" in op.name)]
        assert split == expected and split.count("memref.dealloc") >= 3

        lowered = Module(parse_payload(BUFFER_STEPS), "buffer")
        run_lowering(lowered, "buffer-deallocation-pipeline,canonicalize")
        assert [op.name for op in collect(lowered.ir, lambda op: "dealloc" in op.name)] == expected


def test_copies_become_linalg_copies_built_without_opdsl():
    """Every memref.copy becomes a linalg.copy of the same buffers, built generically (the
    OpDSL builder, a millisecond per op, also stamps a default ``cast`` attribute)."""
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common.rewrites import copies_to_linalg

    module = parse_payload(
        "func.func @f(%a: memref<4x8xf32, strided<[16, 1], offset: ?>>, %b: memref<4x8xf32>) {\n"
        "  memref.copy %a, %b : memref<4x8xf32, strided<[16, 1], offset: ?>> to memref<4x8xf32>\n"
        "  memref.copy %a, %b : memref<4x8xf32, strided<[16, 1], offset: ?>> to memref<4x8xf32>\n"
        "  return\n}\n"
    )
    with module.context:
        assert copies_to_linalg(module) == 2
        copies = collect(module, "linalg.copy")
        assert len(copies) == 2 and not collect(module, "memref.copy")
        fn = module.body.operations[0]
        arguments = list(fn.regions[0].blocks[0].arguments)
        assert all(list(op.operands) == arguments for op in copies)
        assert all("cast" not in op.attributes for op in copies)
        assert module.operation.verify()
