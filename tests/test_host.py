"""Host facts recorded in benchmark reports: CPU model, ISA tier, OpenBLAS, its overrides.

No test sets ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` in the process: the environment
handling is checked on plain dicts.
"""

from __future__ import annotations

import pytest

from stagegraph.app.host import (
    REMOVED_MARKER,
    cpu_model,
    describe,
    host_info,
    isa_tier,
    openblas_overrides,
    removed_note,
    without_openblas_overrides,
)

SSE4 = {"sse", "sse2", "sse3", "ssse3", "sse4_1", "sse4_2"}
AVX2 = SSE4 | {"avx", "avx2", "fma", "f16c"}  # this project's CI VM (AMD EPYC, Zen 2-like)
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    ("isa", "tier"),
    [
        (AVX2, "x86-64-v3 (avx2, fma)"),
        (AVX512, "x86-64-v4 (avx512f, avx512bw, avx512cd, avx512dq, avx512vl)"),
        (AVX512 | {"avx512bf16", "amx_bf16"},
         "x86-64-v4 (avx512f, avx512bw, avx512cd, avx512dq, avx512vl, avx512bf16, amx_bf16)"),
        (AVX2 | {"avx512f"}, "x86-64-v3 (avx2, fma)"),  # avx512f alone is not v4 (KNL)
        (AVX512 - {"fma"}, "x86-64-v2 (sse3, sse4_1, sse4_2, ssse3)"),  # v4 needs all of v3
        (SSE4, "x86-64-v2 (sse3, sse4_1, sse4_2, ssse3)"),
        ({"sse", "sse2"}, "x86-64"),
        (set(), "x86-64"),
    ],
)  # fmt: skip
def test_tier_of_pinned_isa_sets(isa, tier):
    assert isa_tier(frozenset(isa)) == tier


def test_tier_off_x86_lists_the_features():
    assert isa_tier(frozenset({"sve", "asimd"}), "aarch64") == "aarch64 (asimd, sve)"
    assert isa_tier(frozenset(), "aarch64") == "aarch64"


def test_cpu_model_is_the_first_model_name():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t: sse\n\nmodel name\t: other\n"
    assert cpu_model(text) == "AMD EPYC 7B12"
    assert cpu_model("processor : 0\n") == "unknown"


def test_host_info_names_the_host_and_its_openblas():
    host = host_info()
    assert host.cpu_model and host.target.startswith(("x86-64", "aarch64"))
    assert host.blas is not None and host.blas.internal_api == "openblas"
    assert host.blas.architecture and host.blas.num_threads >= 1
    assert host.cpu_model in describe(host) and host.blas.architecture in describe(host)


def test_overrides_are_removed_and_named():
    env = {"PATH": "/bin", "OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_L2_SIZE": "262144"}
    assert openblas_overrides(env) == {"OPENBLAS_CORETYPE": "Sandybridge",
                                       "OPENBLAS_L2_SIZE": "262144"}  # fmt: skip
    clean = without_openblas_overrides(env)
    assert clean is not None
    assert "OPENBLAS_CORETYPE" not in clean and "OPENBLAS_L2_SIZE" not in clean
    assert clean["PATH"] == "/bin"
    note = removed_note(clean)
    assert note and "OPENBLAS_CORETYPE=Sandybridge" in note and "OPENBLAS_L2_SIZE" in note


def test_nothing_to_remove_means_no_restart_and_no_note():
    assert without_openblas_overrides({"PATH": "/bin"}) is None
    assert removed_note({"PATH": "/bin"}) is None
    assert REMOVED_MARKER.startswith("STAGEGRAPH_")
