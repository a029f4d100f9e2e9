"""The wrapper stage: splice a benchmark harness into the module at any level it can wrap."""

from __future__ import annotations

from stagegraph.core.ports import AnyModule, Config
from stagegraph.core.stage import stage


class BenchWrapperConfig(Config):
    """Which payload function to time; the harness is ``<entry>_bench``."""

    entry: str = "main"


@stage("wrapper", name="bench_wrapper")
def bench_wrapper(module: AnyModule, config: BenchWrapperConfig) -> AnyModule:
    """Add a timed loop around ``entry``, built from its signature at this point of the flow."""
    from stagegraph.stages.common.bench_wrapper import insert_bench_wrapper

    insert_bench_wrapper(module.ir, config.entry)
    return module
