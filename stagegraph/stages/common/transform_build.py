"""Small builders for transform-dialect IR that every hand-built schedule needs: an any-op
handle type, a handle's producer, a match by op name and a region of pattern sets.

They live here so that each schedule module builds these pieces the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stagegraph.mlir.bindings import ir, structured, transform


def any_op() -> Any:
    """``!transform.any_op``: the handle type of every op these schedules address."""
    return transform.AnyOpType.get()


def apply_patterns(target: Any, *builders: Callable[[], Any]) -> None:
    """One ``transform.apply_patterns`` region on ``target`` holding the pattern-set ops
    ``builders`` create (e.g. ``transform.ApplyCanonicalizationPatternsOp``)."""
    op = transform.ApplyPatternsOp(target)
    with ir.InsertionPoint(op.regions[0].blocks[0]):
        for build in builders:
            build()


def producer_of(op: Any, operand: int) -> Any:
    """A handle to the op producing operand ``operand`` of the ops behind ``op``."""
    return transform.GetProducerOfOperand(any_op(), op, operand).result


def match_name(target: Any, name: str) -> Any:
    """A handle to the ops named ``name`` nested in ``target``."""
    return structured.MatchOp.match_op_names(target, [name]).result
