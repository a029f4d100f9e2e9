"""Named targets: levels and CPU names as facts, code built for them, refused where it cannot
run; bf16 on hosts without native conversions; JIT link failures reported, never a crash.

Tests that need a tier the host may lack only emit and inspect code (objdump and the IR's
vector types); nothing here runs code built for another machine.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from stagegraph.app.graph_options import with_target
from stagegraph.cli.main import main
from stagegraph.core.catalog import load_graph
from stagegraph.core.engine import Engine
from stagegraph.errors import UnknownTargetError
from stagegraph.stages.target import detect_target, resolve_target
from stagegraph.stages.target_names import NAMED, llvm_features
from stagegraph.workload import from_bf16, parse_workload, to_bf16

SMALL = "matmul:m=24,n=40,k=16"


@pytest.mark.parametrize(
    ("name", "bits", "registers", "tier"),
    [
        ("x86-64-v2", 128, 16, "x86-64-v2"),
        ("x86-64-v3", 256, 16, "x86-64-v3"),
        ("x86-64-v4", 512, 32, "x86-64-v4"),
        ("znver3", 256, 16, "x86-64-v3"),
        ("znver4", 512, 32, "x86-64-v4"),
        ("SapphireRapids", 512, 32, "x86-64-v4"),
    ],
)
def test_named_target_facts(name, bits, registers, tier):
    target = resolve_target(name)
    assert target.name == name.lower() and target.cpu == name.lower()
    assert (target.vector_bits, target.vector_registers, target.tier) == (bits, registers, tier)
    assert target.cores == detect_target().cores  # a name implies no core count
    assert target.l1d_bytes <= target.l2_bytes <= target.l3_bytes


def test_zen1_and_zen4_name_their_narrow_fma_units():
    """``--target znver1`` gives what a Zen 1 host gives: 256-bit vectors on 128-bit FMA
    units, so half the FMA lanes per cycle of ``x86-64-v3``'s full-width units. Zen 4 has
    512-bit vectors on 256-bit units: the FMA lanes per cycle of AVX2, half of
    ``x86-64-v4``'s (Intel's two 512-bit units)."""
    zen1, zen4 = resolve_target("znver1"), resolve_target("znver4")
    v3, v4 = resolve_target("x86-64-v3"), resolve_target("x86-64-v4")
    assert (zen1.vector_bits, zen1.fma_bits, zen1.fma_lanes_per_cycle()) == (256, 128, 8)
    assert (v3.vector_bits, v3.fma_bits, v3.fma_lanes_per_cycle()) == (256, None, 16)
    assert (zen4.vector_bits, zen4.fma_bits, zen4.fma_lanes_per_cycle()) == (512, 256, 16)
    assert (v4.vector_bits, v4.fma_bits, v4.fma_lanes_per_cycle()) == (512, None, 32)


def test_feature_sets_follow_the_levels():
    v3, v4, zen4 = (resolve_target(n).isa for n in ("x86-64-v3", "x86-64-v4", "znver4"))
    assert {"avx2", "fma", "f16c"} <= v3 and "avx512f" not in v3
    assert v3 < v4 and {"avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= v4
    assert "avx512bf16" in zen4 and "amx_tile" not in zen4
    assert "+amx-bf16" in llvm_features(resolve_target("sapphirerapids").isa)
    assert "-avx512f" in llvm_features(v3) and "+avx2" in llvm_features(v3)


def test_host_and_environment_default(monkeypatch):
    assert resolve_target("host") is detect_target()
    monkeypatch.setenv("STAGEGRAPH_TARGET", "x86-64-v3")
    assert resolve_target(None).name == "x86-64-v3"
    monkeypatch.delenv("STAGEGRAPH_TARGET")
    assert resolve_target(None) is detect_target()


def test_unknown_target_is_named_with_suggestions(capsys):
    with pytest.raises(UnknownTargetError, match="did you mean 'znver3'"):
        resolve_target("znver33")
    assert main(["run", "x86", SMALL, "--target", "skylake-avx5112"]) == 2
    assert "unknown target 'skylake-avx5112'" in capsys.readouterr().err


def test_naive_graph_refuses_a_named_target(capsys):
    assert main(["run", "naive", SMALL, "--target", "x86-64-v3"]) == 2
    assert "no target stage" in capsys.readouterr().err


@pytest.mark.parametrize(("target", "lanes"), [("x86-64-v3", 8), ("x86-64-v4", 16)])
def test_cost_model_plans_for_the_targets_vector_width(target, lanes):
    graph = with_target(load_graph("x86"), target)
    params = Engine().run(graph, parse_workload(SMALL), until="select").params
    (matmul,) = params.matmul
    assert matmul.vector_width == lanes and matmul.reg_n % lanes == 0
    assert matmul.vector_registers == (32 if lanes == 16 else 16)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
@pytest.mark.parametrize(("target", "wide", "absent"), [("x86-64-v3", "ymm", "zmm"),
                                                       ("x86-64-v4", "zmm", None)])  # fmt: skip
def test_emitted_object_uses_the_targets_registers(tmp_path, capsys, target, wide, absent):
    obj = tmp_path / "mm.o"
    code = main(["run", "x86", SMALL, "--target", target, "--emit", "object", "-o", str(obj)])
    assert code == 0, capsys.readouterr().err
    listing = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True).stdout
    assert "vfmadd" in listing and f"%{wide}" in listing
    if absent:
        assert f"%{absent}" not in listing  # a wider host's ISA does not leak in


def test_running_code_the_host_cannot_execute_is_refused(capsys):
    host = detect_target().isa
    foreign = next((n for n, m in sorted(NAMED.items()) if not m.isa <= host), None)
    if foreign is None:
        pytest.skip("this host runs every named target")
    missing = sorted(NAMED[foreign].isa - host)
    assert main(["run", "x86", SMALL, "--target", foreign]) == 2
    err = capsys.readouterr().err
    assert "cannot run on this host" in err and ", ".join(missing) in err


def test_pinned_to_avx2_runs_and_verifies_on_any_v3_host(capsys):
    if not resolve_target("x86-64-v3").isa <= detect_target().isa:
        pytest.skip("host is below x86-64-v3")
    code = main(["run", "x86", "mlp:batch=4,widths=8-16-8", "--target", "x86-64-v3"])
    assert code == 0, capsys.readouterr().err
    assert "VERIFIED" in capsys.readouterr().out


TRUNCATE = """
func.func @main(%x: tensor<16xf32>) -> tensor<16xbf16> {
  %e = tensor.empty() : tensor<16xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<16xf32>) outs(%e : tensor<16xbf16>) {
    ^bb0(%a: f32, %o: bf16):
      %t = arith.truncf %a : f32 to bf16
      linalg.yield %t : bf16
  } -> tensor<16xbf16>
  return %r : tensor<16xbf16>
}
"""


# Ties, values that round up into the next binade, infinities, NaN, a subnormal (1e-40).
TRUNCATION_INPUTS = np.array(
    [1.0, 1.00390625, 1.01171875, 1.0078125, -2.5, 3.0e38, 3.4e38, np.inf, -np.inf,
     np.nan, 1e-40, -0.0, 65504.0, 0.1, -0.3, 7.0], dtype=np.float32,
)  # fmt: skip


def truncate(graph_name: str, target: str | None) -> np.ndarray:
    """TRUNCATE's bf16 bits, built by the graph for the target (None: the graph's own)."""
    graph = with_target(load_graph(graph_name), target)
    result = Engine().run(graph, {"payload": TRUNCATE})
    (out,) = result.binary.call("main", [TRUNCATION_INPUTS])
    return out.view(np.uint16)


def assert_rounded_to_nearest_even(bits: np.ndarray, subnormals_flushed: bool) -> None:
    expected = to_bf16(TRUNCATION_INPUTS)
    if subnormals_flushed:  # to zero, keeping the sign
        subnormal = (TRUNCATION_INPUTS != 0) & (
            np.abs(TRUNCATION_INPUTS) < np.finfo(np.float32).tiny
        )
        expected = np.where(subnormal, expected & 0x8000, expected)
    finite = ~np.isnan(TRUNCATION_INPUTS)
    assert np.array_equal(bits[finite], expected[finite])
    assert np.isnan(from_bf16(bits)[~finite]).all()


@pytest.mark.parametrize(("graph", "target"), [("naive", None), ("x86", "x86-64-v3")])
def test_bf16_truncation_rounds_to_nearest_even_on_any_host(graph, target):
    """Without native bf16 instructions (the naive graph; x86 pinned to AVX2) the conversion
    is expanded or calls the project's builtins: round to nearest even, subnormals kept."""
    assert_rounded_to_nearest_even(truncate(graph, target), subnormals_flushed=False)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
