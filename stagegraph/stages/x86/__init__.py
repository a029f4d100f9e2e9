"""The x86 CPU target package. Importing it registers what the generic layers need from
x86 without naming it: its stage modules, its cost models (``--cost-model``) and the
shared library its vector math lowering calls into. Registration is by import string, so
nothing here loads MLIR or the modules themselves."""

from __future__ import annotations

from typing import Any

from stagegraph.core.stage import register_stage_module
from stagegraph.stages.common.costmodel import register_cost_model
from stagegraph.stages.common.runtime_libs import RUNTIME_LIBRARIES

register_stage_module("stagegraph.stages.x86.params_stage")
register_stage_module("stagegraph.stages.x86.ir_stages")
register_stage_module("stagegraph.stages.x86.costmodels")
register_cost_model("heuristic", "stagegraph.stages.x86.params_stage:heuristic")
register_cost_model("analytical", "stagegraph.stages.x86.costmodels:analytical")
register_cost_model("tuned", "stagegraph.stages.x86.costmodels:tuned")
register_cost_model("fixed", "stagegraph.stages.x86.costmodels:fixed")


def libmvec_libraries(module: Any) -> list[str]:
    """glibc's libmvec when the module calls its vector math functions (``_ZGV*``)."""
    from stagegraph.stages.x86.vector_math import declared_vector_functions, libmvec_path

    return [libmvec_path()] if declared_vector_functions(module) else []


RUNTIME_LIBRARIES.register("libmvec", libmvec_libraries)
