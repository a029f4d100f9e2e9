"""Shared fixtures: small payloads and stage factories for core tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--target",
        default=None,
        help="pin every graph's target stage to this target (sets $STAGEGRAPH_TARGET), "
        "e.g. x86-64-v3 to check the AVX2 code path on a wider host",
    )


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--target")
    if target:
        os.environ["STAGEGRAPH_TARGET"] = target


def _shared() -> Path:
    """``shared/`` beside the checkout, or beside an ancestor (a worktree under ``wt/``)."""
    root = Path(__file__).resolve().parents[1]
    for folder in root.parents:
        if (folder / "shared" / "kernelbench").is_dir():
            return folder / "shared"
    return root.parent / "shared"


SHARED = _shared()
KERNELBENCH = SHARED / "kernelbench" / "level1"

MATMUL_MLIR = """
func.func @main(%a: tensor<16x8xf32>, %b: tensor<8x12xf32>) -> tensor<16x12xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<16x12xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<16x12xf32>) -> tensor<16x12xf32>
  %r = linalg.matmul ins(%a, %b : tensor<16x8xf32>, tensor<8x12xf32>)
                     outs(%acc : tensor<16x12xf32>) -> tensor<16x12xf32>
  return %r : tensor<16x12xf32>
}
"""

TILE_SCHEDULE = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %mm = transform.structured.match ops{["linalg.matmul"]} in %root
      : (!transform.any_op) -> !transform.any_op
    %t, %loops:2 = transform.structured.tile_using_for %mm tile_sizes [TILE, TILE]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.yield
  }
}
"""


def tile_schedule(tile: int) -> str:
    return TILE_SCHEDULE.replace("TILE", str(tile))


@pytest.fixture
def matmul_text() -> str:
    return MATMUL_MLIR


def kernelbench_or_skip(level: str = "level1") -> Path:
    folder = SHARED / "kernelbench" / level
    if not folder.is_dir():
        pytest.skip(f"shared KernelBench payloads not found at {folder}")
    return folder