def test_native_bf16_truncation_flushes_subnormal_inputs(tmp_path, capsys):
    """AVX512_BF16's ``vcvtneps2bf16`` rounds to nearest even but treats subnormal inputs as
    zero whatever MXCSR says: the x86 graph on such a target uses it (the fast path) and
    keeps that behaviour. Any host checks the instruction is emitted; a host that has it
    also runs the code."""
    payload = tmp_path / "truncate.mlir"
    payload.write_text(TRUNCATE)
    obj = tmp_path / "truncate.o"
    code = main(["run", "x86", str(payload), "--target", "cooperlake", "--emit", "object",
                 "-o", str(obj)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    listing = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True).stdout
    assert "vcvtneps2bf16" in listing
    if resolve_target("cooperlake").isa <= detect_target().isa:
        assert_rounded_to_nearest_even(truncate("x86", "cooperlake"), subnormals_flushed=True)


CALLS_UNDEFINED = """
func.func private @helper_nobody_defines(f32) -> f32
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<4xf32>) outs(%e : tensor<4xf32>) {
    ^bb0(%a: f32, %o: f32):
      %y = func.call @helper_nobody_defines(%a) : (f32) -> f32
      linalg.yield %y : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def test_unresolvable_symbol_is_an_error_before_any_call():
    """The JIT returns no address when linking fails: an EmitError naming the symbol, found
    before the first call (never a jump to address 0)."""
    from stagegraph.runtime.jit import EmitError, JitBinary

    engine = Engine()
    lowered = engine.run(load_graph("naive"), {"payload": CALLS_UNDEFINED}, until="lower").module
    with pytest.raises(EmitError, match="helper_nobody_defines"):
        JitBinary(lowered.ir)
