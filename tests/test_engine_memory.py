"""What a run holds: copies only where a stage needs one, a memo bounded in bytes, hashes
and snapshots that do not keep a model's weights in memory once more."""

from __future__ import annotations

import pytest

from stagegraph.core.engine import Engine
from stagegraph.core.graph import Graph
from stagegraph.core.memo import Memo, freeze
from stagegraph.core.ports import Module
from stagegraph.stages.common.passes import verify
from tests.conftest import MATMUL_MLIR
from tests.stages_for_tests import analyze, schedule, select
from tests.test_engine import PAYLOAD, linear_graph


def _count_clones(monkeypatch) -> list[int]:
    clones = [0]
    clone = Module.clone

    def counting(self):
        clones[0] += 1
        return clone(self)

    monkeypatch.setattr(Module, "clone", counting)
    return clones


def test_the_only_mutating_reader_after_the_others_takes_the_module_uncopied(monkeypatch):
    """x86's shape: the normalized module goes to the analysis and then to the schedule,
    which changes it; copying it (a model's weights) would serve no one."""
    graph = Graph(
        "peek",
        [verify("load"), analyze("peek"), select("choose"), schedule("tile")],
        [
            "payload -> load.module",
            "load.module -> peek.module",
            "peek.facts -> choose.facts",
            "load.module -> tile.module",
            "choose.params -> tile.params",
        ],
        [PAYLOAD],
    )
    clones = _count_clones(monkeypatch)
    result = Engine(cache=False).run(graph, MATMUL_MLIR)
    assert clones[0] == 0
    assert result.value("tile", "module").ir is result.value("load", "module").ir


def test_a_fan_out_of_two_mutating_branches_still_copies(monkeypatch):
    from tests.test_engine import test_fan_out_gives_each_mutating_branch_its_own_copy

    clones = _count_clones(monkeypatch)
    test_fan_out_gives_each_mutating_branch_its_own_copy()  # values checked there
    assert clones[0] == 2  # each branch its own copy; the shared input stays as it was


def test_modules_past_the_memo_budget_are_not_kept_and_their_stages_rerun():
    engine = Engine(memo_bytes=0)
    first = engine.run(linear_graph(), MATMUL_MLIR)
    assert engine._cache.used == 0
    again = engine.run(linear_graph(), MATMUL_MLIR)
    assert again.trace.executed() == first.trace.executed() == ["load", "tile", "bufferize",
                                                                "loops", "lower"]  # fmt: skip
    assert again.module.text() == first.module.text()
    served = Engine()
    served.run(linear_graph(), MATMUL_MLIR)
    assert served._cache.used > 0
    assert served.run(linear_graph(), MATMUL_MLIR).trace.executed() == []


def _module(text: str) -> Module:
    from stagegraph.mlir.bindings import ir, new_context

    return Module["tensor"](ir.Module.parse(text, new_context()))


def test_freeze_hashes_every_module_and_keeps_only_those_within_the_limit():
    module = _module(MATMUL_MLIR)
    frozen, digest, size = freeze(module, 1 << 20)
    assert digest == module.content_hash() == frozen.content_hash()
    assert size == len(frozen.data) == len(module.bytecode())
    assert frozen.thaw().text() == module.text()
    too_big, same, _ = freeze(module, len(frozen.data) - 1)
    assert too_big is None and same == digest


def test_the_memo_evicts_the_least_recently_used_entries_past_its_budget():
    module = _module(MATMUL_MLIR)
    frozen, digest, size = freeze(module, 1 << 20)
    memo = Memo(budget=2 * size)
    for key in ("a", "b"):
        memo.put(key, {"module": frozen}, {"module": digest})
    memo.get("a")  # now the most recently used
    memo.put("c", {"module": frozen}, {"module": digest})
    assert "b" not in memo and "a" in memo and "c" in memo and memo.used == 2 * size
    memo.put("huge", {"m1": frozen, "m2": frozen, "m3": frozen}, {})
    assert "huge" not in memo and len(memo) == 2  # larger than the budget: not kept at all


def test_ir_dumps_still_hold_every_stage_while_the_memo_keeps_no_module(tmp_path):
    from stagegraph.instrument.ir_hooks import DumpIR

    engine = Engine(hooks=[DumpIR(tmp_path)], memo_bytes=0)
    result = engine.run(linear_graph(), MATMUL_MLIR)
    assert engine._cache.used == 0
    files = sorted(p.name for p in tmp_path.glob("*.mlir"))
    # every stage that changed the module (load only verifies it)
    assert files == ["01-tile.mlir", "02-bufferize.mlir", "03-loops.mlir", "04-lower.mlir"]
    assert (tmp_path / "04-lower.mlir").read_text().strip() == result.module.text().strip()
    assert "scf.for" in (tmp_path / "01-tile.mlir").read_text()


