"""The artifact manifest: both kinds validate, round-trip JSON, and bad ones are refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from stagegraph.artifact.manifest import (
    CpuManifest,
    CudaManifest,
    load_manifest,
    row_major_strides,
    write_manifest,
)
from stagegraph.artifact.manifest_json import SCHEMA_VERSION, load_manifest_dict
from stagegraph.errors import ArtifactError

PRODUCER = {"stagegraph": "0.1.0", "mlir": "20261001", "graph": "x86", "workload": "matmul"}


def value(name: str, position: int, shape: tuple[int, ...] | None, dtype: str = "f32") -> dict:
    strides = None if shape is None else list(row_major_strides(shape))
    return {"name": name, "position": position, "dtype": dtype,
            "shape": None if shape is None else list(shape), "strides": strides}  # fmt: skip


def cpu_dict() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "cpu",
        "name": "stagegraph_matmul",
        "producer": {**PRODUCER, "params": {"tile_m": 8}},
        "arguments": [value("in0", 0, (8, 4)), value("in1", 1, (4, 8))],
        "results": [value("out0", 2, (8, 8))],
        "library": "libstagegraph_matmul.so",
        "object": "stagegraph_matmul.o",
        "header": "stagegraph_matmul.h",
        "entry": {"symbol": "stagegraph_matmul", "ciface_symbol": "_mlir_ciface_stagegraph_matmul"},
        "target": {"name": "x86-64-v3", "isa": ["avx", "avx2", "fma"]},
        "threads": 2,
        "runtime": [{"name": "libiomp5.so", "purpose": "openmp", "file": "libiomp5.so"}],
    }


def view(buffer: str, offset: int = 0) -> dict:
    """A kernel argument: a view of a 64x64 f32 device buffer (a memref descriptor)."""
    return {"buffer": buffer, "offset": offset, "sizes": [64, 64], "strides": [64, 1],
            "dtype": "f32"}  # fmt: skip


def cuda_dict() -> dict:
    launch = {"grid": [4, 4, 1], "block": [16, 16, 1], "shared_mem_bytes": 8192}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "cuda",
        "name": "stagegraph_matmul",
        "producer": PRODUCER,
        "arguments": [value("in0", 0, (64, 64)), value("in1", 1, (64, 64))],
        "results": [value("out0", 2, (64, 64))],
        "target": {"name": "sm_90", "sm": 90},
        "kernels": [{"name": "mm", "ptx": "mm.ptx", "entry": "matmul_kernel", "launch": launch}],
        "plan": [
            {"op": "alloc", "buffer": "a", "bytes": 16384},
            {"op": "alloc", "buffer": "b", "bytes": 16384},
            {"op": "alloc", "buffer": "c", "bytes": 16384},
            {"op": "copy_h2d", "src": "in0", "dst": "a"},
            {"op": "copy_h2d", "src": "in1", "dst": "b"},
            {
                "op": "launch",
                "kernel": "mm",
                "args": [view("a"), view("b"), view("c"), {"scalar": 64, "dtype": "i32"}],
            },
            {"op": "copy_d2h", "src": "c", "dst": "out0"},
            {"op": "free", "buffer": "a"},
            {"op": "free", "buffer": "b"},
            {"op": "free", "buffer": "c"},
        ],
    }


@pytest.mark.parametrize("make, model", [(cpu_dict, CpuManifest), (cuda_dict, CudaManifest)])
def test_each_kind_round_trips_json(tmp_path, make, model):
    manifest = model.model_validate(make())
    write_manifest(tmp_path, manifest)
    loaded = load_manifest(tmp_path)
    assert type(loaded) is model and loaded == manifest
    # The plain-dict reader sees the same JSON the models wrote (what a GPU host reads).
    plain = load_manifest_dict(tmp_path)
    assert plain["kind"] == make()["kind"]
    assert model.model_validate(plain) == manifest


def test_cuda_plan_steps_are_discriminated_by_op():
    manifest = CudaManifest.model_validate(cuda_dict())
    assert [type(s).__name__ for s in manifest.plan[:5]] == [
        "Alloc", "Alloc", "Alloc", "CopyH2D", "CopyH2D"]  # fmt: skip
    launch = manifest.plan[5]
    assert launch.kernel == "mm" and launch.args[3].scalar == 64
    assert manifest.kernels[0].launch.block == (16, 16, 1)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["plan"].insert(0, {"op": "copy_h2d", "src": "in0", "dst": "a"}),
         "uses buffer 'a' before alloc"),
        (lambda d: d["plan"][5].update(kernel="nope"), "unknown kernel 'nope'"),
        (lambda d: d["plan"][6].update(dst="in0"), "unknown result 'in0'"),
        (lambda d: d["plan"].append({"op": "launch", "kernel": "mm", "args": [view("a")]}),
         "uses buffer 'a' before alloc"),
        (lambda d: d["plan"][5]["args"][0].update(strides=[1]), "2 sizes but 1 strides"),
        (lambda d: d["plan"][5]["args"].append({"buffer": "a"}), "offset"),
        (lambda d: d["plan"][5]["args"].append({"argument": "in0", "dtype": "f32"}),
         "'in0', which is no scalar argument"),
        (lambda d: d["plan"].insert(3, {"op": "constant", "buffer": "a", "data": "w"}),
         "fills from 'w', which constants lacks"),
        (lambda d: d["plan"].insert(3, {"op": "copy_d2d", "src": view("a"),
                                        "dst": {**view("b"), "sizes": [64], "strides": [1]}}),
         "copy_d2d between sizes"),
        (lambda d: d["plan"].insert(3, {"op": "alloc", "buffer": "a", "bytes": 4}),
         "allocates 'a' twice"),
        (lambda d: d.update(constants={"w": "../w.npy"}), "file name inside"),
        (lambda d: d["plan"].append({"op": "sync"}), "does not match any of the expected tags"),
        (lambda d: d["kernels"][0]["launch"].update(grid=[0, 1, 1]), "must be positive"),
        (lambda d: d["kernels"][0].update(ptx="../mm.ptx"), "file name inside"),
        (lambda d: d["target"].update(name="gfx90a"), "should match pattern"),
    ],
)  # fmt: skip
def test_inconsistent_cuda_plans_are_refused(edit, message):
    data = cuda_dict()
    edit(data)
    with pytest.raises(ValidationError, match=message):
        CudaManifest.model_validate(data)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(name="9lives"), "not a C identifier"),
        (lambda d: d["results"][0].update(position=5), "positions"),
        (lambda d: d["results"][0].update(name="in0"), "repeat"),
        (lambda d: d["arguments"][0].update(strides=[1, 8]), "row-major"),
        (lambda d: d.update(surprise=1), "Extra inputs are not permitted"),
        (lambda d: d.update(threads=0), "greater than or equal to 1"),
    ],
)
def test_inconsistent_cpu_manifests_are_refused(edit, message):
    data = cpu_dict()
    edit(data)
    with pytest.raises(ValidationError, match=message):
        CpuManifest.model_validate(data)


def write(tmp_path, data) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(data))


def test_other_schema_version_is_refused(tmp_path):
    write(tmp_path, {**cpu_dict(), "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(ArtifactError, match="schema version 2, but this stagegraph reads"):
        load_manifest(tmp_path)


def test_kind_mismatch_and_missing_manifest_are_refused(tmp_path):
    with pytest.raises(ArtifactError, match="no manifest.json"):
        load_manifest_dict(tmp_path)
    write(tmp_path, cuda_dict())
    with pytest.raises(ArtifactError, match="a 'cuda' artifact, but this runner runs 'cpu'"):
        load_manifest(tmp_path, kind="cpu")
    write(tmp_path, {**cpu_dict(), "kind": "tpu"})
    with pytest.raises(ArtifactError, match="unknown artifact kind 'tpu'"):
        load_manifest_dict(tmp_path)
    write(tmp_path, {**cpu_dict(), "threads": "two"})
    with pytest.raises(ArtifactError, match="invalid manifest: threads"):
        load_manifest(tmp_path)


def test_plain_reader_needs_no_pydantic(tmp_path):
    """A GPU host without pydantic reads manifests with the standard library module."""
    write(tmp_path, cuda_dict())
    code = (
        "import sys; sys.modules['pydantic'] = None\n"
        "from stagegraph.artifact.manifest_json import load_manifest_dict\n"
        f"d = load_manifest_dict({str(tmp_path)!r}, kind='cuda')\n"
        "print(d['kernels'][0]['launch']['grid'], d['plan'][5]['op'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[4, 4, 1] launch"


def test_cuda_constants_views_scalar_arguments_and_device_copies_validate():
    """What the GPU graph's plans hold: a constant buffer filled from a .npy, views with an
    offset, the entry's scalar argument passed on to a kernel, a device-to-device copy."""
    data = cuda_dict()
    data["arguments"].append(value("alpha", 3, None))
    data["constants"] = {"const_w": "const_w.npy"}
    data["plan"][3:3] = [
        {"op": "alloc", "buffer": "const_w", "bytes": 16384},
        {"op": "constant", "buffer": "const_w", "data": "const_w"},
        {"op": "copy_d2d", "src": view("const_w"), "dst": view("c")},
    ]
    launch = next(s for s in data["plan"] if s["op"] == "launch")
    launch["args"] = [view("a", offset=64), view("const_w"), view("c"),
                      {"argument": "alpha", "dtype": "f32"}]  # fmt: skip
    manifest = CudaManifest.model_validate(data)
    kinds = [type(s).__name__ for s in manifest.plan[3:6]]
    assert kinds == ["Alloc", "Constant", "CopyD2D"]
    assert [type(a).__name__ for a in manifest.plan[8].args] == [
        "BufferArg", "BufferArg", "BufferArg", "ArgumentArg"]  # fmt: skip
    assert manifest.plan[8].args[0].offset == 64
    assert CudaManifest.model_validate(manifest.model_dump(mode="json")) == manifest
