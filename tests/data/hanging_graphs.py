"""Graphs that hang on purpose, for the time-limit tests: in a stage, or in the run.

Loaded as graph files (``stagegraph run tests/data/hanging_graphs.py ...``); the variable
``STAGEGRAPH_TEST_HANG`` picks where: ``stage`` (default) or ``run``.
"""

from __future__ import annotations

import os
import time

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Binary, LLVMModule, Module, TensorModule
from stagegraph.core.stage import stage
from stagegraph.stages.common.emit import jit
from stagegraph.stages.common.passes import bufferize, linalg_to_loops, lower_to_llvm, verify


@stage("passes", name="test.sleep_forever")
def sleep_forever(module: TensorModule) -> TensorModule:
    time.sleep(3600)
    return module


class NeverReturns(Binary):
    """A binary whose entry never returns (like generated code stuck in a loop)."""

    def call(self, entry: str, inputs: list) -> list:
        time.sleep(3600)
        return []


@stage("emit", name="test.hanging_emit", cacheable=False)
def hanging_emit(module: LLVMModule) -> Binary:
    return NeverReturns("never")


def build() -> Graph:
    hang_in_run = os.environ.get("STAGEGRAPH_TEST_HANG") == "run"
    stages = [verify("load"), bufferize(), linalg_to_loops("loops"), lower_to_llvm("lower")]
    edges = ["payload -> load.module", "bufferize.module -> loops.module",
             "loops.module -> lower.module", "lower.module -> emit.module"]  # fmt: skip
    if hang_in_run:
        stages.append(hanging_emit("emit"))
        edges.append("load.module -> bufferize.module")
    else:
        stages += [sleep_forever("sleepy"), jit("emit")]
        edges += ["load.module -> sleepy.module", "sleepy.module -> bufferize.module"]
    payload = GraphInput("payload", Module["tensor"], frozenset({"input"}))
    return Graph("hanging", stages, edges, [payload], default_splice="input")
