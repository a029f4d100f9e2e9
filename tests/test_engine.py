"""The engine on real MLIR: order, fan-out copies, memoization, until, failures."""

from __future__ import annotations

import itertools

import pytest

from stagegraph.core.engine import Engine
from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module, TensorModule
from stagegraph.errors import StageFailed
from stagegraph.stages.common.passes import (
    bufferize,
    linalg_to_loops,
    lower_to_llvm,
    pipeline,
    verify,
)
from stagegraph.stages.common.transform import transform
from tests.conftest import MATMUL_MLIR, tile_schedule

PAYLOAD = GraphInput("payload", Module["tensor"], frozenset({"input"}))


def linear_graph(tile: int = 4) -> Graph:
    return Graph(
        "linear",
        [
            verify("load"),
            transform("tile", text=tile_schedule(tile), tags={"scheduled"}),
            bufferize(tags={"bufferized"}),
            linalg_to_loops("loops"),
            lower_to_llvm("lower"),
        ],
        [
            "payload -> load.module",
            "load.module -> tile.module",
            "tile.module -> bufferize.module",
            "bufferize.module -> loops.module",
            "loops.module -> lower.module",
        ],
        [PAYLOAD],
    )


def op_names(module: Module) -> list[str]:
    from stagegraph.mlir.bindings import ir

    names: list[str] = []

    def visit(op):
        names.append(op.name)
        return ir.WalkResult.ADVANCE

    module.ir.operation.walk(visit)
    return names


def loop_steps(module: Module) -> set[int]:
    """Constant steps of the scf.for loops: the tile sizes the schedule applied."""
    from stagegraph.mlir.bindings import ir

    steps: set[int] = set()

    def visit(op):
        if op.name == "scf.for":
            owner = op.operands[2].owner
            if owner.name == "arith.constant":
                steps.add(ir.IntegerAttr(owner.attributes["value"]).value)
        return ir.WalkResult.ADVANCE

    module.ir.operation.walk(visit)
    return steps


def test_run_records_trace_with_levels_and_op_counts():
    result = Engine().run(linear_graph(), MATMUL_MLIR)
    records = {r.name: r for r in result.trace.records}
    assert list(records) == ["load", "tile", "bufferize", "loops", "lower"]
    assert records["tile"].ops_out > records["tile"].ops_in  # tiling adds loops
    assert (records["bufferize"].level_in, records["bufferize"].level_out) == ("tensor", "buffer")
    assert records["lower"].level_out == "llvm"
    assert all(r.seconds >= 0 and not r.cached for r in records.values())
    assert result.module.level == "llvm"
    assert "llvm.func" in op_names(result.module)


def test_until_tag_returns_module_there():
    result = Engine().run(linear_graph(), MATMUL_MLIR, until="scheduled")
    assert [r.name for r in result.trace.records] == ["load", "tile"]
    assert result.module.level == "tensor"
    assert loop_steps(result.module) == {4}


def test_memoization_reruns_only_changed_stage_and_descendants():
    engine = Engine()
    graph = linear_graph(4)
    assert engine.run(graph, MATMUL_MLIR).trace.executed() == [
        "load",
        "tile",
        "bufferize",
        "loops",
        "lower",
    ]
    assert engine.run(graph, MATMUL_MLIR).trace.executed() == []
    changed = graph.with_config("tile", text=tile_schedule(8))
    assert engine.run(changed, MATMUL_MLIR).trace.executed() == [
        "tile",
        "bufferize",
        "loops",
        "lower",
    ]
    swapped = graph.replace(
        "lower", lower_to_llvm("other", pipeline="canonicalize," + lower_to_llvm().config.pipeline)
    )
    assert engine.run(swapped, MATMUL_MLIR).trace.executed() == ["lower"]


def test_cached_module_is_not_shared_with_consumers():
    engine = Engine()
    graph = linear_graph()
    first = engine.run(graph, MATMUL_MLIR, until="scheduled").module
    first.ir.body.operations[0].erase()  # mutate what we got back
    again = engine.run(graph, MATMUL_MLIR, until="scheduled").module
    assert "func.func" in op_names(again)


def test_fan_out_gives_each_mutating_branch_its_own_copy():
    graph = Graph(
        "fanout",
        [
            verify("load"),
            transform("tile4", text=tile_schedule(4)),
            transform("tile8", text=tile_schedule(8)),
        ],
        ["payload -> load.module", "load.module -> tile4.module", "load.module -> tile8.module"],
        [PAYLOAD],
    )
    result = Engine(cache=False).run(graph, MATMUL_MLIR)
    assert loop_steps(result.value("tile4", "module")) == {4}
    assert loop_steps(result.value("tile8", "module")) == {8}
    assert loop_steps(result.value("load", "module")) == set()  # the shared input is untouched


def test_failing_stage_is_named_with_mlir_diagnostics():
    graph = Graph(
        "broken",
        [verify("load"), pipeline("bad", pipeline="no-such-pass")],
        ["payload -> load.module", "load.module -> bad.module"],
        [PAYLOAD],
    )
    with pytest.raises(StageFailed) as info:
        Engine().run(graph, MATMUL_MLIR)
    error = info.value
    assert error.stage == "bad" and error.graph == "broken"
    assert "stage 'bad' of graph 'broken' failed" in str(error)
    assert "no-such-pass" in str(error)


