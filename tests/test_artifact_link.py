"""Artifacts linked for real: gcc and g++ build programs against the header, the library and
the object file of an artifact folder moved elsewhere; the programs run with a bare
environment and their results match the workload's reference; ``nm`` finds no ``main`` and
nothing global but the entry's two symbols."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from stagegraph.artifact.cabi import C_TYPES
from tests.artifact_cases import CASES, build_once

TOOLS = ("gcc", "g++", "nm", "objcopy", "ld", "ldd", "readelf")
pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS), reason=f"needs {', '.join(TOOLS)}"
)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return build_once(tmp_path_factory)


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def values(data: dict) -> list[dict]:
    return sorted([*data["arguments"], *data["results"]], key=lambda v: v["position"])


def is_output(value: dict) -> bool:
    return value["name"].startswith("out")


def c_program(data: dict) -> str:
    """Read in<i>.bin, call the plain-pointer entry, write out<i>.bin."""
    macro = data["name"].upper()
    lines = ["#include <stdio.h>", "#include <stdlib.h>", f'#include "{data["header"]}"', "",
             "static void *slurp(const char *dir, const char *name, size_t bytes) {",
             "  char path[4096]; snprintf(path, sizeof path, \"%s/%s\", dir, name);",
             "  void *p = calloc(1, bytes); FILE *f = fopen(path, \"rb\");",
             "  if (f) { if (fread(p, 1, bytes, f) != bytes) exit(3); fclose(f); }",
             "  return p;", "}", "",
             "static void spill(const char *dir, const char *name, void *p, size_t bytes) {",
             "  char path[4096]; snprintf(path, sizeof path, \"%s/%s\", dir, name);",
             "  FILE *f = fopen(path, \"wb\"); fwrite(p, 1, bytes, f); fclose(f);", "}", "",
             "int main(int argc, char **argv) {", "  const char *dir = argv[1];"]  # fmt: skip
    for v in values(data):
        ctype, n = C_TYPES[v["dtype"]], v["name"]
        size = f"sizeof({ctype}) * {macro}_{n.upper()}_ELEMENTS"
        lines.append(f'  {ctype} *{n} = slurp(dir, "{n}.bin", {size});')
    call = ", ".join(v["name"] for v in values(data))
    lines.append(f"  {data['entry']['symbol']}({call});")
    for v in values(data):
        if is_output(v):
            ctype, n = C_TYPES[v["dtype"]], v["name"]
            size = f"sizeof({ctype}) * {macro}_{n.upper()}_ELEMENTS"
            lines.append(f'  spill(dir, "{n}.bin", {n}, {size});')
    return "\n".join([*lines, "  return 0;", "}", ""])


def cpp_program(data: dict) -> str:
    """The same through the memref-descriptor form, in C++ (std::vector buffers)."""
    lines = ["#include <cstdint>", "#include <fstream>", "#include <string>", "#include <vector>",
             f'#include "{data["header"]}"', "",
             "template <class T> std::vector<T> slurp(const std::string &path, size_t n) {",
             "  std::vector<T> v(n); std::ifstream f(path, std::ios::binary);",
             "  f.read(reinterpret_cast<char *>(v.data()), n * sizeof(T)); return v;", "}", "",
             "int main(int argc, char **argv) {", "  std::string dir = argv[1];"]  # fmt: skip
    args = []
    for i, v in enumerate(values(data)):
        ctype, n, shape = C_TYPES[v["dtype"]], v["name"], v["shape"]
        count = int(np.prod(shape, dtype=np.int64))
        lines.append(f'  auto {n} = slurp<{ctype}>(dir + "/{n}.bin", {count});')
        dims = f", {{{', '.join(map(str, shape))}}}, {{{', '.join(map(str, v['strides']))}}}"
        lines.append(
            f"  stagegraph_memref_{len(shape)}d d{i} = {{{n}.data(), {n}.data(), 0"
            f"{dims if shape else ''}}};"
        )
        args.append(f"&d{i}")
    lines.append(f"  {data['entry']['ciface_symbol']}({', '.join(args)});")
    for v in values(data):
        if is_output(v):
            n = v["name"]
            lines.append(
                f'  std::ofstream(dir + "/{n}.bin", std::ios::binary).write('
                f"reinterpret_cast<char *>({n}.data()), {n}.size() * sizeof({n}[0]));"
            )
    return "\n".join([*lines, "  return 0;", "}", ""])


def runtime_flags(folder: Path, data: dict) -> list[str]:
    """What a program linking the object file adds: the bundled runtime, system libraries."""
    flags = []
    for lib in data["runtime"]:
        flags.append(str(folder / lib["file"]) if lib["file"] else f"-l:{lib['name']}")
    return [*flags, f"-Wl,-rpath,{folder}"]


def run_program(program: Path, work: Path, data: dict, inputs: list) -> list[np.ndarray]:
    """Run ``program`` on ``inputs`` with an empty environment; read its outputs back."""
    for v, array in zip(data["arguments"], inputs, strict=True):
        np.ascontiguousarray(array).tofile(work / f"{v['name']}.bin")
    proc = subprocess.run([str(program), str(work)], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [
        np.fromfile(work / f"{v['name']}.bin", dtype=parse_dtype(v["dtype"])).reshape(v["shape"])
        for v in data["results"]
    ]


def parse_dtype(name: str) -> np.dtype:
    from stagegraph.dtypes import numpy_dtype

    return numpy_dtype(name)


def compile_program(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"


@pytest.mark.parametrize("case", list(CASES))
def test_c_program_links_the_library(artifacts, case, tmp_path):
    folder, workload = artifacts[case]
    data = manifest(folder)
    (tmp_path / "prog.c").write_text(c_program(data))
    exe = tmp_path / "prog_c"
    # The library alone: it names its OpenMP runtime and finds it through $ORIGIN.
    compile_program(["gcc", "-std=c11", "-Wall", "-Werror", str(tmp_path / "prog.c"),
                     f"-I{folder}", str(folder / data["library"]), f"-Wl,-rpath,{folder}",
                     "-o", str(exe)])  # fmt: skip
    outputs = run_program(exe, tmp_path, data, workload.inputs())
    verdict = workload.verify(outputs)
    assert verdict.ok, verdict.message
    # A bundled runtime resolves to the folder's copy, not to the one stagegraph installed.
    resolved = subprocess.run(["ldd", str(exe)], env={"PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    for lib in data["runtime"]:
        if lib["file"]:
            assert f"{lib['name']} => {folder / lib['file']}" in resolved, resolved


@pytest.mark.parametrize("case", list(CASES))
def test_cpp_program_links_the_object_file(artifacts, case, tmp_path):
    """g++, the descriptor form, and the object file linked into the program itself."""
    folder, workload = artifacts[case]
    data = manifest(folder)
    (tmp_path / "prog.cpp").write_text(cpp_program(data))
    exe = tmp_path / "prog_cpp"
    compile_program(["g++", "-std=c++17", "-Wall", "-Werror", str(tmp_path / "prog.cpp"),
                     f"-I{folder}", str(folder / data["object"]), *runtime_flags(folder, data),
                     "-o", str(exe)])  # fmt: skip
    outputs = run_program(exe, tmp_path, data, workload.inputs())
    verdict = workload.verify(outputs)
    assert verdict.ok, verdict.message


def global_symbols(path: Path, dynamic: bool) -> set[str]:
    cmd = ["nm", "-g", "--defined-only", *(["-D"] if dynamic else []), str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


@pytest.mark.parametrize("case", list(CASES))
def test_only_the_entry_symbols_are_global(artifacts, case):
    folder, _ = artifacts[case]
    data = manifest(folder)
    expected = {data["entry"]["symbol"], data["entry"]["ciface_symbol"]}
    assert global_symbols(folder / data["library"], dynamic=True) == expected
    assert global_symbols(folder / data["object"], dynamic=False) == expected
    assert "main" not in expected


def test_multithreaded_artifact_carries_its_openmp_runtime(artifacts):
    folder, _ = artifacts["matmul"]
    data = manifest(folder)
    assert data["threads"] == 2
    assert {"name": "libiomp5.so", "purpose": "openmp", "file": "libiomp5.so"} in data["runtime"]
    assert (folder / "libiomp5.so").is_file()
    dynamic = subprocess.run(["readelf", "-d", str(folder / data["library"])],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "[$ORIGIN]" in dynamic and "[libiomp5.so]" in dynamic
    single = manifest(artifacts["mlp"][0])
    assert single["threads"] == 1 and all(r["purpose"] != "openmp" for r in single["runtime"])


def test_manifest_describes_the_call(artifacts):
    data = manifest(artifacts["two_results"][0])
    assert [(v["name"], v["position"], v["shape"]) for v in values(data)] == [
        ("in0", 0, [8, 16]), ("in1", 1, [16]), ("out0", 2, [8, 16]), ("out1", 3, [8])]  # fmt: skip
    assert data["entry"]["symbol"] == "stagegraph_two_results"
    bf16 = manifest(artifacts["bf16"][0])
    assert [v["dtype"] for v in values(bf16)] == ["bf16", "bf16", "f32"]
    assert bf16["producer"]["graph"] == "x86" and bf16["reduction_length"] == 64
    header = (artifacts["bf16"][0] / bf16["header"]).read_text()
    assert (
        "void stagegraph_matmul(const uint16_t *in0, const uint16_t *in1, float *out0);" in header
    )
