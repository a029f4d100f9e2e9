"""Scans along the last dimension become vector code (stagegraph.mlir.scan_vector): the IR
has 16-lane chunks plus a shorter last chunk, prefix shuffles with the identity shifted in,
rows in an ``scf.forall``, no per-step ``linalg.generic``; values match numpy on the x86
graph for sums, products, maxima, inclusive and exclusive, every chunk layout."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.cli.main import main
from stagegraph.mlir.bindings import ir
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.scan import torch_mlir_opt
from stagegraph.mlir.walk import collect

pytestmark = pytest.mark.skipif(torch_mlir_opt() is None, reason="torch-mlir-opt not found")

SCAN = """
func.func @main(%a: tensor<ROWSxNxT>, %init: tensor<ROWSxT>) -> RESULTS {
  %e = tensor.empty() : tensor<ROWSxNxT>
  %r:2 = tm_tensor.scan dimension(1) inclusive(INCLUSIVE) ins(%a : tensor<ROWSxNxT>)
      outs(%e, %init : tensor<ROWSxNxT>, tensor<ROWSxT>) {
  ^bb0(%x: T, %y: T):
    %z = OP %x, %y : T
    tm_tensor.yield %z : T
  } -> tensor<ROWSxNxT>, tensor<ROWSxT>
  return RETURNED
}
"""


def scan_text(n: int, op: str = "arith.addf", inclusive: bool = True, rows: int = 3,
              element: str = "f32", final: bool = False) -> str:  # fmt: skip
    """A scan of ``rows`` x ``n`` along the last dimension (``final``: also returning the
    final accumulator)."""
    out = f"tensor<{rows}x{n}x{element}>"
    results = f"({out}, tensor<{rows}x{element}>)" if final else out
    returned = f"%r#0, %r#1 : {results[1:-1]}" if final else f"%r#0 : {out}"
    text = SCAN.replace("RESULTS", results).replace("RETURNED", returned)
    text = text.replace("ROWSxNxT", f"{rows}x{n}x{element}").replace("ROWSxT", f"{rows}x{element}")
    text = text.replace("ROWS", str(rows)).replace("INCLUSIVE", str(inclusive).lower())
    return text.replace("OP", op).replace(": T", f": {element}").replace("T)", f"{element})")


def vector_lanes(module) -> list[int]:
    """The lane counts of the vectors the rewritten scan reads."""
    return [ir.VectorType(op.results[0].type).shape[0]
            for op in collect(module, "vector.transfer_read")]  # fmt: skip


def test_last_dim_scan_is_vectorized_in_chunks_with_a_short_tail():
    module = parse_payload(scan_text(37))
    assert not collect(module, "linalg.generic")  # no per-step elementwise op
    assert len(collect(module, "scf.forall")) == 1  # the rows
    assert len(collect(module, "scf.for")) == 1  # the chunks after the peeled first one
    # peeled first chunk and the loop's chunk (16 lanes), then the 5-element tail
    assert vector_lanes(module) == [16, 16, 5]
    assert not collect(module, "arith.select")  # the identity is shifted in, no junk lanes


def test_prefix_shifts_in_the_identity():
    module = parse_payload(scan_text(16, op="arith.mulf"))
    constants = [op for op in collect(module, "arith.constant")
                 if isinstance(op.results[0].type, ir.VectorType)]  # fmt: skip
    splats = {ir.DenseElementsAttr(op.attributes["value"]).get_splat_value().value
              for op in constants}  # fmt: skip
    assert splats == {1.0}  # the identity of a product
    shuffles = collect(module, "vector.shuffle")
    masks = [list(ir.DenseI64ArrayAttr(op.attributes["mask"])) for op in shuffles]
    assert [16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14] in masks  # shift by 1
    assert [16] * 8 + list(range(8)) in masks  # shift by 8: log2(16) steps


@pytest.mark.parametrize("final, dimension", [(True, 1), (False, 0)])
def test_other_scans_keep_the_stepping_form(final, dimension):
    text = scan_text(37, final=final)
    if dimension == 0:  # along the rows: each step is a contiguous row already
        text = text.replace("dimension(1)", "dimension(0)").replace(
            "tensor<3xf32>", "tensor<37xf32>"
        )
    module = parse_payload(text)
    assert collect(module, "linalg.generic")
    assert not collect(module, "vector.shuffle")


def reference(a: np.ndarray, init: np.ndarray, op: str, inclusive: bool) -> np.ndarray:
    """numpy's scan: inclusive over ``a``; exclusive: ``init`` then the scan shifted by one."""
    ufunc = {"arith.addf": np.add, "arith.mulf": np.multiply, "arith.maximumf": np.maximum,
             "arith.addi": np.add}[op]  # fmt: skip
    wide = a.astype(np.float64) if a.dtype.kind == "f" else a
    if not inclusive:
        wide = np.concatenate([init[:, None].astype(wide.dtype), wide[:, :-1]], axis=1)
    return ufunc.accumulate(wide, axis=1).astype(a.dtype)


