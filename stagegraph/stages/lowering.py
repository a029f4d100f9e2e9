"""Pass pipelines shared by every CPU graph: bufferization and lowering to the LLVM dialect.

Calling convention after ``BUFFERIZE``: the entry function takes its inputs and then its
outputs as memrefs (results become caller-allocated out-parameters), so runners pass numpy
arrays for both and nothing is allocated or freed across the boundary.

``LOWER_TO_LLVM`` runs ``scf.forall`` loops serially; ``LOWER_TO_LLVM_OPENMP`` turns them
into OpenMP parallel loops (the JIT then needs an OpenMP runtime, see
``stagegraph.runtime.openmp``). Both fully unroll the n-D vector transfers left by the
schedules into 1-D ones first (a partial unroll leaves stack allocas inside loops).
"""

BUFFERIZE = (
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params{hoist-static-allocs modify-public-functions},"
    "cse,canonicalize"
)

_VECTORS = "func.func(convert-vector-to-scf{full-unroll=true target-rank=1},canonicalize)"

_TO_LLVM = (
    "buffer-deallocation-pipeline,convert-bufferization-to-memref,expand-strided-metadata,"
    "lower-affine,convert-scf-to-cf,convert-vector-to-llvm,finalize-memref-to-llvm,"
    "convert-to-llvm,reconcile-unrealized-casts"
)

# Serial: the per-block packing buffers are allocated once, outside the block loops.
LOWER_TO_LLVM = f"func.func(scf-forall-to-for,buffer-loop-hoisting),{_VECTORS},{_TO_LLVM}"

LOWER_TO_LLVM_OPENMP = (
    f"func.func(scf-forall-to-parallel),{_VECTORS},"
    # Deallocation first: it must not insert ops into the omp.wsloop wrapper; the
    # memref.alloca_scope made by scf-to-openmp is lowered before scf-to-cf splits its body.
    "buffer-deallocation-pipeline,convert-bufferization-to-memref,convert-scf-to-openmp,"
    "expand-strided-metadata,lower-affine,convert-vector-to-llvm,finalize-memref-to-llvm,"
    "convert-scf-to-cf,convert-openmp-to-llvm,convert-to-llvm,reconcile-unrealized-casts"
)

LINALG_TO_LOOPS = "convert-linalg-to-loops"
