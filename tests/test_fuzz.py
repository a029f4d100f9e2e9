"""Fuzzing: graph files and params, valid or not, load or fail with the project's errors."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stagegraph.core.graph import Graph
from stagegraph.core.graphfile import graph_from_text
from stagegraph.errors import StagegraphError

NAMES = st.sampled_from(["payload", "load", "buf", "low", "x", "a.b", "", "emit"])
FACTORIES = st.sampled_from(
    ["verify", "bufferize", "lower_to_llvm", "linalg_to_loops", "jit", "pipeline", "transform",
     "nope", "os:system", "stagegraph.core.stage:stage", ""]
)  # fmt: skip
PORTS = st.sampled_from(["module", "facts", "params", "value", "binary", "x"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8),
                    st.floats(allow_nan=True))  # fmt: skip
CONFIG = st.dictionaries(st.sampled_from(["pipeline", "opt_level", "text", "file", "zz"]), SCALARS,
                         max_size=3)  # fmt: skip
EDGE = st.one_of(
    st.builds(lambda a, p, b, q: f"{a}.{p} -> {b}.{q}", NAMES, PORTS, NAMES, PORTS),
    st.builds(lambda a, b, q: f"{a} -> {b}.{q}", NAMES, NAMES, PORTS),
    st.text(max_size=12),
)
STAGE = st.fixed_dictionaries(
    {"name": NAMES, "factory": FACTORIES},
    optional={"config": CONFIG, "tags": st.lists(st.sampled_from(["t", "input", ""]), max_size=2),
              "junk": SCALARS},
)  # fmt: skip
GRAPH = st.fixed_dictionaries(
    {"name": st.text(max_size=6), "stages": st.lists(STAGE, max_size=4)},
    optional={
        "edges": st.lists(EDGE, max_size=5),
        "inputs": st.dictionaries(NAMES, st.fixed_dictionaries(
            {"type": st.sampled_from(["module:tensor", "module:llvm", "module:x", "os:path",
                                      "stagegraph.stages.target:Target"])}), max_size=2),
        "default_splice": st.sampled_from(["t", "input", "zz"]),
    },
)  # fmt: skip


def _loads_or_project_error(text: str) -> None:
    try:
        graph = graph_from_text(text, "fuzz.yaml")
    except StagegraphError:
        return
    assert isinstance(graph, Graph)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(GRAPH)
def test_graph_files_load_or_raise_project_errors(data):
    _loads_or_project_error(yaml.safe_dump(data))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_is_never_a_crash(text):
    _loads_or_project_error(text)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["m", "n", "k", "dtype", "seed", "q"]),
        st.one_of(st.integers(-3, 300), st.text(max_size=5)),
        max_size=4,
    )
)
def test_workload_params_parse_or_raise_project_errors(values):
    from stagegraph.workload import parse_workload

    spec = "matmul:" + ",".join(f"{k}={v}" for k, v in values.items()) if values else "matmul"
    try:
        workload = parse_workload(spec)
    except StagegraphError:
        return
    assert workload.params.m > 0


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["overrides", "threads", "zz"]),
                       st.one_of(SCALARS, st.dictionaries(st.text(max_size=4), SCALARS)),
                       max_size=3))  # fmt: skip
def test_stage_configs_validate_or_raise_project_errors(values):
    from stagegraph.core.stage import StageFactory
    from stagegraph.stages.common.costmodel import CostModelConfig

    factory = StageFactory("fuzz", "params", lambda: None, (), (), CostModelConfig, False)
    try:
        factory(config=values)
    except StagegraphError:
        return
