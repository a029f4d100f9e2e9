"""Buffers that cannot fit are refused before compiling, from the memory this process has."""

from __future__ import annotations

import pytest

from stagegraph.app import memory_budget
from stagegraph.errors import InsufficientMemoryError
from stagegraph.workload import parse_workload


def test_needed_bytes_are_inputs_outputs_and_a_reference_copy():
    workload = parse_workload("matmul:m=2,n=3,k=4")
    assert memory_budget.needed_bytes(workload) == (2 * 4 + 4 * 3) * 4 + 2 * (2 * 3) * 4


def test_meminfo_and_cgroup_v1_and_v2_are_read(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    monkeypatch.setattr(memory_budget, "MEMINFO", meminfo)
    assert memory_budget._meminfo() == (2048 * 1024, "MemAvailable in /proc/meminfo")
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1000000\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("400000\n")
    monkeypatch.setattr(memory_budget, "CGROUP", v1)
    assert memory_budget._cgroup()[0] == 600000
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # no limit
    assert memory_budget._cgroup() is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("5000\n")
    (v2 / "memory.current").write_text("1000\n")
    monkeypatch.setattr(memory_budget, "CGROUP", v2)
    assert memory_budget._cgroup()[0] == 4000


def test_refusal_names_bytes_needed_and_available(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: (1000, "a test limit"))
    with pytest.raises(InsufficientMemoryError) as error:
        memory_budget.check_fits(parse_workload("matmul:m=8,n=8,k=8"))
    assert "needs at least 0.0 GiB (1,024 bytes)" in str(error.value)
    assert "only 0.0 GiB (1,000 bytes) is available (a test limit)" in str(error.value)
    memory_budget.check_fits(parse_workload("matmul:m=2,n=2,k=2"))  # 64 bytes fit


def test_emitting_a_file_needs_no_buffers(monkeypatch, tmp_path):
    from stagegraph.app.run import run_report
    from stagegraph.app.session import Session, SessionRequest

    monkeypatch.setattr(memory_budget, "available_bytes", lambda: (10, "a test limit"))
    request = SessionRequest(graph="naive", workload="matmul:m=8,n=8,k=8", emit="object",
                             output=str(tmp_path / "mm.o"))  # fmt: skip
    with Session(request, cache=False) as session:
        report = run_report(session)
    assert report.verified is None and (tmp_path / "mm.o").is_file()
    jit = request.model_copy(update={"emit": "jit"})
    with Session(jit, cache=False) as session, pytest.raises(InsufficientMemoryError):
        run_report(session)
