"""The GPU graph's normalization: the payload rewrites every graph wants (gathers that only
reshape become reshapes, unit dims leave the generic ops), then elementwise producers fuse
into their consumers (``linalg-fuse-elementwise-ops``): a chain of pointwise ops, or a
pointwise op feeding a reduction, becomes one op, hence one kernel; a cheap producer with
several consumers is recomputed in each (:mod:`.recompute`). Transposes of constant
weights are done at compile time (:mod:`.constant_weights`), and matmuls read the half
inputs that widening copies were made of (:func:`~.epilogue.fold_input_widening`)."""

from __future__ import annotations

from stagegraph.core.ports import TensorModule
from stagegraph.core.stage import stage

FUSE = "linalg-fuse-elementwise-ops,canonicalize,cse"


@stage("passes", name="gpu.normalize")
def gpu_normalize(module: TensorModule) -> TensorModule:
    """Fold reshaping gathers and unit dims, then fuse elementwise producers."""
    from stagegraph.mlir.build import ir_location
    from stagegraph.stages.common.constant_gathers import fold_reshaping_gathers
    from stagegraph.stages.common.passes import run_pipeline
    from stagegraph.stages.common.unit_dims import fold_unit_dims
    from stagegraph.stages.gpu.constant_weights import fold_constant_transposes
    from stagegraph.stages.gpu.epilogue import fold_input_widening

    with module.ir.context, ir_location(module.ir):
        fold_reshaping_gathers(module.ir)
        fold_unit_dims(module.ir)
        fold_constant_transposes(module.ir)
        fold_input_widening(module.ir)
    module = run_pipeline(module, FUSE)
    from stagegraph.stages.gpu.recompute import duplicate_shared_producers

    with module.ir.context, ir_location(module.ir):
        cloned = duplicate_shared_producers(module.ir)
    return run_pipeline(module, FUSE) if cloned else module
