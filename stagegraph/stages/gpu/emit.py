"""The GPU emit stage: PTX per kernel and the host-side plan, as one artifact.

Each ``gpu.module`` is translated to LLVM IR in MLIR and compiled to PTX by llvmlite
(:mod:`stagegraph.stages.gpu.ptx`); the host function becomes the plan
(:mod:`stagegraph.stages.gpu.plan`). The result, :class:`CudaBinary`, holds a manifest as
plain dicts (kind ``cuda`` of the artifact format, :mod:`stagegraph.artifact.manifest`:
built through :class:`~stagegraph.artifact.manifest.CudaManifest`, so a plan the schema
refuses fails here at compile time, not on the GPU machine) that the MLIR-free runtime runs
(:mod:`stagegraph.runtime.cuda`); with ``output`` set it is also written to that folder
(``manifest.json``, one ``.ptx`` per module, one ``.npy`` per constant), to be copied to a
GPU machine and run there (``stagegraph exec``, ``benchmarks/gpu_check.py --run``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from stagegraph.core.ports import AnyModule, Binary, Config
from stagegraph.core.stage import stage
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.gpu.target import GpuTarget


class CudaBinary(Binary):
    """Kernels (PTX text), the plan and the constants; ``call`` runs them on the GPU."""

    def __init__(self, key: str, manifest: dict[str, Any], ptx: dict[str, str],
                 constants: dict[str, np.ndarray]) -> None:  # fmt: skip
        super().__init__(key)
        self.manifest, self.ptx, self.constants = manifest, ptx, constants
        self.path: str | None = None

    def call(self, entry: str, inputs: list[Any]) -> list[np.ndarray]:
        """Run on the first GPU present (inputs as numpy arrays); returns the results.

        Raises:
            GpuUnavailableError: no GPU on this machine (compiling and ``--emit`` still work).
        """
        from stagegraph.runtime.cuda import CudaProgram

        program = CudaProgram(self.manifest, self.ptx, self.constants)
        try:
            return program.run([np.asarray(x) for x in inputs])
        finally:
            program.close()

    def benchmark(self, entry: str, inputs: list[Any], warmup: int, repeat: int) -> np.ndarray:
        """Seconds per run of the launches (inputs uploaded once), timed by CUDA events:
        what ``bench`` samples for the GPU graph instead of a spliced CPU timing loop."""
        from stagegraph.runtime.cuda import CudaProgram

        program = CudaProgram(self.manifest, self.ptx, self.constants)
        try:
            program.upload([np.asarray(x) for x in inputs])
            milliseconds = program.time_ms(repeats=repeat, warmup=warmup)
        finally:
            program.close()
        return np.asarray(milliseconds) / 1e3

    def write(self, folder: str | Path) -> Path:
        """Write the artifact folder: manifest, PTX files and constants."""
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        for name, text in self.ptx.items():
            (root / f"{name}.ptx").write_text(text)
        for name, value in self.constants.items():
            np.save(root / f"{name}.npy", value)
        (root / "manifest.json").write_text(json.dumps(self.manifest, indent=1) + "\n")
        self.path = str(root)
        return root


def producer(workload: str) -> dict[str, Any]:
    """What built the artifact (for reproducing it, not for running it)."""
    from importlib.metadata import PackageNotFoundError, version

    from stagegraph.mlir.bindings import ROOT

    try:
        ours = version("stagegraph")
    except PackageNotFoundError:
        ours = "unknown"
    return {"stagegraph": ours, "mlir": ROOT, "graph": "gpu", "workload": workload,
            "params": None}  # fmt: skip


def kernel_modules(module: Any) -> list[Any]:
    """The ``gpu.module`` ops of the lowered module."""
    return [op.operation for op in module.body.operations if op.operation.name == "gpu.module"]


def kernel_llvm_ir(gpu_module: Any) -> tuple[str, list[str]]:
    """LLVM IR of one ``gpu.module`` (its body, in a plain module) and its kernel names."""
    from stagegraph.mlir.bindings import dialect, ir

    context = gpu_module.context
    with context, ir.Location.unknown(context):
        holder = ir.Module.create()
        names = []
        for op in gpu_module.regions[0].blocks[0].operations:
            op.operation.clone(ir.InsertionPoint(holder.body))
            if "gpu.kernel" in op.operation.attributes:
                names.append(ir.StringAttr(op.operation.attributes["sym_name"]).value)
    return dialect("llvm").translate_module_to_llvmir(holder.operation), names


def kernel_arities(gpu_module: Any) -> dict[str, int]:
    """The number of parameters of each kernel (``llvm.func`` with ``gpu.kernel``)."""
    from stagegraph.mlir.bindings import ir

    found = {}
    for op in gpu_module.regions[0].blocks[0].operations:
        if "gpu.kernel" in op.operation.attributes:
            name = ir.StringAttr(op.operation.attributes["sym_name"]).value
            found[name] = len(op.operation.regions[0].blocks[0].arguments)
    return found


def marshalled_arity(args: list[dict[str, Any]]) -> int:
    """Parameters the runtime passes for a launch's arguments: a buffer view as allocated
    and aligned pointers, offset, sizes and strides; a scalar as itself."""
    return sum(3 + 2 * len(a["sizes"]) if "buffer" in a else 1 for a in args)


def check_launches(steps: list[dict[str, Any]], arities: dict[str, int]) -> None:
    """Every launch passes as many parameters as its kernel takes.

    Raises:
        EmitError: the host plan and a kernel's signature disagree (a lowering bug).
    """
    from stagegraph.errors import EmitError

    for step in (s for s in steps if s["op"] == "launch"):
        want, given = arities[step["kernel"]], marshalled_arity(step["args"])
        if want != given:
            raise EmitError(
                f"stage gpu.emit: kernel {step['kernel']} takes {want} parameters, but its "
                f"launch in the host plan passes {given}"
            )


class GpuEmitConfig(Config):
    """``output``: a folder to write the artifact to (else it stays in memory);
    ``workload``: the workload's spec, recorded in the manifest's ``producer``."""

    output: str | None = None
    workload: str = ""


def validated_manifest(fields: dict[str, Any]) -> dict[str, Any]:
    """The ``cuda`` manifest as JSON-able dicts, after the schema accepted it.

    Raises:
        EmitError: the plan breaks the artifact schema (a lowering bug; the first problems
            are named).
    """
    from pydantic import ValidationError

    from stagegraph.artifact.manifest import CudaManifest
    from stagegraph.errors import EmitError

    try:
        manifest = CudaManifest.model_validate(fields)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5]
        )
        raise EmitError(
            f"stage gpu.emit: the manifest of {fields.get('name')!r} breaks the cuda artifact "
            f"schema: {problems}"
        ) from None
    return manifest.model_dump(mode="json")


@stage("emit", name="gpu.emit")
def gpu_emit(
    module: AnyModule, target: GpuTarget, config: GpuEmitConfig, facts: PayloadFacts | None = None
) -> Binary:
    """PTX for every kernel (for the target's architecture) and the host plan.

    ``facts`` (the payload's analysis) gives the manifest its ``reduction_length``, so that
    ``stagegraph exec --check`` on a machine with a GPU judges a long reduction's rounding
    at its length, as the CPU artifact's checker does."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import function_name, payload_functions, select_entry
    from stagegraph.stages.gpu.plan import host_plan
    from stagegraph.stages.gpu.ptx import llvm_ir_to_ptx

    ptx: dict[str, str] = {}
    entries: dict[str, str] = {}
    arities: dict[str, int] = {}
    for gpu_module in kernel_modules(module.ir):
        module_name = ir.StringAttr(gpu_module.attributes["sym_name"]).value
        for kernel, arity in kernel_arities(gpu_module).items():
            arities[f"{module_name}__{kernel}"] = arity
        llvm_ir, kernels = kernel_llvm_ir(gpu_module)
        text = llvm_ir_to_ptx(llvm_ir, target.arch, kernels)
        for kernel in kernels:
            entries[f"{module_name}__{kernel}"] = module_name
        ptx[module_name] = text
    entry = function_name(select_entry(payload_functions(module.ir)))
    plan = host_plan(module.ir, entry)
    check_launches(plan.steps, arities)
    kernels = [
        {"name": name, "ptx": f"{entries[name]}.ptx", "entry": name.split("__", 1)[1],
         "launch": plan.launches[name]}
        for name in plan.launches
    ]  # fmt: skip
    manifest = validated_manifest({
        "kind": "cuda",
        "name": entry,
        "producer": producer(config.workload),
        "target": {"name": target.arch, "sm": target.sm},
        "arguments": plan.arguments,
        "results": plan.results,
        "kernels": kernels,
        "constants": {name: f"{name}.npy" for name in plan.constants},
        "plan": plan.steps,
        "reduction_length": max(1, facts.reduction_length) if facts is not None else 1,
    })  # fmt: skip
    key = module.content_hash() + target.content_hash()
    binary = CudaBinary(key, manifest, ptx, plan.constants)
    if not config.output:
        return binary
    written = Binary(key)  # an emitted artifact: written, not run here (as --emit object)
    written.path = str(binary.write(config.output))  # type: ignore[attr-defined]
    return written