def test_transform_failure_carries_diagnostics():
    bad = tile_schedule(4).replace(
        "%t, %loops:2 = transform.structured.tile_using_for %mm tile_sizes [4, 4]\n"
        "      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)",
        "%i = transform.structured.interchange %mm iterator_interchange = [2, 1, 0]\n"
        "      : (!transform.any_op) -> !transform.any_op",
    )
    assert "interchange" in bad
    graph = Graph(
        "badschedule",
        [verify("load"), transform("tile", text=bad)],
        ["payload -> load.module", "load.module -> tile.module"],
        [PAYLOAD],
    )
    with pytest.raises(StageFailed) as info:
        Engine().run(graph, MATMUL_MLIR)
    assert info.value.stage == "tile"
    assert info.value.diagnostics, "MLIR diagnostics must be attached"


def test_memo_key_covers_the_modules_a_stage_imports():
    """x86.schedule's code lives mostly in matmul_schedule.py (imported inside the function):
    its version must change when that module does, and the stage's own module is no key."""
    from stagegraph.core.stage import get_factory
    from stagegraph.core.versioning import _imported_modules, dependency_version

    factory = get_factory("x86.schedule")
    assert "stagegraph.stages.x86.matmul.schedule" in _imported_modules(
        "stagegraph.stages.x86.ir_stages"
    )
    assert factory.code_version == dependency_version("stagegraph.stages.x86.ir_stages")
    assert factory.code_version != dependency_version("stagegraph.stages.x86.matmul.schedule")


def test_duplicate_stage_names_from_other_code_are_refused():
    from stagegraph.core.stage import stage
    from stagegraph.errors import StageDefinitionError

    def verify(module: TensorModule) -> TensorModule:
        return module

    with pytest.raises(StageDefinitionError, match="already registered"):
        stage("passes", name="verify")(verify)


def test_listing_and_validating_do_not_load_mlir():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from stagegraph.cli.main import main\n"
        "main(['list', 'stages']); main(['validate', 'x86'])\n"
        "loaded = [m for m in sys.modules if m.startswith(('torch_mlir', 'mlir'))]\n"
        "assert not loaded and 'stagegraph.mlir.bindings' not in sys.modules, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_each_module_is_counted_once_per_run(monkeypatch):
    """A stage's op count in is the count its producer recorded out: the engine walks each
    module once (counting walks every op of what can be a very large module)."""
    from stagegraph.mlir import diagnostics

    counted: list[int] = []
    real = diagnostics.count_ops

    def counting(module):
        counted.append(real(module))
        return counted[-1]

    monkeypatch.setattr(diagnostics, "count_ops", counting)
    result = Engine(cache=False).run(linear_graph(), MATMUL_MLIR)
    records = result.trace.records
    assert len(counted) == len(records) + 1  # the payload, then each stage's output
    for before, after in itertools.pairwise(records):
        assert after.ops_in == before.ops_out
    assert records[-1].ops_out == len(op_names(result.module)) - 1  # the module op aside


def test_an_engine_without_memo_neither_prints_nor_hashes_modules(monkeypatch):
    """Hashes only key the memo: a one-shot engine never serializes a module for them."""

    def refuse(self):
        raise AssertionError("serialized a module")

    monkeypatch.setattr(Module, "text", refuse)
    monkeypatch.setattr(Module, "bytecode", refuse)
    result = Engine(cache=False).run(linear_graph(), MATMUL_MLIR)
    assert result.module.level == "llvm"


def test_memo_hashes_modules_without_printing_them(monkeypatch):
    """The memo keys modules by their bytecode (printing assembly is several times slower);
    a replayed stage still gives an equal, independent module."""
    engine = Engine()
    graph = linear_graph()
    first = engine.run(graph, MATMUL_MLIR, until="scheduled").module
    expected = first.text()

    def refuse(self):
        raise AssertionError("printed a module")

    monkeypatch.setattr(Module, "text", refuse)
    fresh = Engine().run(graph, MATMUL_MLIR, until="scheduled")
    again = engine.run(graph, MATMUL_MLIR, until="scheduled")
    monkeypatch.undo()
    assert again.trace.executed() == [] and fresh.trace.executed() == ["load", "tile"]
    assert again.module.text() == expected and again.module.ir is not first.ir
    assert again.module.content_hash() == first.content_hash()


def test_in_process_memo_does_not_hash_the_stages_code(monkeypatch):
    """Code versions key only the disk cache: the in-process memo replays stages without
    parsing their sources (a factory's code cannot change within the process)."""
    from stagegraph.core.stage import StageFactory

    def refuse(self):
        raise AssertionError("hashed a stage's code")

    monkeypatch.setattr(StageFactory, "code_version", property(refuse))
    engine = Engine()
    graph = linear_graph()
    assert engine.run(graph, MATMUL_MLIR).trace.executed() == [
        "load", "tile", "bufferize", "loops", "lower",
    ]  # fmt: skip
    changed = graph.with_config("tile", text=tile_schedule(8))
    assert engine.run(changed, MATMUL_MLIR).trace.executed() == [
        "tile", "bufferize", "loops", "lower",
    ]  # fmt: skip
