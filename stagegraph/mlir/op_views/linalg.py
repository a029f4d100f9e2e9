"""The generated ``linalg`` op classes, without the OpDSL op definitions."""

from stagegraph.mlir.bindings import linalg_ops  # noqa: F401  (registers the op classes)
