"""Workloads: spec parsing, payloads that JIT to verified results, the .mlir-file workload."""

from __future__ import annotations

import ctypes
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stagegraph.workload import (
    PayloadError,
    ReferenceUnavailableError,
    UnknownWorkloadError,
    Workload,
    WorkloadParamError,
    from_bf16,
    list_workloads,
    parse_workload,
    to_bf16,
)
from tests.conftest import KERNELBENCH

TINY = """\
func.func @scale(%x: tensor<3x4xf32>, %y: tensor<4xf32>) -> tensor<3x4xf32> {
  %0 = tensor.empty() : tensor<3x4xf32>
  %1 = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
      affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%x, %y : tensor<3x4xf32>, tensor<4xf32>) outs(%0 : tensor<3x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %2 = arith.mulf %a, %b : f32
    linalg.yield %2 : f32
  } -> tensor<3x4xf32>
  return %1 : tensor<3x4xf32>
}
"""


def jit_run(workload: Workload, inputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Test-only: naive lowering (loops) + ExecutionEngine; results come back as out-params."""
    from stagegraph.mlir.bindings import execution_engine, ir, new_context, passmanager, runtime
    from stagegraph.stages.common.lowering import BUFFERIZE, LINALG_TO_LOOPS, LOWER_TO_LLVM

    context = new_context()
    module = workload.payload(context)
    with context:
        for op in module.body.operations:
            if op.name.value == workload.entry:
                op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        pipeline = f"builtin.module({BUFFERIZE},{LINALG_TO_LOOPS},{LOWER_TO_LLVM})"
        passmanager.PassManager.parse(pipeline).run(module.operation)
        engine = execution_engine.ExecutionEngine(module, opt_level=2)
    outputs = workload.empty_outputs()
    arrays = (workload.inputs() if inputs is None else inputs) + outputs
    descriptors = [runtime.get_ranked_memref_descriptor(a) for a in arrays]
    engine.invoke(workload.entry, *[ctypes.pointer(ctypes.pointer(d)) for d in descriptors])
    return outputs


# ---------------------------------------------------------------- spec parsing


def test_registry_lists_python_workloads() -> None:
    assert {"matmul", "mlp", "ff"} <= set(list_workloads())


def test_bare_name_uses_defaults_and_spec_is_canonical() -> None:
    w = parse_workload("matmul")
    assert (w.params.m, w.params.n, w.params.k, w.params.dtype) == (256, 256, 256, "f32")
    assert w.spec == "matmul:m=256,n=256,k=256,dtype=f32,seed=0"
    assert parse_workload(w.spec).spec == w.spec


def test_spec_with_values_and_lists() -> None:
    w = parse_workload("mlp:batch=8, widths=16-32-4")
    assert w.params.batch == 8 and w.params.widths == [16, 32, 4]
    assert w.spec == "mlp:batch=8,widths=16-32-4,seed=0"
    assert parse_workload("matmul:dtype=bf16,m=3").params.dtype == "bf16"


def test_unknown_workload_suggests() -> None:
    with pytest.raises(UnknownWorkloadError) as info:
        parse_workload("matmull:m=4")
    assert str(info.value).startswith("unknown workload 'matmull' (did you mean 'matmul'?); known:")
    assert isinstance(info.value, KeyError)


def test_unknown_key_suggests() -> None:
    with pytest.raises(
        WorkloadParamError,
        match=r"workload 'matmul' has no parameter 'kk' \(did you mean 'k'\?\); "
        r"parameters: m, n, k, dtype, seed",
    ):
        parse_workload("matmul:kk=4")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("matmul:m=abc", r"invalid value 'abc' for parameter 'm'.*\(expected int > 0\)"),
        ("matmul:m=0", r"invalid value '0' for parameter 'm': Input should be greater than 0"),
        ("matmul:dtype=f64", r"invalid value 'f64' for parameter 'dtype'.*one of 'f32', 'bf16'"),
        ("mlp:widths=8-x", r"invalid value '8-x' for parameter 'widths'.*joined by '-'"),
        ("mlp:widths=8", r"invalid value '8' for parameter 'widths'.*at least 2"),
        ("matmul:m", r"expected key=value, got 'm'"),
        ("matmul:m=2,m=3", r"parameter 'm' given twice"),
    ],
)
def test_bad_values_name_key_value_and_expectation(spec: str, expected: str) -> None:
    with pytest.raises(WorkloadParamError, match=expected):
        parse_workload(spec)


def test_keyword_construction_is_validated() -> None:
    cls = type(parse_workload("ff"))
    assert cls(m=2, n=3, k=4).spec == "ff:m=2,n=3,k=4,seed=0"
    with pytest.raises(WorkloadParamError, match="workload 'ff' has no parameter 'q'"):
        cls(q=1)


def test_importing_workloads_does_not_import_mlir() -> None:
    code = (
        "import sys; from stagegraph.workload import parse_workload, list_workloads;"
        "list_workloads(); w = parse_workload('mlp:batch=2,widths=3-4');"
        "w.inputs(); w.reference(); w.complexity;"
        "assert not [m for m in sys.modules if 'torch_mlir' in m or m.startswith('mlir')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_numpy_only_workload_modules_import_without_pydantic() -> None:
    """The GPU machine has numpy but no pydantic or MLIR: the verification rule and the
    problem-file reader import there as plain modules of the package (its ``__init__``
    resolves the re-exported names on first use)."""
    code = (
        "import sys\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pydantic', 'torch_mlir', 'mlir'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Blocker())\n"
        "from stagegraph.workload import criterion, torch_source\n"
        "print(criterion.rms.__name__, torch_source.load_problem_file.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["rms", "load_problem_file"]


def test_workload_package_names_resolve_lazily() -> None:
    import stagegraph.workload as package
    from stagegraph.workload.verify import Verdict

    assert package.Verdict is Verdict
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = package.nothing


# ---------------------------------------------------------------- generated workloads


@pytest.mark.parametrize(
    "spec",
    [
        "matmul:m=100,n=37,k=53",
        "matmul:m=16,n=8,k=32,dtype=bf16",
        "matmul:m=9,n=5,k=131,dtype=bf16",
        "mlp:batch=6,widths=10-24-7",
        "mlp:batch=5,widths=33-17-9-3",
        "ff:m=12,n=37,k=21",
    ],
)
def test_payload_jits_to_verified_outputs(spec: str) -> None:
    w = parse_workload(spec)
    verdict = w.verify(jit_run(w))
    assert verdict.ok, verdict.message
    assert verdict.max_rel_error <= verdict.tolerance
    assert verdict.message.startswith(f"{w.spec}: ok")


def test_payload_is_fresh_each_call_and_named_main() -> None:
    from stagegraph.mlir.bindings import new_context

    w = parse_workload("matmul:m=4,n=5,k=6")
    context = new_context()
    first, second = w.payload(context), w.payload(context)
    assert first is not second
    with context:
        names = [op.name.value for op in first.body.operations]
        assert names == ["main"] and w.entry == "main"
        ops = [op.operation.name for op in first.body.operations[0].regions[0].blocks[0]]
    assert ops == ["tensor.empty", "arith.constant", "linalg.fill", "linalg.matmul", "func.return"]


def test_verify_rejects_wrong_outputs() -> None:
    w = parse_workload("matmul:m=7,n=6,k=5")
    good = [r.astype(np.float32) for r in w.reference()]
    assert w.verify(good).ok
    bad = good[0].copy()
    bad[3, 2] += 0.01
    verdict = w.verify([bad])
    assert not verdict.ok
    assert "output 0 differs" in verdict.message and "at index (3, 2)" in verdict.message
    assert verdict.max_abs_error == pytest.approx(0.01, rel=1e-3)
    assert "shape (6, 7), expected (7, 6)" in w.verify([good[0].T.copy()]).message
    assert "dtype float64, expected float32" in w.verify(w.reference()).message
    assert "expected 1 outputs, got 0" in w.verify([]).message
    nan = good[0].copy()
    nan[0, 0] = np.nan
    assert "at (0, 0): got nan" in w.verify([nan]).message


def test_tolerance_scales_with_dtype_and_reduction() -> None:
    from stagegraph.workload import TensorSpec

    short, long = parse_workload("matmul:k=16"), parse_workload("matmul:k=1024")
    f32 = TensorSpec(shape=(1,), dtype="f32")
    assert long.tolerance(f32) == pytest.approx(8 * short.tolerance(f32))
    assert short.tolerance(TensorSpec(shape=(1,), dtype="bf16")) > 1000 * short.tolerance(f32)
    assert short.tolerance(TensorSpec(shape=(1,), dtype="i32")) == 0.0


def test_inputs_and_reference_are_cached_read_only_and_seeded() -> None:
    w = parse_workload("mlp:batch=3,widths=4-5")
    assert w.inputs() is w.inputs() and w.reference() is w.reference()
    assert not w.inputs()[0].flags.writeable
    again = parse_workload("mlp:batch=3,widths=4-5")
    assert all(np.array_equal(a, b) for a, b in zip(w.inputs(), again.inputs(), strict=True))
    other = parse_workload("mlp:batch=3,widths=4-5,seed=1")
    assert not np.array_equal(w.inputs()[0], other.inputs()[0])


def test_pickle_round_trip_drops_caches(tiny: Path) -> None:
    for w in (parse_workload("mlp:batch=3,widths=4-5,seed=2"), parse_workload(f"{tiny}:seed=3")):
        w.inputs()
        copy = pickle.loads(pickle.dumps(w))
        assert copy.spec == w.spec and copy._inputs is None
        assert np.array_equal(copy.inputs()[0], w.inputs()[0])


def test_session_keeps_then_releases_resources() -> None:
    w = parse_workload("matmul:m=2,n=2,k=2")
    with w.session() as s:
        assert s is w
        inputs = w.inputs()
        scratch = w.scratch_dir()
        assert scratch.is_dir() and w.inputs() is inputs
    assert not scratch.exists()
    assert w.inputs() is not inputs
    assert np.array_equal(w.inputs()[0], inputs[0])


def test_bf16_inputs_are_rounded_bits_and_reference_uses_them() -> None:
    assert to_bf16(np.array([1.0, 1.00390625, -2.5], np.float32)).tolist() == [
        0x3F80,
        0x3F80,  # halfway rounds to even
        0xC020,
    ]
    w = parse_workload("matmul:m=3,n=4,k=5,dtype=bf16")
    a, b = w.inputs()
    assert a.dtype == np.uint16 and w.empty_outputs()[0].dtype == np.float32
    want = from_bf16(a).astype(np.float64) @ from_bf16(b).astype(np.float64)
    np.testing.assert_array_equal(w.reference()[0], want)
    assert w.numpy_equivalent() is None


def test_complexity_and_numpy_equivalents() -> None:
    mm = parse_workload("matmul:m=2,n=3,k=4")
    assert mm.complexity.flops == 48 and mm.complexity.bytes_moved == 4 * (8 + 12 + 6)
    mlp = parse_workload("mlp:batch=2,widths=3-4-5")
    assert mlp.complexity.flops == 2 * 2 * (3 * 4 + 4) + 2 * 2 * (4 * 5 + 5)
    ff = parse_workload("ff:m=2,n=3,k=4")
    assert ff.complexity.flops == 4 * 24 + 4 * 6
    for w in (mm, mlp, ff):
        fn = w.numpy_equivalent()
        assert fn is not None
        assert w.verify([o.astype(np.float32) for o in fn(*w.inputs())]).ok
        assert w.requirements == []


# ---------------------------------------------------------------- .mlir files


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.mlir"
    path.write_text(TINY)
    return path


def test_mlir_file_with_npz(tiny: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([1, 2, 3, 4], np.float32)
    np.savez(tiny.with_suffix(".npz"), in0=x, in1=y, out0=x * y)
    w = parse_workload(str(tiny))
    assert (w.name, w.entry, w.spec) == ("tiny", "scale", str(tiny))
    np.testing.assert_array_equal(w.inputs()[0], x)
    assert w.complexity.flops == 12 and w.complexity.bytes_moved == 4 * (12 + 4 + 12)
    assert w.verify(jit_run(w)).ok
    assert not w.verify([x]).ok


def test_mlir_file_analyses_its_payload_only_when_costs_are_asked(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a payload file reads its signature only: flops and the reduction length (for
    timing and tolerances) are analysed on first use, so a compile, whose own analysis
    stage walks the ops, does not analyse them twice."""
    from stagegraph.stages import analysis

    real = analysis.analyze
    calls: list[str] = []

    def counting(module, entry=None):
        calls.append(entry)
        return real(module, entry)

    monkeypatch.setattr(analysis, "analyze", counting)
    w = parse_workload(str(tiny))
    assert [s.shape for s in w.input_specs()] == [(3, 4), (4,)] and calls == []
    assert w.complexity.flops == 12 and w.reduction_length == 1
    assert w.complexity.flops == 12 and calls == ["scale"]  # analysed once


def test_mlir_file_without_npz_uses_reference_runner(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = parse_workload(str(tiny))
    assert [a.shape for a in w.inputs()] == [(3, 4), (4,)]
    with pytest.raises(ReferenceUnavailableError, match=r"no tiny\.npz beside it"):
        w.reference()
    w.reference_runner = jit_run
    assert w.verify([w.inputs()[0] * w.inputs()[1]]).ok


def test_mlir_file_parse_error_has_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.mlir"
    path.write_text(
        "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %b : tensor<4xf32>\n}\n"
    )
    with pytest.raises(PayloadError, match=rf"{path}:2:10: use of undeclared SSA value name"):
        parse_workload(str(path))


def test_mlir_file_unregistered_dialect_names_op(tmp_path: Path) -> None:
    path = tmp_path / "scan.mlir"
    path.write_text(
        "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %0 = tm_tensor.scan dimension(0) %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n"
    )
    expected = r"scan.mlir: payload uses op 'tm_tensor.scan' of dialect 'tm_tensor'"
    with pytest.raises(PayloadError, match=expected):
        parse_workload(str(path))


def test_mlir_file_dynamic_shape_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dyn.mlir"
    path.write_text(
        "func.func @main(%a: tensor<4xf32>, %b: tensor<?x4xf32>) -> tensor<4xf32> {\n"
        "  return %a : tensor<4xf32>\n}\n"
    )
    with pytest.raises(PayloadError, match=r"argument #1 of @main has a dynamic shape"):
        parse_workload(str(path))


def test_mlir_file_missing_path_and_entry_choice(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(UnknownWorkloadError, match="no such file"):
        parse_workload(str(tmp_path / "nope.mlir"))
    two = tmp_path / "two.mlir"
    two.write_text(TINY + TINY.replace("@scale", "@other"))
    with pytest.raises(PayloadError, match=r"no entry function.*add .:entry=NAME."):
        parse_workload(str(two))
    assert parse_workload(f"{two}:entry=other").entry == "other"


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="shared/kernelbench is not available")
@pytest.mark.parametrize(
    "stem",
    ["l1_001_Square_matrix_multiplication", "l1_023_Softmax", "l1_033_BatchNorm"],
)
def test_kernelbench_payload_matches_npz(stem: str) -> None:
    w = parse_workload(str(KERNELBENCH / f"{stem}.mlir"))
    verdict = w.verify(jit_run(w))
    assert verdict.ok, verdict.message


@pytest.mark.parametrize(
    "spec",
    ["matmul:m=2,n=3,k=4", "matmul:m=5,n=7,k=3", "ff:m=2,n=3,k=4", "mlp:batch=2,widths=3-4-5"],
)
def test_hand_written_flop_counts_agree_with_the_analysis(spec) -> None:
    """The flops a workload states (its complexity, used for GFLOP/s) are the ones the
    analysis counts in its payload: a formula that drifted from the IR would misreport."""
    from stagegraph.stages.analysis import analyze

    workload = parse_workload(spec)
    facts = analyze(workload.payload())
    assert facts.flops == workload.complexity.flops
    assert facts.flops == sum(op.flops for op in facts.ops) > 0
