"""A graph keeps the name it is registered under, also when it is built from another graph
(``replace``): reports, tuning keys and ``--vs`` comparisons tell the two apart."""

from __future__ import annotations

import stagegraph as sg
from stagegraph.app.run import run_report
from stagegraph.app.session import Session, SessionRequest
from stagegraph.core.catalog import load_graph


def _smalltile() -> sg.Graph:
    x86 = load_graph("x86")
    # 48: a multiple of the register-tile rows of every tier (6 on AVX2, 8 and 16 on AVX-512)
    return x86.with_config("select", overrides={"tile_m": 48})


sg.register_graph("x86-smalltile-names-test", _smalltile)


def test_registered_derived_graph_keeps_its_name():
    graph = load_graph("x86-smalltile-names-test")
    assert graph.name == "x86-smalltile-names-test"
    assert load_graph("x86").name == "x86"
    assert graph.stages["select"].config.overrides == {"tile_m": 48}


def test_run_report_names_the_registered_graph():
    request = SessionRequest(graph="x86-smalltile-names-test", workload="matmul:m=8,n=8,k=8")
    with Session(request, cache=False) as session:
        report = run_report(session)
    assert report.graph == "x86-smalltile-names-test" and report.verified is True
    assert report.params["matmul"][0]["tile_m"] == 48