def _tile_event(module: Module, module_bytes: int | None) -> object:
    graph = linear_graph()
    return type("Event", (), {"graph": graph, "stage": graph.stages["tile"],
                              "inputs": {"module": module},
                              "module_bytes": module_bytes})()  # fmt: skip


def test_a_mutating_stage_input_is_snapshotted_below_the_limit(tmp_path):
    from stagegraph.instrument.repro import AS_LEFT_NOTE, ReproducerHook

    module = _module(MATMUL_MLIR)
    original = module.text()
    event = _tile_event(module, 1000)
    hook = ReproducerHook(tmp_path)
    hook.before_stage(event)
    module.ir.body.operations[0].erase()  # the stage changes its input, then fails
    folder = hook.on_failure(event, RuntimeError("boom"))
    text = (tmp_path / folder / "input.mlir").read_text()
    assert text == original and AS_LEFT_NOTE not in text


def test_a_module_past_the_snapshot_limit_is_reproduced_as_the_stage_left_it(tmp_path, monkeypatch):
    from stagegraph.instrument import repro
    from stagegraph.instrument.repro import AS_LEFT_NOTE, ReproducerHook

    bytecode = Module.bytecode
    monkeypatch.setattr(Module, "bytecode", lambda self: pytest.fail("snapshotted"))
    module = _module(MATMUL_MLIR)
    event = _tile_event(module, repro.SNAPSHOT_BYTES + 1)
    hook = ReproducerHook(tmp_path)
    hook.before_stage(event)
    monkeypatch.setattr(Module, "bytecode", bytecode)
    module.ir.body.operations[0].erase()
    folder = hook.on_failure(event, RuntimeError("boom"))
    text = (tmp_path / folder / "input.mlir").read_text()
    assert text == AS_LEFT_NOTE + module.text()


def test_a_run_past_the_memo_budget_writes_no_bytecode_for_its_modules(monkeypatch):
    """The payload's size is measured once; its stages' modules are neither frozen nor
    hashed, and a second run serves none of them."""
    from stagegraph.core import memo

    frozen: list[int] = []
    freeze_ = memo.freeze

    def counting(module, limit):
        frozen.append(limit)
        return freeze_(module, limit)

    monkeypatch.setattr("stagegraph.core.engine.freeze", counting)
    engine = Engine(memo_bytes=16)  # the matmul payload is larger
    first = engine.run(linear_graph(), MATMUL_MLIR)
    assert frozen == [0]  # the payload input, measured
    assert engine.run(linear_graph(), MATMUL_MLIR).trace.executed() == first.trace.executed()


def test_a_stage_that_does_not_change_its_module_gets_no_snapshot(tmp_path):
    from stagegraph.instrument.repro import ReproducerHook

    module = _module(MATMUL_MLIR)
    graph = Graph("peek", [verify("load"), analyze("peek")],
                  ["payload -> load.module", "load.module -> peek.module"], [PAYLOAD])  # fmt: skip
    event = type("Event", (), {"graph": graph, "stage": graph.stages["peek"],
                               "inputs": {"module": module}, "module_bytes": 10})()  # fmt: skip
    hook = ReproducerHook(tmp_path)
    hook.before_stage(event)
    assert hook._pending["module"] is module
    folder = hook.on_failure(event, RuntimeError("boom"))
    assert (tmp_path / folder / "input.mlir").read_text() == module.text()


def test_a_payload_file_is_not_held_as_text(tmp_path):
    from stagegraph.workload.mlir_file import MlirFileWorkload

    path = tmp_path / "mm.mlir"
    path.write_text(MATMUL_MLIR)
    workload = MlirFileWorkload(path)
    assert "text" not in vars(workload)
    assert workload.text == MATMUL_MLIR


def test_a_tensor_without_elements_is_refused_by_the_load_stage(tmp_path, capsys):
    from stagegraph.cli.main import main

    path = tmp_path / "empty.mlir"
    path.write_text(
        "func.func @main(%a: tensor<1x8xf32>) -> tensor<1x0xf32> {\n"
        "  %e = tensor.empty() : tensor<1x0xf32>\n"
        "  return %e : tensor<1x0xf32>\n"
        "}\n"
    )
    assert main(["run", "x86", str(path)]) == 2
    err = capsys.readouterr().err
    assert "dimension of 0" in err and "@main" in err and "1x0" in err
