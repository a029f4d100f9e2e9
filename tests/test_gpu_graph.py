"""The GPU graph without a GPU: targets, the cost model's mapping, the IR after the GPU
lowering, the emitted PTX and plan, ptxas, and the refusal to run where no GPU is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.artifact.manifest import load_manifest
from stagegraph.errors import GpuUnavailableError, UnknownTargetError
from stagegraph.stages.gpu.target import resolve_gpu_target, target_from_properties
from tests.conftest import kernelbench_or_skip
from tests.test_cli_core import run_cli

PAYLOAD = Path(__file__).parent / "data" / "gpu_relu_sum.mlir"


def gpu_present() -> bool:
    try:
        from stagegraph.runtime.cuda import driver

        driver()
    except GpuUnavailableError:
        return False
    return True


def llvmlite_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("llvmlite") is None


#: Emitting PTX needs the gpu extra (llvmlite; ptxas from nvidia-cuda-nvcc): CI installs it
#: before running this file (.ci/run).
needs_llvmlite = pytest.mark.skipif(llvmlite_missing(), reason="needs the gpu extra (llvmlite)")
needs_gpu = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU")
no_gpu = pytest.mark.skipif(gpu_present(), reason="checks the refusal where no GPU is")


# -- targets --------------------------------------------------------------------------


def test_named_targets_give_documented_facts():
    a100, h100, h200 = (resolve_gpu_target(n) for n in ("sm_80", "h100", "h200"))
    assert (a100.arch, a100.sm_count, a100.sm) == ("sm_80", 108, 80)
    assert (h100.arch, h100.sm_count, h100.shared_bytes_per_block_optin) == (
        "sm_90a",
        132,
        227 * 1024,
    )
    assert h200.memory_bandwidth_gbs > h100.memory_bandwidth_gbs == 3350.0
    assert h100.peak_tflops("bf16", tensor_cores=True) == 989.4
    assert h100.peak_tflops("f32") == 66.9 and a100.warp_size == 32
    assert resolve_gpu_target("sm_86").shared_bytes_per_sm == 100 * 1024
    assert resolve_gpu_target("sm_89").l2_bytes == 96 * 1024 * 1024


def test_unknown_gpu_target_suggests_names():
    with pytest.raises(UnknownTargetError, match=r"'sm_90a'.*known: cuda, h100"):
        resolve_gpu_target("sm_90")


@no_gpu
def test_cuda_target_without_a_gpu_is_refused(capsys):
    # without cuda-bindings the message names the extra, with it the missing device
    with pytest.raises(GpuUnavailableError, match="NVIDIA GPU"):
        resolve_gpu_target("cuda")
    code, _, err = run_cli(capsys, "run", "gpu", str(PAYLOAD), "--target", "cuda")
    assert code == 2 and "NVIDIA GPU" in err and "Traceback" not in err


def test_driver_properties_become_facts():
    props = {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0), "sm_count": 132,
             "warp_size": 32, "max_threads_per_block": 1024, "max_threads_per_sm": 2048,
             "registers_per_block": 65536, "registers_per_sm": 65536,
             "shared_bytes_per_block": 49152, "shared_bytes_per_block_optin": 232448,
             "shared_bytes_per_sm": 233472, "l2_bytes": 52428800,
             "memory_clock_khz": 2619000, "memory_bus_bits": 5120}  # fmt: skip
    target = target_from_properties(props)
    assert (target.arch, target.source, target.sm_count) == ("sm_90a", "driver", 132)
    assert target.memory_bandwidth_gbs == pytest.approx(3352.3, abs=0.1)
    assert target.tensor_tflops["bf16"] == 989.4  # rates: the named part's


def test_gpu_target_names_need_the_gpu_graph(capsys):
    code, _, err = run_cli(capsys, "run", "x86", "matmul:m=8,n=8,k=8", "--target", "sm_80")
    assert code == 2 and "graph 'x86' builds for CPUs; 'sm_80' is a GPU target" in err
    code, _, err = run_cli(capsys, "run", "gpu", str(PAYLOAD), "--target", "znver4")
    assert code == 2 and "unknown GPU target 'znver4'" in err


def test_the_gpu_graph_round_trips_through_a_graph_file(capsys, tmp_path):
    path = tmp_path / "gpu.yaml"
    assert run_cli(capsys, "export", "gpu", "-o", str(path))[0] == 0
    code, out, _ = run_cli(capsys, "validate", str(path))
    assert code == 0 and "graph 'gpu' is valid: 10 stages" in out


# -- cost model and IR ----------------------------------------------------------------


def lowered(target: str = "sm_90a"):
    return sg.run("gpu", str(PAYLOAD), target=target, until="lower")


def test_params_map_inner_loops_to_threads_and_the_rest_to_blocks():
    params = sg.run("gpu", str(PAYLOAD), until="select").value("select")
    relu, fill, total = params.kernels
    # 4 floats per thread along the rows (16-byte vectors), 2 rows per block of 256 threads.
    assert (relu.vector, relu.threads) == (4, (128, 2))
    assert relu.block_tile == (2, 512) and relu.thread_tile == (1, 4)
    assert (fill.vector, fill.threads) == (4, (16,))
    # The row sums: a block per row, 128 threads reading 4-float vectors of it together
    # (gpu.reduction); the tiles name the row and its J, L, V loops.
    assert (total.lanes, total.vector, total.threads) == (128, 4, (128,))
    assert total.block_tile == (1, 0, 0, 0)


def test_schedule_maps_block_foralls_to_blocks_and_nested_ones_to_threads():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect, top_level_ops

    module = sg.run("gpu", str(PAYLOAD), until="scheduled").module.ir
    entry = next(op for op in top_level_ops(module) if op.name == "func.func")
    blocks = [op for op in top_level_ops(entry) if op.name == "scf.forall"]
    assert len(blocks) == 3  # relu, fill, row sums: one block forall each
    with module.context:
        block, thread = (ir.Attribute.parse(f"#gpu.{kind}") for kind in
                         ("block<linear_dim_0>", "thread<x>"))  # fmt: skip
        for forall in blocks:
            mapping = list(ir.ArrayAttr(forall.attributes["mapping"]))
            assert mapping[-1] == block
            inner = [op for op in collect(forall, "scf.forall") if op != forall]
            # one thread forall; the row sums': lanes, a warp combining, one thread
            assert len(inner) == (3 if forall == blocks[2] else 1)
            for threads in inner:
                assert list(ir.ArrayAttr(threads.attributes["mapping"]))[-1] == thread
        relu_threads = list(ir.ArrayAttr(collect(blocks[0], "scf.forall")[-1]
                                         .attributes["mapping"]))  # fmt: skip
        assert relu_threads == [ir.Attribute.parse("#gpu.thread<y>"), thread]
    # The pointwise op's thread piece is vector transfers; so are the row sums' steps.
    assert collect(blocks[0], "vector.transfer_read")
    assert collect(blocks[2], "vector.reduction")


def test_threads_per_block_is_a_param(capsys):
    params = sg.run("gpu", str(PAYLOAD), until="select", param={"threads_per_block": 64})
    relu = params.value("select").kernels[0]
    assert relu.threads == (64,) and relu.block_tile == (1, 256)
    code, _, err = run_cli(capsys, "run", "gpu", str(PAYLOAD), "--param", "threads_per_block=100")
    assert code == 2 and "threads_per_block=100: Input should be a multiple of 32" in err


def test_lowering_outlines_one_kernel_per_op_with_block_and_thread_sizes():
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    module = lowered().module.ir
    launches = collect(module, "gpu.launch_func")
    assert len(launches) == 3
    kernels = collect(module, lambda op: op.name == "llvm.func" and "nvvm.kernel" in op.attributes)
    assert len(kernels) == 3
    sizes = sorted(list(ir.DenseI32ArrayAttr(k.attributes["nvvm.maxntid"])) for k in kernels)
    assert sizes == [[16, 1, 1], [128, 1, 1], [128, 2, 1]]
    assert not collect(module, lambda op: op.name.startswith("linalg."))


# -- emitted artifact -----------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpu") / "relu_sum"
    report = sg.run("gpu", str(PAYLOAD), target="sm_80", emit="object", output=str(folder))
    assert report.verified is None and "not executed" in report.message
    return folder


@needs_llvmlite
def test_manifest_plans_allocations_copies_and_launches(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert load_manifest(artifact, kind="cuda").model_dump(mode="json") == manifest
    assert [v["name"] for v in (*manifest["arguments"], *manifest["results"])] == [
        "in0", "out0", "out1"]  # fmt: skip
    assert manifest["kind"] == "cuda" and manifest["target"] == {"name": "sm_80", "sm": 80}
    ops = [step["op"] for step in manifest["plan"]]
    assert ops[:2] == ["alloc", "copy_h2d"] and ops.count("launch") == 3
    assert ops.index("copy_d2h") > max(i for i, op in enumerate(ops) if op == "launch")
    grids = sorted((k["launch"]["grid"], k["launch"]["block"]) for k in manifest["kernels"])
    assert sorted(g[1] for g in grids) == [[16, 1, 1], [128, 1, 1], [128, 2, 1]]
    # the fill in one block; ReLU's 64 rows 2 per block; the sums one block per row
    assert sorted(int(np.prod(g[0])) for g in grids) == [1, 32, 64]
    launch = next(s for s in manifest["plan"] if s["op"] == "launch")
    buffer = next(a for a in launch["args"] if "buffer" in a)
    assert buffer["sizes"] and buffer["strides"][-1] == 1
    assert [r["shape"] for r in manifest["results"]] == [[64, 512], [64]]
    assert [r["strides"] for r in manifest["results"]] == [[512, 1], [1]]
    assert manifest["producer"]["graph"] == "gpu"
    assert all(set(s) == {"op", "kernel", "args"} for s in manifest["plan"] if s["op"] == "launch")


def test_launches_beyond_cuda_limits_are_refused_at_compile_time():
    from stagegraph.errors import UnsupportedPayloadError
    from stagegraph.stages.gpu.plan import check_launch_limits

    check_launch_limits("m::k", {"grid": [2**31 - 1, 65535, 1], "block": [1024, 1, 1]})
    with pytest.raises(UnsupportedPayloadError, match=r"kernel m::k .*grid y = 70000 > 65535"):
        check_launch_limits("m::k", {"grid": [1, 70000, 1], "block": [32, 1, 1]})
    with pytest.raises(UnsupportedPayloadError, match="2048 threads per block > 1024"):
        check_launch_limits("m::k", {"grid": [1, 1, 1], "block": [64, 32, 1]})


def test_a_launch_that_disagrees_with_its_kernel_is_an_error():
    from stagegraph.errors import EmitError
    from stagegraph.stages.gpu.emit import check_launches, marshalled_arity

    view = {"buffer": "b", "offset": 0, "sizes": [2, 3], "strides": [3, 1], "dtype": "f32"}
    assert marshalled_arity([view, {"scalar": 1.0, "dtype": "f32"}]) == 8
    step = {"op": "launch", "kernel": "m__k", "args": [view]}
    check_launches([step], {"m__k": 7})
    with pytest.raises(EmitError, match="takes 8 parameters, but its launch in the host plan"):
        check_launches([step], {"m__k": 8})


@needs_llvmlite
def test_ptx_has_one_entry_per_kernel_and_libdevice_linked(artifact):
    texts = [p.read_text() for p in sorted(artifact.glob("*.ptx"))]
    assert len(texts) == 3
    for text in texts:
        assert ".target sm_80" in text and text.count(".entry") == 1
        assert "__nv_expf" not in text  # linked from libdevice and inlined
    assert any("ex2.approx" in t for t in texts)  # exp reached the special-function unit
    # The pointwise kernels move 16 bytes per thread and access; the row sums read so too.
    assert sum("ld.global.v4" in t for t in texts) == 2
    assert sum("st.global.v4" in t for t in texts) == 2


@needs_llvmlite
def test_ptxas_assembles_every_kernel_without_spills(artifact):
    from stagegraph.stages.gpu.ptx import assemble, ptxas_path

    if ptxas_path() is None:
        pytest.skip("ptxas (nvidia-cuda-nvcc) not installed")
    for ptx in artifact.glob("*.ptx"):
        (report,) = assemble(ptx.read_text(), "sm_80")
        assert report.spill_stores == 0 and report.spill_loads == 0
        assert 0 < report.registers <= 255


@needs_llvmlite
def test_float_literals_become_hex_for_llvmlite():
    from stagegraph.stages.gpu.ptx import portable_llvm_ir

    text = (
        "store <4 x float> splat (float -inf), ptr %9\n"
        "%37 = fmul <4 x float> %36, splat (float 3.140000e+00)\n"
        "%68 = fadd float %67, f0x3727C5AC\n"
        "%x = fadd half inf, %y\n"
        "%z = fmul double %w, 5.000000e-01\n"
        "%40 = select i1 %39, float +qnan, float %38\n"
    )
    assert portable_llvm_ir(text).splitlines() == [
        "store <4 x float> splat (float 0xFFF0000000000000), ptr %9",
        "%37 = fmul <4 x float> %36, splat (float 0x40091EB860000000)",
        "%68 = fadd float %67, 0x3EE4F8B580000000",
        "%x = fadd half 0xH7C00, %y",
        "%z = fmul double %w, 0x3FE0000000000000",
        "%40 = select i1 %39, float 0x7FF8000000000000, float %38",
    ]


def test_ptxas_report_parsing():
    from stagegraph.stages.gpu.ptx import parse_ptxas_report

    text = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Function properties for k\n"
        "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem\n"
    )
    (report,) = parse_ptxas_report(text)
    assert (report.kernel, report.registers, report.spill_stores) == ("k", 40, 8)
    assert (report.spill_loads, report.stack_bytes, report.shared_bytes) == (4, 16, 1024)


@needs_llvmlite
def test_ptxas_rejects_bad_ptx():
    from stagegraph.errors import PtxError
    from stagegraph.stages.gpu.ptx import assemble, ptxas_path

    if ptxas_path() is None:
        pytest.skip("ptxas (nvidia-cuda-nvcc) not installed")
    with pytest.raises(PtxError, match="ptxas rejected"):
        assemble(".version 8.0\n.target sm_80\n.entry k( {\n", "sm_80")


# -- running ----------------------------------------------------------------------------


@no_gpu
@needs_llvmlite
def test_run_refuses_after_compiling_where_no_gpu_is(capsys):
    code, _, err = run_cli(capsys, "run", "gpu", str(PAYLOAD), "--target", "sm_90a")
    assert code == 2 and "no NVIDIA GPU is present" in err and "--emit" in err


def test_runtime_imports_neither_pydantic_nor_mlir():
    code = (
        "import sys, stagegraph.runtime.cuda;"
        "bad = [m for m in ('pydantic', 'torch_mlir', 'mlir') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_gpu
def test_runs_and_matches_numpy_on_a_gpu():
    x = np.random.default_rng(0).standard_normal((64, 512), np.float32)
    binary = sg.run("gpu", str(PAYLOAD), target="cuda", until="emit").value("emit")
    relu, total = binary.call("main", [x])
    np.testing.assert_allclose(relu, np.maximum(x, 0), rtol=1e-6)
    np.testing.assert_allclose(total, np.exp(x).sum(axis=1), rtol=1e-4)


# -- KernelBench payloads ---------------------------------------------------------------

SHIPPED = [
    "l1_019_ReLU", "l1_023_Softmax", "l1_047_Sum_reduction_over_a_dimension",
    "l1_001_Square_matrix_multiplication", "l1_042_Max_Pooling_2D", "l1_094_MSELoss",
]  # fmt: skip


@pytest.mark.parametrize("stem", SHIPPED)
@needs_llvmlite
def test_kernelbench_payloads_compile_and_assemble(stem, tmp_path):
    from stagegraph.stages.gpu.ptx import assemble, ptxas_path

    folder = kernelbench_or_skip("level1")
    out = tmp_path / stem
    sg.run("gpu", str(folder / f"{stem}.mlir"), target="sm_90a", emit="object", output=str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kernels"]
    assert load_manifest(out, kind="cuda").model_dump(mode="json") == manifest  # the schema's
    if ptxas_path() is None:
        return
    for ptx in out.glob("*.ptx"):
        for report in assemble(ptx.read_text(), "sm_90a"):
            assert report.spill_stores == 0, (stem, report)


# -- benchmarks/gpu_check.py: its run side -------------------------------------------------

BLOCK_PYDANTIC_AND_MLIR = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pydantic', 'torch_mlir', 'mlir'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Blocker())
folder, one = sys.argv[1], sys.argv[2]
sys.argv = ['gpu_check.py', '--run', folder]
sys.path.insert(0, 'benchmarks')
import gpu_check
manifest, ptx, constants = gpu_check.load_artifact(__import__('pathlib').Path(one))
assert manifest['kind'] == 'cuda' and ptx and constants == {}
sys.exit(gpu_check.main())
"""


