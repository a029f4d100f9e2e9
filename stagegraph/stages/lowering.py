"""Pass pipelines shared by every CPU graph: bufferization and lowering to the LLVM dialect.

Calling convention after ``BUFFERIZE``: the entry function takes its inputs and then its
outputs as memrefs (results become caller-allocated out-parameters), so runners pass numpy
arrays for both and nothing is allocated or freed across the boundary.
"""

BUFFERIZE = (
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params{hoist-static-allocs modify-public-functions},"
    "canonicalize,cse,canonicalize"
)

LOWER_TO_LLVM = (
    "buffer-deallocation-pipeline,convert-bufferization-to-memref,expand-strided-metadata,"
    "lower-affine,convert-scf-to-cf,finalize-memref-to-llvm,convert-to-llvm,"
    "reconcile-unrealized-casts"
)

LINALG_TO_LOOPS = "convert-linalg-to-loops"
