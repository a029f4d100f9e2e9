"""Graph construction, validation errors (all at once, with text), and composition."""

from __future__ import annotations

from typing import Optional

import pytest

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import Module, TensorModule
from stagegraph.core.stage import _ports_from_hints
from stagegraph.errors import (
    AmbiguousTagError,
    CycleError,
    DoublyConnectedPortError,
    DuplicateStageError,
    EmptyGraphError,
    InvalidGraphError,
    PortTypeError,
    UnconnectedPortError,
    UnknownPortError,
    UnknownStageError,
    UnknownTagError,
)
from tests.stages_for_tests import (
    TileParams,
    analyze,
    bufferize,
    passthrough,
    schedule,
    select,
    select_other,
)

PAYLOAD = GraphInput("payload", Module["tensor"], frozenset({"input"}))
EDGES = [
    "payload -> analyze.module",
    "analyze.facts -> select.facts",
    "select.params -> schedule.params",
    "payload -> schedule.module",
    "schedule.module -> bufferize.module",
]


def make(stages=None, edges=None, **kw) -> Graph:
    stages = stages or [
        analyze("analyze"),
        select("select"),
        schedule("schedule", tags={"scheduled"}),
        bufferize("bufferize", tags={"bufferized"}),
    ]
    return Graph("g", stages, EDGES if edges is None else edges, [PAYLOAD], **kw)


def test_valid_graph_orders_topologically():
    graph = make()
    order = graph.order()
    assert order[0] == "payload"
    assert order.index("select") < order.index("schedule") < order.index("bufferize")
    assert graph.tags == {
        "input": ["payload"],
        "scheduled": ["schedule"],
        "bufferized": ["bufferize"],
    }


def test_port_type_mismatch_names_both_stages_ports_and_types():
    stages = [
        analyze("analyze"),
        select_other("select"),
        schedule("schedule"),
        bufferize("bufferize"),
    ]
    with pytest.raises(PortTypeError) as info:
        make(stages)
    assert isinstance(info.value, TypeError)
    text = str(info.value)
    assert "stage 'select' output 'params' (OtherParams)" in text
    assert "stage 'schedule' input 'params' (TileParams)" in text


def test_module_level_mismatch():
    edges = [*EDGES[:4], "schedule.module -> bufferize.module", "bufferize.module -> again.module"]
    stages = [
        analyze("analyze"),
        select("select"),
        schedule("schedule"),
        bufferize("bufferize"),
        bufferize("again"),
    ]
    with pytest.raises(
        PortTypeError, match=r"\(Module\[buffer\]\) cannot feed .* \(Module\[tensor\]\)"
    ):
        make(stages, edges)


def test_duplicate_names():
    stages = [
        analyze("analyze"),
        analyze("analyze"),
        select("select"),
        schedule("schedule"),
        bufferize("bufferize"),
    ]
    with pytest.raises(DuplicateStageError, match="duplicate stage name 'analyze'"):
        make(stages)


