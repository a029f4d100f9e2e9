"""Transposes of constant weights, done once at compile time on the GPU graph.

PyTorch's ``nn.Linear`` imports as ``x @ transpose(W)`` with ``W`` a constant: a kernel of
its own that rewrites all of W on every call, before the matmul's kernel reads it (for a
1024x1024 bf16 Linear, as many bytes moved as the matmul reads). The transposed constant
is computed here instead, from the constant's value (``dense_resource`` blobs are read by
evaluating them: :func:`~stagegraph.stages.common.constant_gathers.evaluate_constants`),
and the transpose's result is that new constant. Weights larger than
:data:`MAX_ELEMENTS` are left to the kernel (the probe would copy them).
"""

from __future__ import annotations

from stagegraph.stages.common.constant_transposes import MAX_ELEMENTS, fold_constant_transposes

__all__ = ["MAX_ELEMENTS", "fold_constant_transposes"]
