"""Autotuning: strategies, executors and the tuner (:mod:`stagegraph.tune.runner`).

This module stays light (no z3, no Dask, no MLIR on import). Cost models by name live in
:mod:`stagegraph.stages.common.costmodel`, the tuning database the ``tuned`` cost model
reads in :mod:`stagegraph.stages.common.tuning_db`.
"""