def test_cycle_is_listed():
    stages = [schedule("a"), schedule("b"), select("select"), analyze("analyze")]
    edges = [
        "payload -> analyze.module",
        "analyze.facts -> select.facts",
        "select.params -> a.params",
        "select.params -> b.params",
        "a.module -> b.module",
        "b.module -> a.module",
    ]
    with pytest.raises(CycleError, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        make(stages, edges)


def test_unconnected_input():
    edges = [e for e in EDGES if e != "select.params -> schedule.params"]
    with pytest.raises(
        UnconnectedPortError, match="stage 'schedule' input 'params' .* not connected"
    ):
        make(edges=edges)


def test_doubly_connected_input():
    edges = [*EDGES, "analyze.facts -> select.facts"]  # duplicates collapse: use a second source
    stages = [
        analyze("analyze"),
        analyze("analyze2"),
        select("select"),
        schedule("schedule"),
        bufferize("bufferize"),
    ]
    edges = [*EDGES, "payload -> analyze2.module", "analyze2.facts -> select.facts"]
    with pytest.raises(DoublyConnectedPortError, match="input 'facts' is connected 2 times"):
        make(stages, edges)


def test_unknown_names_suggest():
    edges = [*EDGES[:-1], "schedul.module -> bufferize.module"]
    with pytest.raises(UnknownStageError, match="unknown stage 'schedul'.*did you mean 'schedule'"):
        make(edges=edges)
    edges = [*EDGES[:-1], "schedule.modul -> bufferize.module"]
    with pytest.raises(UnknownPortError, match="no output port 'modul' \\(did you mean 'module'"):
        make(edges=edges)


def test_all_problems_in_one_error():
    stages = [
        analyze("analyze"),
        select_other("select"),
        schedule("schedule"),
        bufferize("bufferize"),
    ]
    edges = [e for e in EDGES if e != "schedule.module -> bufferize.module"]
    with pytest.raises(InvalidGraphError) as info:
        make(stages, edges)
    kinds = {type(p) for p in info.value.problems}
    assert kinds == {PortTypeError, UnconnectedPortError}
    assert "2 problems" in str(info.value)


def test_empty_graph():
    with pytest.raises(EmptyGraphError, match="graph 'g' has no stages"):
        Graph("g", [], [], [PAYLOAD])


def test_graph_is_immutable():
    graph = make()
    with pytest.raises(TypeError):
        graph.stages["x"] = analyze("x")  # type: ignore[index]
    with pytest.raises(Exception):  # noqa: B017 - networkx raises NetworkXError
        graph.network.add_node("x")


def test_replace_type_checked():
    graph = make()
    swapped = graph.replace("select", select("select", factor=2))
    assert swapped.stages["select"].config.factor == 2
    assert graph.stages["select"].config.factor == 1  # original unchanged
    with pytest.raises(PortTypeError, match="OtherParams"):
        graph.replace("select", select_other("other"))


def test_replace_keeps_tags_and_unknown_stage():
    graph = make()
    assert graph.replace("schedule", schedule("x")).stages["schedule"].tags == {"scheduled"}
    with pytest.raises(UnknownStageError, match="did you mean 'select'"):
        graph.replace("selct", select("select"))


def test_splice_after_tag_rewires_consumers():
    graph = make()
    spliced = graph.splice(after="scheduled", stage=passthrough("extra"))
    assert ("schedule", "extra") in {(e.src, e.dst) for e in spliced.edges}
    assert ("extra", "bufferize") in {(e.src, e.dst) for e in spliced.edges}
    assert ("schedule", "bufferize") not in {(e.src, e.dst) for e in spliced.edges}


def test_splice_after_graph_input():
    spliced = make().splice(after="input", stage=passthrough("wrap"))
    assert {(e.src, e.dst) for e in spliced.edges} >= {("payload", "wrap"), ("wrap", "analyze")}


def test_unknown_and_ambiguous_tags():
    graph = make()
    with pytest.raises(
        UnknownTagError, match=r"no tag 'bufferise' \(did you mean 'bufferized'\?\)"
    ):
        graph.node_for_tag("bufferise")
    stages = [
        analyze("analyze"),
        select("select"),
        schedule("schedule", tags={"x"}),
        bufferize("bufferize", tags={"x"}),
    ]
    with pytest.raises(AmbiguousTagError, match="tag 'x' is on several stages"):
        make(stages).node_for_tag("x")


def test_select_until_tag():
    sub = make().select(until="scheduled")
    assert set(sub.stages) == {"analyze", "select", "schedule"}
    assert "bufferize" not in sub.order()


def test_default_splice_must_exist():
    with pytest.raises(UnknownTagError, match="default splice tag 'bufferised'"):
        make(default_splice="bufferised")


def _chain(length: int) -> Graph:
    """payload -> s0 -> s1 -> ... : ``length`` pass-through stages in a line."""
    stages = [passthrough(f"s{i}") for i in range(length)]
    edges = ["payload -> s0.module"]
    edges += [f"s{i}.module -> s{i + 1}.module" for i in range(length - 1)]
    return Graph("chain", stages, edges, [PAYLOAD])


def _build_and_query_seconds(length: int) -> float:
    """Build (validate) a chain, order it and ask every node's edges and the last node's
    ancestors, as the engine does on each run. (The garbage collector is held off: its full
    passes cost more the more objects are alive, which is not the graph's doing.)"""
    import gc
    import time

    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        graph = _chain(length)
        order = graph.order()
        for node in order:
            graph.in_edges(node)
            graph.out_edges(node)
        graph.ancestors(order[-1])
        return time.perf_counter() - start
    finally:
        gc.enable()


def test_graph_queries_are_answered_from_an_index():
    graph = _chain(5)
    assert [str(e) for e in graph.in_edges("s3")] == ["s2.module -> s3.module"]
    assert [str(e) for e in graph.out_edges("payload")] == ["payload -> s0.module"]
    assert graph.out_edges("s4") == [] and graph.in_edges("nowhere") == []
    assert graph.ancestors("s2") == {"payload", "s0", "s1"}
    assert graph.descendants("s2") == {"s3", "s4"}


def test_validation_and_queries_scale_linearly():
    """Four times the stages cost about four times the time (a scan of every edge per node
    would cost sixteen): the ratio, not an absolute time, so a slow machine passes too."""
    small, large = 2000, 8000
    assert len(_chain(large).order()) == large + 1
    # Interleaved, best of five each: a load that comes and goes slows both sizes alike.
    times: dict[int, list[float]] = {small: [], large: []}
    for _ in range(5):
        for length in (small, large):
            times[length].append(_build_and_query_seconds(length))
    ratio = min(times[large]) / min(times[small])
    assert ratio < 8, f"{large} stages took {ratio:.1f}x the time of {small}"


def _consume_pep604(module: TensorModule, params: TileParams | None = None) -> TensorModule:
    return module


def _consume_optional(module: TensorModule, params: Optional[TileParams] = None) -> TensorModule:  # noqa: UP045
    return module


@pytest.mark.parametrize("fn", [_consume_pep604, _consume_optional])
def test_optional_input_port_accepts_both_union_spellings(fn):
    """``X | None = None`` and ``Optional[X] = None`` both declare an optional port of type
    X (before, the PEP 604 spelling was refused as 'needs a port type hint')."""
    inputs, _, _ = _ports_from_hints(fn, "test.optional")
    port = {p.name: p for p in inputs}["params"]
    assert port.optional and port.type is TileParams
