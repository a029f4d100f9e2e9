"""A user plugin written into a temporary folder: a stage, a graph, a workload class and a
cost model, plus a module beside it that the plugin imports (as user code does)."""

from __future__ import annotations

from pathlib import Path

PLUGIN = '''"""Test plugin {prefix}: registers a stage, a graph, a workload and a cost model."""

import stagegraph as sg
from {prefix}_helpers import PIPELINE
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.common.costmodel import CostModelConfig
from stagegraph.stages.target import Target
from stagegraph.stages.x86.params_stage import X86Params, heuristic
from stagegraph.workloads.matmul import Matmul


class CleanupConfig(sg.Config):
    pipeline: str = PIPELINE


@sg.stage("passes", name="{prefix}.cleanup")
def cleanup(module: sg.Module["tensor"], config: CleanupConfig) -> sg.Module["tensor"]:
    """canonicalize and cse before bufferizing."""
    from stagegraph.stages.common.passes import run_pipeline

    return run_pipeline(module, config.pipeline)


def build() -> sg.Graph:
    naive = sg.load_graph("naive")
    return naive.splice("load", cleanup("cleanup"))


sg.register_graph("{prefix}-naive", build)


@sg.register_workload
class Square(Matmul):
    """A matmul under another name."""

    name = "{prefix}-square"


@sg.stage("params", name="{prefix}.small_tiles")
def small_tiles(facts: PayloadFacts, target: Target, config: CostModelConfig) -> X86Params:
    """The heuristic's choice with one register tile of rows per cache block."""
    params = heuristic.fn(facts, target, config)
    sites = tuple(p.model_copy(update={{"tile_m": p.reg_m}}) for p in params.matmul)
    return params.model_copy(update={{"matmul": sites}})


sg.register_cost_model("{prefix}.small_tiles", small_tiles)
'''


def write_plugin(folder: Path, prefix: str) -> Path:
    """``folder/PREFIX_plugin.py`` (and the ``PREFIX_helpers.py`` it imports)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{prefix}_helpers.py").write_text('PIPELINE = "canonicalize,cse"\n')
    path = folder / f"{prefix}_plugin.py"
    path.write_text(PLUGIN.format(prefix=prefix))
    return path
