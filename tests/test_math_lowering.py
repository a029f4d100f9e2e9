"""Math ops LLVM cannot lower directly: vector ``math.fpowi`` and ``math.erf`` on both graphs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stagegraph.cli.main import main

ROWS, COLS = 8, 40
T = f"tensor<{ROWS}x{COLS}xf32>"
MAP = "affine_map<(d0, d1) -> (d0, d1)>"


def _elementwise(body: list[str], extra_args: str = "", extra_ins: str = "") -> str:
    """One elementwise ``linalg.generic`` over ``%x`` (as ``%in``) whose body is ``body``."""
    ins = f"%x{extra_ins} : {T}" + (", i64" if extra_ins else "")
    maps = f"[{MAP}, {MAP}]" if not extra_ins else f"[{MAP}, affine_map<(d0, d1) -> ()>, {MAP}]"
    block_args = "%in: f32, %n: i64, %out: f32" if extra_ins else "%in: f32, %out: f32"
    lines = "\n".join(f"    {line}" for line in body)
    return f"""
func.func @main(%x: {T}{extra_args}) -> {T} {{
  %e = tensor.empty() : {T}
  %r = linalg.generic {{indexing_maps = {maps}, iterator_types = ["parallel", "parallel"]}}
      ins({ins}) outs(%e : {T}) {{
  ^bb0({block_args}):
{lines}
  }} -> {T}
  return %r : {T}
}}
"""


CASES = {
    # x ** 3 with a constant exponent (PyTorch's pow with an int): multiplications.
    "fpowi_constant": (
        _elementwise(
            [
                "%c3 = arith.constant 3 : i64",
                "%p = math.fpowi %in, %c3 : f32, i64",
                "linalg.yield %p : f32",
            ]
        ),
        lambda x: [x, x**3],
    ),
    # x ** n with n an argument: a generated function, per element.
    "fpowi_argument": (
        _elementwise(
            ["%p = math.fpowi %in, %n : f32, i64", "linalg.yield %p : f32"],
            extra_args=", %k: i64",
            extra_ins=", %k",
        ),
        lambda x: [x, np.int64(2), x**2],
    ),
    # erf has no LLVM intrinsic: libm (scalar) or libmvec (vector).
    "erf": (
        _elementwise(["%p = math.erf %in : f32", "linalg.yield %p : f32"]),
        lambda x: [x, np.vectorize(math.erf)(x).astype(np.float32)],
    ),
}


@pytest.mark.parametrize("graph", ["naive", "x86"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_math_op_compiles_and_verifies(capsys, tmp_path, graph, case):
    text, arrays = CASES[case]
    x = np.random.default_rng(3).uniform(-2, 2, (ROWS, COLS)).astype(np.float32)
    *inputs, expected = arrays(x)
    path = tmp_path / f"{case}.mlir"
    path.write_text(text)
    named = {f"in{i}": np.asarray(a) for i, a in enumerate(inputs)}
    np.savez(path.with_suffix(".npz"), **named, out0=expected)
    code = main(["run", graph, str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verified"] is True, report
    assert report["max_abs_error"] < 1e-5
