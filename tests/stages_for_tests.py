"""Tiny pure-Python stage factories used to test graph validation (no MLIR needed)."""

from __future__ import annotations

from stagegraph.core.ports import BufferModule, Config, Facts, Params, TensorModule
from stagegraph.core.stage import stage


class ShapeFacts(Facts):
    m: int = 1


class TileParams(Params):
    tile: int = 8


class OtherParams(Params):
    unroll: int = 2


class ScaleConfig(Config):
    factor: int = 1


@stage("analysis", name="test.analyze")
def analyze(module: TensorModule) -> ShapeFacts:
    return ShapeFacts(m=3)


@stage("params", name="test.select")
def select(facts: ShapeFacts, config: ScaleConfig) -> TileParams:
    return TileParams(tile=facts.m * config.factor)


@stage("params", name="test.select_other")
def select_other(facts: ShapeFacts) -> OtherParams:
    return OtherParams()


@stage("schedule", name="test.schedule")
def schedule(module: TensorModule, params: TileParams) -> TensorModule:
    return module


@stage("passes", name="test.bufferize")
def bufferize(module: TensorModule) -> BufferModule:
    return module


@stage("wrapper", name="test.passthrough")
def passthrough(module: TensorModule) -> TensorModule:
    return module
