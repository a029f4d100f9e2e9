"""A channels-first convolution's sizes as plain numbers (:class:`ConvShape`): read from
the IR by :func:`stagegraph.stages.x86.conv.gemm.conv_shape`, used by the GEMM rewrite, its
row blocks (:mod:`.gemm_blocks`) and the direct-or-GEMM cost model (:mod:`.choice`). A
leaf module, so those three import it without importing each other."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ConvShape:
    """A channels-first convolution's sizes: images ``n``, channels ``c``, filters ``f``,
    kernel taps per spatial dim ``taps``, output sizes ``out``, ``strides``, ``dilations``."""

    n: int
    c: int
    f: int
    taps: tuple[int, ...]
    out: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]

    @property
    def depth(self) -> int:
        """The matmul's ``k``: channels times taps."""
        return self.c * math.prod(self.taps)

    @property
    def columns(self) -> int:
        """The matmul's ``n``: output positions of all images."""
        return self.n * math.prod(self.out)
