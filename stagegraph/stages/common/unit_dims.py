"""Generic ops lose their unit dims: reshapes around them instead.

A unit innermost dim, as in GroupNorm's ``N x C x G x 1`` statistics and their broadcasts,
makes the vectorized ops' innermost vectors one element long: scalar loads and stores. On
Zen 1 a 256^3 Linear + GroupNorm ran 8% slower on one thread for it, and ~30% slower on
two (the scalar loops were too small to thread). Upstream's
``linalg-fold-unit-extent-dims`` drops such dims (``tensor.collapse_shape`` /
``tensor.expand_shape`` around the op), and canonicalization folds the reshapes into
their neighbours where it can.

A pool whose output has a unit dim but whose window covers only part of the input dim
would come out of the fold as an invalid ``linalg.generic``; such inputs are sliced to the
part they read first (:mod:`stagegraph.stages.common.read_extents`).

A function whose loops carry tensors (a scan lowered to ``scf.for``) is left as it is: the
fold rewrites an op that updates the carried tensor in place into one writing a fresh
tensor, and bufferization then rejects the loop ("Yield operand is not equivalent to the
corresponding iter bbArg").
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.walk import collect, top_level_ops

FOLD_UNIT_DIMS = "func.func(linalg-fold-unit-extent-dims,canonicalize)"
_LOOPS = ("scf.for", "scf.while", "scf.forall")


def fold_unit_dims(module: Any) -> int:
    """Drop the unit dims of the generic ops of every function of ``module`` (an
    ``ir.Module``) that has no tensor-carrying loop; returns how many functions."""
    from stagegraph.mlir.bindings import passmanager
    from stagegraph.stages.common.read_extents import trim_unread_inputs

    functions = [
        fn
        for fn in top_level_ops(module.operation)
        if fn.name == "func.func" and not collect(fn, _carries_tensors)
    ]
    if functions:
        manager = passmanager.PassManager.parse(FOLD_UNIT_DIMS, context=module.context)
        for fn in functions:
            trim_unread_inputs(fn)  # else a pool with a unit output dim comes out invalid
            manager.run(fn)
    return len(functions)


def _carries_tensors(op: Any) -> bool:
    from stagegraph.mlir.bindings import ir

    return op.name in _LOOPS and any(
        isinstance(result.type, ir.RankedTensorType) for result in op.results
    )
