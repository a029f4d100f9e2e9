"""``index`` arithmetic for the hand-built convolution kernels (:mod:`.depthwise`,
:mod:`.direct3d`): constants made once, at the start of the convolution's block, so they
dominate every loop a kernel builds there, the ones made before them included; and
``base * scale + offset`` folded where trivial."""

from __future__ import annotations

from typing import Any


class IndexArithmetic:
    """The index constants and affine steps of one kernel built in place of ``op``."""

    def __init__(self, op: Any) -> None:
        self._block_of_op = op.operation.block
        self._constants: dict[int, Any] = {}

    def index(self, value: int) -> Any:
        """An ``index`` constant at the start of the op's block (made once, reused)."""
        from stagegraph.mlir.bindings import arith, ir

        if value not in self._constants:
            with ir.InsertionPoint.at_block_begin(self._block_of_op):
                self._constants[value] = arith.ConstantOp(ir.IndexType.get(), value).result
        return self._constants[value]

    def affine(self, base: Any, scale: int, offset: int) -> Any:
        """``base * scale + offset`` in ``index`` arithmetic (a constant when ``scale`` is
        0; no multiply by 1, no add of 0)."""
        from stagegraph.mlir.bindings import arith

        if scale == 0:
            return self.index(offset)
        value = base if scale == 1 else arith.MulIOp(base, self.index(scale)).result
        return value if offset == 0 else arith.AddIOp(value, self.index(offset)).result
