"""The GPU graph emits the one versioned artifact format: every manifest it writes validates
against ``CudaManifest``, JSON -> pydantic -> JSON is the same text, the pydantic-free
reader returns the same dict (also with pydantic blocked), and ``stagegraph exec`` on a
``cuda`` folder validates it and then, without a GPU, refuses with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.artifact.cuda_folder import load_cuda_folder
from stagegraph.artifact.manifest import CudaManifest, load_manifest
from stagegraph.artifact.manifest_json import SCHEMA_VERSION, load_manifest_dict
from stagegraph.errors import ArtifactError, EmitError
from tests.test_cli_core import run_cli
from tests.test_gpu_graph import PAYLOAD, gpu_present, needs_llvmlite

pytestmark = needs_llvmlite

#: A non-splat constant operand: the plan fills a device buffer from a .npy.
BIAS = """
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %w = arith.constant dense<[[0.0, 1.0, 2.0, 3.0], [-1.0, -2.0, -3.0, -4.0]]> : tensor<2x4xf32>
  %e = tensor.empty() : tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [#map, #map, #map],
      iterator_types = ["parallel", "parallel"]}
      ins(%x, %w : tensor<2x4xf32>, tensor<2x4xf32>) outs(%e : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}
"""
#: A scalar argument of the entry, passed on to the kernel by value.
SCALE = """
#map = affine_map<(d0) -> (d0)>
func.func @main(%x: tensor<32xf32>, %alpha: f32) -> tensor<32xf32> {
  %e = tensor.empty() : tensor<32xf32>
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]}
      ins(%x : tensor<32xf32>) outs(%e : tensor<32xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.mulf %a, %alpha : f32
    linalg.yield %s : f32
  } -> tensor<32xf32>
  return %r : tensor<32xf32>
}
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The artifact folders of the three payloads, emitted for sm_80."""
    root = tmp_path_factory.mktemp("gpu_manifest")
    payloads = {"relu_sum": PAYLOAD}
    for name, text in (("bias", BIAS), ("scale", SCALE)):
        payloads[name] = root / f"{name}.mlir"
        payloads[name].write_text(text)
    out = {}
    for name, payload in payloads.items():
        out[name] = root / name
        sg.run("gpu", str(payload), target="sm_80", emit="object", output=str(out[name]))
    return out


def test_every_emitted_manifest_validates_and_names_its_workload(folders):
    for name, folder in folders.items():
        manifest = load_manifest(folder, kind="cuda")
        assert isinstance(manifest, CudaManifest), name
        assert manifest.schema_version == SCHEMA_VERSION and manifest.target.sm == 80
        assert manifest.producer.graph == "gpu"
        assert manifest.producer.workload.endswith(".mlir"), manifest.producer


def test_reduction_length_is_the_payloads_longest_sum(folders):
    """The manifest carries the analysis' reduction length (relu_sum sums rows of 512;
    the elementwise payloads sum nothing), so `exec --check` widens its tolerance as the
    CPU artifact's checker does."""
    lengths = {name: load_manifest(f, kind="cuda").reduction_length for name, f in folders.items()}
    assert lengths == {"relu_sum": 512, "bias": 1, "scale": 1}


def test_constants_and_scalar_arguments_are_in_the_schema(folders):
    bias = load_manifest(folders["bias"], kind="cuda")
    (constant,) = [s for s in bias.plan if s.op == "constant"]
    assert bias.constants == {constant.data: f"{constant.data}.npy"}
    values = np.load(folders["bias"] / bias.constants[constant.data])
    np.testing.assert_array_equal(values, [[0, 1, 2, 3], [-1, -2, -3, -4]])
    scale = load_manifest(folders["scale"], kind="cuda")
    assert [a.shape for a in scale.arguments] == [(32,), None]
    (launch,) = [s for s in scale.plan if s.op == "launch"]
    passed = [type(a).__name__ for a in launch.args]
    assert passed == ["BufferArg", "BufferArg", "ArgumentArg"]
    assert launch.args[2].argument == scale.arguments[1].name and launch.args[2].dtype == "f32"


def test_json_round_trips_through_the_models_to_the_same_text(folders):
    for name, folder in folders.items():
        text = (folder / "manifest.json").read_text()
        model = CudaManifest.model_validate(json.loads(text))
        assert json.dumps(model.model_dump(mode="json"), indent=1) + "\n" == text, name


