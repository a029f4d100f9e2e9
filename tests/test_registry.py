"""One registry mechanism for every kind of name: lazy entries, one duplicate rule, one
"did you mean", an error type per kind, and target packages that register themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagegraph.cli.main import main
from stagegraph.core.registry import Registry
from stagegraph.errors import DuplicateNameError, UnknownNameError, UnknownTargetError


def test_entries_are_imported_on_first_lookup_only():
    registry: Registry[object] = Registry("test thing", plural="test-things-lazy")
    registry.register("join", "os.path:join")
    registry.register("missing", "no_such_module_xyz:thing")  # never looked up: no import
    import os.path

    assert registry.get("join") is os.path.join
    assert registry.origin("join") == "os.path:join"
    assert registry.names() == ["join", "missing"]


def test_one_duplicate_rule_and_one_did_you_mean():
    registry: Registry[object] = Registry("test thing", plural="test-things-dup")

    def first() -> None: ...

    def second() -> None: ...

    registry.register("thing", first)
    registry.register("thing", first)  # the same code again (a re-import): no clash
    with pytest.raises(DuplicateNameError) as raised:
        registry.register("thing", second)
    assert str(raised.value) == (
        f"test thing name 'thing' is already registered by {__name__}."
        "test_one_duplicate_rule_and_one_did_you_mean.<locals>.first; "
        f"{__name__}.test_one_duplicate_rule_and_one_did_you_mean.<locals>.second must use "
        "another name"
    )
    with pytest.raises(UnknownNameError, match=r"unknown test thing 'thimg' \(did you mean "
                       r"'thing'\?\); known: thing"):  # fmt: skip
        registry.get("thimg")


def test_discovered_names_cannot_be_taken_first():
    found: list[str] = []

    def discover() -> None:
        found.append("ran")
        registry.add_shipped("shipped", object(), "the shipped thing")

    registry: Registry[object] = Registry(
        "test thing", plural="test-things-shipped", discover=discover, discover_first=True
    )
    with pytest.raises(DuplicateNameError, match="already registered by the shipped thing"):
        registry.register("shipped", object())
    assert found


def test_every_kind_is_one_registry_listed_alike(capsys):
    from stagegraph.app.registries import all_registries

    kinds = set(all_registries())
    assert {"stages", "graphs", "workloads", "cost-models", "targets", "peers",
            "stage-modules", "runtime-libraries"} <= kinds  # fmt: skip
    assert main(["list", "peers", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert {"numpy", "iree"} <= set(rows) and rows["numpy"]["origin"] == "stagegraph.app.versus"
    assert main(["list", "targets"]) == 0
    assert {"host", "znver3", "x86-64-v3"} <= set(capsys.readouterr().out.split())
    assert main(["list", "cost-model"]) == 2
    assert "did you mean 'cost-models'" in capsys.readouterr().err


def test_the_x86_package_registers_itself():
    from stagegraph.core.stage import STAGE_MODULES
    from stagegraph.stages.common.costmodel import COST_MODELS, cost_model_factory
    from stagegraph.stages.common.runtime_libs import RUNTIME_LIBRARIES

    assert {"heuristic", "analytical", "tuned", "fixed"} <= set(COST_MODELS.names())
    assert COST_MODELS.origin("tuned") == "stagegraph.stages.x86.costmodels:tuned"
    assert cost_model_factory("analytical").kind == "params"
    assert {"stagegraph.stages.x86.params_stage", "stagegraph.stages.x86.costmodels"} <= set(
        STAGE_MODULES.names()
    )
    assert RUNTIME_LIBRARIES.origin("libmvec").startswith("stagegraph.stages.x86.")


def test_core_and_the_common_stages_name_no_target():
    """Not even as a string (import-linter sees imports only)."""
    root = Path(__file__).parents[1] / "stagegraph"
    for folder in ("core", "stages/common", "stages/analysis"):
        for path in (root / folder).rglob("*.py"):
            assert "stages.x86" not in path.read_text(), path


def test_a_registered_target_resolves_by_name():
    from stagegraph.stages.target import TARGETS, detect_target, resolve_target

    TARGETS.register("test-one-core", lambda name: detect_target().model_copy(
        update={"name": name, "cores": 1}))  # fmt: skip
    assert resolve_target("test-one-core").cores == 1
    with pytest.raises(UnknownTargetError, match="did you mean 'test-one-core'"):
        resolve_target("test-one-cor")
