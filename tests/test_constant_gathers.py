"""Gathers through constant positions that only reshape their source become reshapes
(``stages.common.constant_gathers``, run by ``x86.normalize``)."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect

SOURCE_SHAPE, OUT_SHAPE = (2, 3, 4, 1), (2, 12)


def _tensor(shape: tuple[int, ...], element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


def _positions(order: str) -> list[np.ndarray]:
    """Source positions of each output element: the row-major reshape (as GroupNorm's
    ``view`` is imported, with the last dim's 0 written as -1 to exercise the wrap), or a
    permutation of it (a gather that is no reshape)."""
    flat = np.arange(np.prod(OUT_SHAPE)).reshape(OUT_SHAPE)
    if order == "permuted":
        flat = flat.T.reshape(OUT_SHAPE)
    positions = list(np.unravel_index(flat, SOURCE_SHAPE))
    positions[-1] = positions[-1] - 1  # -1: the last (only) element of the unit dim
    return [p.astype(np.int64) for p in positions]


def _payload(order: str, resources: bool) -> str:
    """A ``linalg.generic`` gathering ``%src`` at constant positions, as torch-mlir imports
    a view: one i64 tensor per source dim, each wrapped for negative values."""
    itype, src_t = _tensor(OUT_SHAPE, "i64"), _tensor(SOURCE_SHAPE, "f32")
    out_t = _tensor(OUT_SHAPE, "f32")
    positions = _positions(order)
    constants, blobs = [], []
    for d, values in enumerate(positions):
        if resources:
            constants.append(f"  %i{d} = arith.constant dense_resource<idx{d}> : {itype}")
            blobs.append(f'idx{d}: "0x08000000{values.astype("<i8").tobytes().hex()}"')
        else:
            rows = ", ".join("[" + ", ".join(map(str, row)) + "]" for row in values)
            constants.append(f"  %i{d} = arith.constant dense<[{rows}]> : {itype}")
    identity = "affine_map<(d0, d1) -> (d0, d1)>"
    args = ", ".join(f"%x{d}: i64" for d in range(len(SOURCE_SHAPE)))
    body = []
    for d, size in enumerate(SOURCE_SHAPE):
        body += [
            f"      %n{d} = arith.cmpi slt, %x{d}, %c0 : i64",
            f"      %w{d} = arith.addi %x{d}, %c{size} : i64",
            f"      %s{d} = arith.select %n{d}, %w{d}, %x{d} : i64",
            f"      %p{d} = arith.index_cast %s{d} : i64 to index",
        ]
    indices = ", ".join(f"%p{d}" for d in range(len(SOURCE_SHAPE)))
    sizes = sorted({0, *SOURCE_SHAPE})
    text = "\n".join(
        [
            f"func.func @main(%src: {src_t}) -> {out_t} {{",
            *(f"  %c{s} = arith.constant {s} : i64" for s in sizes),
            *constants,
            f"  %e = tensor.empty() : {out_t}",
            f"  %g = linalg.generic {{indexing_maps = [{', '.join([identity] * 5)}],",
            '      iterator_types = ["parallel", "parallel"]}',
            f"      ins(%i0, %i1, %i2, %i3 : {itype}, {itype}, {itype}, {itype})",
            f"      outs(%e : {out_t}) {{",
            f"    ^bb0({args}, %o: f32):",
            *body,
            f"      %v = tensor.extract %src[{indices}] : {src_t}",
            "      linalg.yield %v : f32",
            f"  }} -> {out_t}",
            f"  return %g : {out_t}",
            "}",
        ]
    )
    if resources:
        text += "\n{-#\n  dialect_resources: { builtin: {\n    "
        text += ",\n    ".join(blobs) + "\n  } }\n#-}\n"
    return text


def _expected(src: np.ndarray, order: str) -> np.ndarray:
    positions = _positions(order)
    positions[-1] = np.where(positions[-1] < 0, positions[-1] + SOURCE_SHAPE[-1], positions[-1])
    return src[tuple(positions)]


@pytest.mark.parametrize("resources", [False, True], ids=["dense", "dense_resource"])
def test_a_gather_that_only_reshapes_becomes_a_reshape(resources: bool) -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.constant_gathers import fold_reshaping_gathers

    module = parse_payload(_payload("reshape", resources))
    with module.context, ir.Location.unknown():
        assert fold_reshaping_gathers(module) == 1
    assert module.operation.verify()
    assert not collect(module, "tensor.extract") and not collect(module, "linalg.generic")
    (collapse,) = collect(module, "tensor.collapse_shape")
    (expand,) = collect(module, "tensor.expand_shape")
    assert ir.RankedTensorType(collapse.results[0].type).shape == [24]
    assert ir.RankedTensorType(expand.results[0].type).shape == list(OUT_SHAPE)


def test_a_permuting_gather_is_left_alone() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.constant_gathers import fold_reshaping_gathers

    module = parse_payload(_payload("permuted", resources=False))
    with module.context, ir.Location.unknown():
        assert fold_reshaping_gathers(module) == 0
    assert len(collect(module, "tensor.extract")) == 1


@pytest.mark.parametrize("order", ["reshape", "permuted"])
def test_x86_runs_gathers_right(tmp_path, order: str) -> None:
    """End to end: the reshape and the gather left alone both match numpy."""
    src = np.random.default_rng(0).standard_normal(SOURCE_SHAPE, dtype=np.float32)
    (tmp_path / "p.mlir").write_text(_payload(order, resources=True))
    np.savez(tmp_path / "p.npz", in0=src, out0=_expected(src, order))
    result = sg.run("x86", str(tmp_path / "p.mlir"), threads=1)
    assert result.verified is True, result.message
