"""The wrapper stage: splice a benchmark harness into the module at any level it can wrap."""

from __future__ import annotations

from typing import Literal

from stagegraph.core.ports import AnyModule, Config
from stagegraph.core.stage import stage

#: The IR levels a wrapper can be built at: it needs the entry's tensor or memref signature.
WRAPPABLE_LEVELS = ("tensor", "buffer")


class BenchWrapperConfig(Config):
    """Which payload function to time (the harness is ``<entry>_bench``) and the IR level
    it is spliced in at (``any``: the level fed in; the wrapper keeps it)."""

    entry: str = "main"
    level: Literal["tensor", "buffer", "any"] = "any"

    def port_levels(self) -> tuple[str | None, str | None]:
        return (None, None) if self.level == "any" else (self.level, self.level)


@stage("wrapper", name="bench_wrapper")
def bench_wrapper(module: AnyModule, config: BenchWrapperConfig) -> AnyModule:
    """Add a timed loop around ``entry``, built from its signature at this point of the flow."""
    from stagegraph.stages.common.bench_harness import insert_bench_wrapper

    insert_bench_wrapper(module.ir, config.entry)
    return module
