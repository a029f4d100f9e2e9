"""A reduction whose chunks would end in a masked tail takes its whole row when the row is
within twice the chunk (``generic.params._masked_tail_within``): the scheduled IR has no
mask, and the values verify (pinned targets)."""

from __future__ import annotations

import json

import pytest

from stagegraph.stages.x86.generic.params import _masked_tail_within

_ROWS = """
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
func.func @main(%x: tensor<4x{n}xf64>) -> tensor<4xf64> {{
  %zero = arith.constant 0.0 : f64
  %e = tensor.empty() : tensor<4xf64>
  %f = linalg.fill ins(%zero : f64) outs(%e : tensor<4xf64>) -> tensor<4xf64>
  %r = linalg.generic {{indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}}
      ins(%x : tensor<4x{n}xf64>) outs(%f : tensor<4xf64>) {{
  ^bb0(%a: f64, %acc: f64):
    %s = arith.addf %a, %acc : f64
    linalg.yield %s : f64
  }} -> tensor<4xf64>
  return %r : tensor<4xf64>
}}
"""


def test_the_rule():
    assert _masked_tail_within(845, 512, 512)  # GroupNorm rows of 5 x 13 x 13
    assert not _masked_tail_within(845, 169, 256)  # a static divisor: no tail
    assert not _masked_tail_within(2053, 512, 512)  # past twice the chunk: chunks, a tail
    assert not _masked_tail_within(1024, 512, 512)


def _scheduled(capsys, tmp_path, n: int, target: str, *extra: str) -> tuple[dict, list[str]]:
    from stagegraph.cli.main import main
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect

    path = tmp_path / "rows.mlir"
    path.write_text(_ROWS.format(n=n))
    dump = tmp_path / "dump"
    code = main(["run", "x86", str(path), "--threads", "1", "--target", target,
                 "--dump-ir", str(dump), "--json", *extra])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    report = json.loads(captured.out)
    index = json.loads((dump / "index.json").read_text())
    (scheduled,) = [s["file"] for s in index if s["stage"] == "schedule"]
    with new_context():
        module = ir.Module.parse((dump / scheduled).read_text())
        return report, [op.name for op in collect(module)]


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
def test_a_row_within_twice_the_chunk_is_reduced_unmasked(capsys, tmp_path, target):
    """845 f64 elements: AVX-512's chunk of 512 left a masked tail of 333 (whole now);
    AVX2's 256 take the static divisor 169."""
    report, names = _scheduled(capsys, tmp_path, 845, target)
    assert report["verified"] is True, report.get("message")
    assert "vector.reduction" in names or "vector.multi_reduction" in names
    assert "vector.create_mask" not in names and "vector.mask" not in names


def test_a_longer_prime_row_keeps_its_chunks(capsys, tmp_path):
    report, names = _scheduled(capsys, tmp_path, 2053, "x86-64-v4")
    assert report["verified"] is True, report.get("message")
    assert "vector.create_mask" in names


def test_the_rule_is_a_tunable_choice(capsys, tmp_path):
    """Off (``reduction_whole_tail=0``), AVX-512's 845-element rows run in chunks of 512
    and a masked tail again, and still verify."""
    report, names = _scheduled(
        capsys, tmp_path, 845, "x86-64-v4", "--param", "reduction_whole_tail=0"
    )
    assert report["verified"] is True, report.get("message")
    assert "vector.create_mask" in names