@needs_llvmlite
def test_gpu_check_run_side_needs_no_pydantic_or_mlir(artifact):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PYDANTIC_AND_MLIR, str(artifact.parent), str(artifact)],
        capture_output=True, text=True, cwd=root,
    )  # fmt: skip
    if gpu_present():
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2 and "no NVIDIA GPU" in done.stderr, done.stderr


def test_gpu_check_relative_error():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_check import relative_error

    ref = np.array([3.0, 4.0], np.float32)
    assert relative_error(ref, ref) == 0.0
    assert relative_error(np.array([3.0, 4.5], np.float32), ref) == pytest.approx(0.1)
    assert relative_error(np.array([np.nan, 4.0], np.float32), ref) == float("inf")
    assert relative_error(ref[:1], ref) == float("inf")


def test_gpu_check_judges_by_the_projects_criterion():
    """A result that cancels to rounding noise (a GroupNorm's mean, ~1e-8) passes when its
    noise differs from the reference's, as the CPU verifier lets it; a wrong one fails."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_check import verdict

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 256)).astype(np.float32)
    ref = (rng.normal(size=4) * 1e-8).astype(np.float32)
    manifest = {"arguments": [{"name": "in0", "position": 0, "dtype": "f32"}],
                "results": [{"name": "out0", "position": 1, "dtype": "f32"}],
                "reduction_length": 256}  # fmt: skip
    noisy = ref + (rng.normal(size=4) * 1e-7).astype(np.float32)
    assert verdict([noisy], [ref], [x], manifest) < 1.0  # relative error here: ~10
    assert verdict([ref + 0.01], [ref], [x], manifest) > 100  # a real error
    assert verdict([np.full(4, np.nan, np.float32)], [ref], [x], manifest) == float("inf")
    assert verdict([ref[:2]], [ref], [x], manifest) == float("inf")