def test_plain_reader_returns_the_emitted_dict(folders):
    binary = sg.run("gpu", str(PAYLOAD), target="sm_80", until="emit").value("emit")
    plain = load_manifest_dict(folders["relu_sum"], kind="cuda")
    assert plain == json.loads((folders["relu_sum"] / "manifest.json").read_text())
    assert plain == binary.manifest  # in memory and on disk: one manifest
    loaded = load_cuda_folder(folders["bias"])
    assert loaded.manifest == load_manifest(folders["bias"]).model_dump(mode="json")
    assert set(loaded.ptx) == {Path(k["ptx"]).stem for k in loaded.manifest["kernels"]}
    assert set(loaded.constants) == set(loaded.manifest["constants"])


BLOCKED = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pydantic', 'torch_mlir', 'mlir'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Blocker())
import json
from stagegraph.artifact.cuda_folder import load_cuda_folder
loaded = load_cuda_folder(sys.argv[1])
print(json.dumps(loaded.manifest))
"""


def test_the_folder_reader_needs_no_pydantic(folders):
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(folders["bias"])], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == load_manifest_dict(folders["bias"])


def copy_with(folder: Path, target: Path, **changes) -> Path:
    target.mkdir()
    for path in folder.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    data = json.loads((folder / "manifest.json").read_text())
    (target / "manifest.json").write_text(json.dumps({**data, **changes}))
    return target


def test_other_versions_kinds_and_missing_files_are_refused(folders, tmp_path):
    newer = copy_with(folders["bias"], tmp_path / "v2", schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(ArtifactError, match="schema version 2, but this stagegraph reads ver"):
        load_cuda_folder(newer)
    cpu = copy_with(folders["bias"], tmp_path / "cpu", kind="cpu")
    with pytest.raises(ArtifactError, match="a 'cpu' artifact, but this runner runs 'cuda'"):
        load_cuda_folder(cpu)
    lacking = copy_with(folders["bias"], tmp_path / "lacking")
    next(lacking.glob("*.npy")).unlink()
    with pytest.raises(ArtifactError, match=r"const_\w+\.npy, which the folder lacks"):
        load_cuda_folder(lacking)


def test_gpu_check_reads_through_the_versioned_reader(folders, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_check import load_artifact

    manifest, ptx, constants = load_artifact(folders["bias"])
    assert manifest == load_manifest_dict(folders["bias"]) and ptx and len(constants) == 1
    newer = copy_with(folders["bias"], tmp_path / "v2", schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(ArtifactError, match="schema version 2"):
        load_artifact(newer)


def test_a_plan_the_schema_refuses_fails_at_compile_time():
    from stagegraph.stages.gpu.emit import validated_manifest

    fields = {
        "kind": "cuda", "name": "main",
        "producer": {"stagegraph": "0", "mlir": "m", "graph": "gpu", "workload": "w"},
        "target": {"name": "sm_80", "sm": 80}, "arguments": [], "results": [],
        "kernels": [], "constants": {},
        "plan": [{"op": "launch", "kernel": "k", "args": []}],
    }  # fmt: skip
    with pytest.raises(EmitError, match="stage gpu.emit.*'main'.*unknown kernel 'k'"):
        validated_manifest(fields)


@pytest.mark.skipif(gpu_present(), reason="checks the refusal where no GPU is")
def test_exec_validates_then_needs_a_gpu(folders, capsys, tmp_path):
    code, _, err = run_cli(capsys, "exec", str(folders["relu_sum"]))
    assert code == 2
    assert "a cuda artifact (PTX for sm_80) needs an NVIDIA GPU" in err and "Traceback" not in err
    broken = copy_with(folders["relu_sum"], tmp_path / "broken", kernels=[])
    code, _, err = run_cli(capsys, "exec", str(broken))
    assert code == 2 and "invalid manifest" in err and "unknown kernel" in err
    assert "GPU" not in err  # a broken folder is named as such, even without a GPU


def test_exec_runs_a_cuda_folder_on_a_gpu(folders, tmp_path):
    if not gpu_present():
        pytest.skip("needs an NVIDIA GPU")
    from stagegraph.app.exec_artifact import execute_artifact

    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    bias = np.array([[0, 1, 2, 3], [-1, -2, -3, -4]], np.float32)
    np.savez(tmp_path / "ref.npz", in0=x, out0=x + bias)
    report = execute_artifact(folders["bias"], check=str(tmp_path / "ref.npz"))
    assert report.verified is True, report.message
