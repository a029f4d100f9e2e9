"""The stage library. Importing the package registers its stage modules (imported on the
first stage lookup, not here) and the target packages, each of which registers its own cost
models and hooks: the generic layers (``core``, ``stages/common``) name no target."""

from stagegraph.core.stage import register_stage_module

for _module in (
    "stagegraph.stages.analysis",
    "stagegraph.stages.target",
    "stagegraph.stages.sharding",
    "stagegraph.stages.common.emit",
    "stagegraph.stages.common.passes",
    "stagegraph.stages.common.transform",
    "stagegraph.stages.common.wrapper_stage",
):
    register_stage_module(_module)

from stagegraph.stages import gpu as _gpu  # noqa: E402,F401  (registers itself)
from stagegraph.stages import x86 as _x86  # noqa: E402,F401  (registers itself)