@pytest.mark.parametrize("n", [3, 16, 37])
@pytest.mark.parametrize("op", ["arith.addf", "arith.mulf", "arith.maximumf", "arith.addi"])
@pytest.mark.parametrize("inclusive", [True, False])
def test_vector_scan_matches_numpy(tmp_path, capsys, n, op, inclusive):
    rng = np.random.default_rng(n)
    if op == "arith.addi":
        a = rng.integers(-50, 50, (3, n)).astype(np.int32)
        init = rng.integers(-50, 50, 3).astype(np.int32)
    else:
        a = rng.uniform(0.5, 1.5, (3, n)).astype(np.float32)
        if op == "arith.maximumf":
            a = rng.standard_normal((3, n)).astype(np.float32)
        init = rng.uniform(0.5, 1.5, 3).astype(np.float32)
    element = "i32" if op == "arith.addi" else "f32"
    path = tmp_path / "scan.mlir"
    path.write_text(scan_text(n, op, inclusive, element=element))
    np.savez(path.with_suffix(".npz"), in0=a, in1=init, out0=reference(a, init, op, inclusive))
    code = main(["run", "x86", str(path)])
    assert code == 0, capsys.readouterr()
    assert "VERIFIED" in capsys.readouterr().out


FLIPPED = """
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<3x37xf32>) -> RESULT {
  %c36 = arith.constant 36 : index
  %e = tensor.empty() : tensor<3x37xf32>
  %f = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<3x37xf32>) outs(%e : tensor<3x37xf32>) {
  ^bb0(%in: f32, %out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %k = arith.subi %c36, %j : index
    %v = tensor.extract %x[%i, %k] : tensor<3x37xf32>
    linalg.yield %v : f32
  } -> tensor<3x37xf32>
  %a = tensor.empty() : tensor<3xf32>
  %r:2 = tm_tensor.scan dimension(1) inclusive(true) ins(%f : tensor<3x37xf32>)
      outs(%e, %a : tensor<3x37xf32>, tensor<3xf32>) {
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    tm_tensor.yield %s : f32
  } -> tensor<3x37xf32>, tensor<3xf32>
  %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%r#0 : tensor<3x37xf32>) outs(%e : tensor<3x37xf32>) {
  ^bb0(%in: f32, %out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %k = arith.subi %c36, %j : index
    %v = tensor.extract %r#0[%i, %k] : tensor<3x37xf32>
    linalg.yield %v : f32
  } -> tensor<3x37xf32>
  return RETURNED
}
"""
FLIP_BACK = FLIPPED.replace("RESULT", "tensor<3x37xf32>").replace(
    "RETURNED", "%g : tensor<3x37xf32>"
)
# The scan's result is also returned unflipped: not a reverse scan.
BOTH = FLIPPED.replace("RESULT", "(tensor<3x37xf32>, tensor<3x37xf32>)").replace(
    "RETURNED", "%g, %r#0 : tensor<3x37xf32>, tensor<3x37xf32>"
)


def test_scan_between_flips_reads_from_the_end_without_gathers():
    module = parse_payload(FLIP_BACK)
    assert not collect(module, "linalg.generic")  # both flips folded into the scan
    assert not collect(module, "tensor.extract")
    masks = [list(ir.DenseI64ArrayAttr(op.attributes["mask"]))
             for op in collect(module, "vector.shuffle")]  # fmt: skip
    assert list(range(15, -1, -1)) in masks and list(range(4, -1, -1)) in masks  # lane flips


