"""The artifact folders the link and exec tests share: built once per session with the
Python API, then moved (nothing may point back at the build), each with ``ref.npz`` holding
the workload's inputs (``in<i>``) and reference results (``out<i>``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from stagegraph.workload import parse_workload

# Two results (a biased ReLU and its row sums): outputs are trailing caller-allocated arrays.
TWO_RESULTS_MLIR = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @main(%x: tensor<8x16xf32>, %b: tensor<16xf32>) -> (tensor<8x16xf32>, tensor<8xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x16xf32>
  %y = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %b : tensor<8x16xf32>, tensor<16xf32>) outs(%e : tensor<8x16xf32>) {
    ^bb0(%xi: f32, %bi: f32, %o: f32):
      %s = arith.addf %xi, %bi : f32
      %r = arith.maximumf %s, %zero : f32
      linalg.yield %r : f32
  } -> tensor<8x16xf32>
  %e2 = tensor.empty() : tensor<8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e2 : tensor<8xf32>) -> tensor<8xf32>
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%y : tensor<8x16xf32>) outs(%f : tensor<8xf32>) {
    ^bb0(%yi: f32, %acc: f32):
      %t = arith.addf %yi, %acc : f32
      linalg.yield %t : f32
  } -> tensor<8xf32>
  return %y, %s : tensor<8x16xf32>, tensor<8xf32>
}
"""


def two_results_payload(folder: Path) -> str:
    """The .mlir payload with its numpy reference beside it (in0, in1, out0, out1)."""
    path = folder / "two_results.mlir"
    path.write_text(TWO_RESULTS_MLIR)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    y = np.maximum(x + b, 0)
    np.savez(path.with_suffix(".npz"), in0=x, in1=b, out0=y, out1=y.sum(axis=1))
    return str(path)


CASES = {
    # 256^3 on two threads: parallel loops, so the OpenMP runtime travels in the folder.
    "matmul": ("matmul:m=256,n=256,k=256", 2),
    "mlp": ("mlp:batch=16,widths=32-64-16", 1),
    "two_results": (None, 1),
    "bf16": ("matmul:m=32,n=24,k=64,dtype=bf16", 1),
}


_BUILT: dict[str, tuple[Path, object]] = {}


def build_once(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Each case compiled with the Python API, then moved: nothing points back at the build.
    Built once per test session, whichever module asks first."""
    if _BUILT:
        return _BUILT
    import stagegraph as sg

    root = tmp_path_factory.mktemp("artifacts")
    built = {}
    for name, (spec, threads) in CASES.items():
        spec = spec or two_results_payload(root)
        build = root / f"build-{name}"
        sg.build_artifact("x86", spec, build, threads=threads)
        moved = root / "moved" / name
        shutil.copytree(build, moved)
        shutil.rmtree(build)
        workload = parse_workload(spec)
        arrays = {f"in{i}": a for i, a in enumerate(workload.inputs())}
        arrays |= {f"out{i}": a for i, a in enumerate(workload.reference())}
        np.savez(moved / "ref.npz", **arrays)
        built[name] = (moved, workload)
    _BUILT.update(built)
    return _BUILT
