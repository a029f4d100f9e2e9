"""The shape and element type of a workload's arguments and results."""

from __future__ import annotations

import numpy as np

from stagegraph.core.ports import Schema
from stagegraph.dtypes import numpy_dtype


class TensorSpec(Schema):
    """Shape and MLIR element type (``f32``, ``bf16``, ``i64``, ...) of one argument/result."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.numpy_dtype.itemsize