def test_flip_with_other_readers_stays():
    module = parse_payload(BOTH)
    assert len(collect(module, "linalg.generic")) == 2  # both flips kept: a forward scan


@pytest.mark.parametrize("text", [FLIP_BACK, BOTH])
def test_flipped_scans_match_numpy(tmp_path, capsys, text):
    x = np.random.default_rng(3).standard_normal((3, 37)).astype(np.float32)
    forward = np.cumsum(x[:, ::-1].astype(np.float64), axis=1)
    outputs = {"out0": forward[:, ::-1].astype(np.float32)}
    if text is BOTH:
        outputs["out1"] = forward.astype(np.float32)
    path = tmp_path / "flipped.mlir"
    path.write_text(text)
    np.savez(path.with_suffix(".npz"), in0=x, **outputs)
    assert main(["run", "x86", str(path)]) == 0, capsys.readouterr()
    assert "VERIFIED" in capsys.readouterr().out


def test_stepping_scans_gives_upstream_ops_for_other_compilers():
    from stagegraph.mlir.scan import stepping_scans

    with stepping_scans():  # what IREE is handed (app.iree.payload_text)
        module = parse_payload(scan_text(37))
    assert collect(module, "linalg.generic") and not collect(module, "vector.shuffle")
    assert collect(parse_payload(scan_text(37)), "vector.shuffle")  # and back on after it


SCAN_3D = """
func.func @main(%a: tensor<2x3x37xf32>, %init: tensor<2x3xf32>) -> tensor<2x3x37xf32> {
  %e = tensor.empty() : tensor<2x3x37xf32>
  %r:2 = tm_tensor.scan dimension(2) inclusive(INCLUSIVE) ins(%a : tensor<2x3x37xf32>)
      outs(%e, %init : tensor<2x3x37xf32>, tensor<2x3xf32>) {
  ^bb0(%x: f32, %y: f32):
    %z = arith.addf %x, %y : f32
    tm_tensor.yield %z : f32
  } -> tensor<2x3x37xf32>, tensor<2x3xf32>
  return %r#0 : tensor<2x3x37xf32>
}
"""


@pytest.mark.parametrize("inclusive", [True, False])
def test_last_dim_scan_of_a_3d_tensor_runs_as_rows(tmp_path, capsys, inclusive):
    text = SCAN_3D.replace("INCLUSIVE", str(inclusive).lower())
    module = parse_payload(text)
    assert collect(module, "vector.shuffle") and not collect(module, "linalg.generic")
    # 2x3 rows of 37 (and the exclusive scan's 2x3 initial values as 6)
    assert len(collect(module, "tensor.collapse_shape")) == 1 + (not inclusive)
    assert len(collect(module, "tensor.expand_shape")) == 1
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 37)).astype(np.float32)
    init = rng.standard_normal((2, 3)).astype(np.float32)
    flat = reference(a.reshape(6, 37), init.reshape(6), "arith.addf", inclusive)
    path = tmp_path / "scan3d.mlir"
    path.write_text(text)
    np.savez(path.with_suffix(".npz"), in0=a, in1=init, out0=flat.reshape(2, 3, 37))
    assert main(["run", "x86", str(path)]) == 0, capsys.readouterr()
    assert "VERIFIED" in capsys.readouterr().out


def test_vector_scan_compiles_for_the_gpu_graph(tmp_path):
    """The vector scan's row forall has no GPU mapping: the GPU lowering leaves it to a
    one-thread kernel (as the stepping form) instead of failing to map it ("scf.forall op
    requires a mapping attribute"); the PTX assembles with one kernel."""
    pytest.importorskip("llvmlite", reason="needs the gpu extra (llvmlite)")
    payload = tmp_path / "scan.mlir"
    payload.write_text(scan_text(37))
    out = tmp_path / "art"
    assert main(["run", "gpu", str(payload), "--target", "sm_80", "--emit", "object",
                 "-o", str(out)]) == 0  # fmt: skip
    (ptx,) = out.glob("*.ptx")
    assert ptx.read_text().count(".entry") == 1
