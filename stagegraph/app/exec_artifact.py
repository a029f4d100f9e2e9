"""``stagegraph exec``: run an artifact folder on the user's arrays, check it, time it.

Inputs come from ``.npy`` files (one per argument, in order) or, with none given, from the
``in0, in1, ...`` arrays of the ``--check`` reference ``.npz`` (the KernelBench layout,
whose expected results are ``out0, ...``). Timing calls the library from Python through
ctypes on fixed buffers and samples until the median is known, with the sampling loop
``bench`` uses (:func:`~stagegraph.runtime.stats.collect_samples`): unlike ``bench``, whose
timed loop is compiled into the module, each sample includes the ctypes call (microseconds).
Nothing here imports MLIR: the folder alone is run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from stagegraph.app.bench_options import BenchOptions
from stagegraph.core.ports import Schema
from stagegraph.errors import ArtifactError
from stagegraph.runtime.stats import Stats


class ExecReport(Schema):
    """What ``stagegraph exec`` did (its ``--json`` output)."""

    directory: str
    name: str
    inputs: list[str]
    outputs: list[str] = Field(default_factory=list)
    verified: bool | None = None
    message: str = ""
    max_abs_error: float | None = None
    run_seconds: float
    timing: Stats | None = None
    converged: bool | None = None
    warning: str = ""


def read_array(path: str | Path) -> np.ndarray:
    """One ``.npy`` array.

    Raises:
        ArtifactError: missing or not a numpy array file.
    """
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise ArtifactError(f"{path}: cannot read a .npy array ({error})") from None
    if not isinstance(array, np.ndarray):
        raise ArtifactError(f"{path}: holds several arrays; pass one .npy file per --input")
    return array


def read_reference(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of a reference ``.npz`` by name.

    Raises:
        ArtifactError: missing or not an ``.npz``.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ArtifactError(f"{path}: a reference is an .npz file (out0, out1, ...)")
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as error:
        raise ArtifactError(f"{path}: cannot read a reference .npz ({error})") from None


def gather_inputs(
    artifact: Any, input_files: Sequence[str], reference: dict[str, np.ndarray] | None, ref: str
) -> tuple[list[np.ndarray], list[str]]:
    """The inputs in order and where each came from (checked against the manifest)."""
    if input_files:
        arrays = [read_array(f) for f in input_files]
        sources = [str(f) for f in input_files]
    elif reference is not None:
        names = [v.name for v in sorted(artifact.manifest.arguments, key=lambda v: v.position)]
        absent = [n for n in names if n not in reference]
        if absent:
            raise ArtifactError(
                f"{ref}: no --input given and the reference lacks {', '.join(absent)}; pass "
                "one --input FILE.npy per argument"
            )
        arrays = [reference[n] for n in names]
        sources = [f"{ref}:{n}" for n in names]
    else:
        raise ArtifactError(
            f"{artifact.directory}: give one --input FILE.npy per argument "
            f"({len(artifact.manifest.arguments)}), or --check REF.npz holding in0, in1, ..."
        )
    return artifact.check_inputs(arrays, sources), sources


def expected_results(reference: dict[str, np.ndarray], count: int, ref: str) -> list[np.ndarray]:
    """The ``count`` expected results: ``out0, out1, ...``, or in a KernelBench reference
    of a training-mode norm, the updated statistics ``mut0, ...`` and then ``out0, ...``.

    Raises:
        ArtifactError: neither layout holds ``count`` arrays.
    """
    muts = [f"mut{i}" for i in range(count) if f"mut{i}" in reference]
    for names in (
        [f"out{i}" for i in range(count)],
        [*muts, *(f"out{i}" for i in range(count - len(muts)))],
    ):
        if all(name in reference for name in names):
            return [reference[name] for name in names]
    lacking = ", ".join(f"out{i}" for i in range(count) if f"out{i}" not in reference)
    raise ArtifactError(f"{ref}: the artifact has {count} results and the file lacks {lacking}")


def check_outputs(
    artifact: Any, inputs: Sequence[Any], outputs: list[np.ndarray], reference: dict, ref: str
) -> Any:
    """The verdict of ``outputs`` against the ``out<i>`` arrays of the reference, by the
    workloads' criterion (:mod:`stagegraph.workload.verify`): the manifest's reduction
    length, and the largest RMS of the float inputs as the floor of each output's scale."""
    from stagegraph.dtypes import decode, is_float
    from stagegraph.workload.tensors import TensorSpec
    from stagegraph.workload.verify import compare, rms

    manifest = artifact.manifest
    results = sorted(manifest.results, key=lambda v: v.position)
    expected = expected_results(reference, len(results), ref)
    specs = sorted(manifest.arguments, key=lambda v: v.position)
    floor = max(
        (rms(decode(np.asarray(a), v.dtype)) for a, v in zip(inputs, specs, strict=True)
         if is_float(v.dtype)),
        default=0.0,
    )  # fmt: skip
    return compare(
        outputs,
        expected,
        [TensorSpec(shape=tuple(v.shape or ()), dtype=v.dtype) for v in results],
        reduction_length=manifest.reduction_length,
        magnitudes=[floor] * len(results),
        who=str(artifact.directory),
    )


def execute_artifact(
    directory: str | Path,
    input_files: Sequence[str] = (),
    *,
    output_files: Sequence[str] = (),
    check: str | None = None,
    bench: BenchOptions | None = None,
) -> ExecReport:
    """Run the artifact in ``directory``; save, check and time its outputs as asked.

    Raises:
        ArtifactError: a bad folder, manifest, input or reference (named in the message).
        TargetNotRunnableError: this host lacks the ISA features the code was built for.
        GpuUnavailableError: a cuda artifact (its manifest valid) and no GPU here.
    """
    artifact = open_artifact(directory)
    try:
        return _execute(directory, artifact, input_files, output_files, check, bench)
    finally:
        getattr(artifact, "close", lambda: None)()


def open_artifact(directory: str | Path) -> Any:
    """The artifact folder loaded by its manifest's kind: CPU code for this host, or
    (validated first) GPU code, which needs an NVIDIA GPU here.

    Raises:
        ArtifactError, TargetNotRunnableError, GpuUnavailableError: what the kind's runner
            refuses.
    """
    from stagegraph.artifact.manifest_json import load_manifest_dict

    if load_manifest_dict(directory)["kind"] == "cuda":
        from stagegraph.artifact.cuda_runner import CudaArtifact

        return CudaArtifact(directory)
    from stagegraph.artifact.runner import CpuArtifact
    from stagegraph.stages.target import detect_target

    return CpuArtifact(directory, detect_target().isa)


def _execute(
    directory: str | Path,
    artifact: Any,
    input_files: Sequence[str],
    output_files: Sequence[str],
    check: str | None,
    bench: BenchOptions | None,
) -> ExecReport:
    reference = read_reference(check) if check else None
    inputs, sources = gather_inputs(artifact, input_files, reference, str(check))
    results = artifact.manifest.results
    if output_files and len(output_files) != len(results):
        raise ArtifactError(
            f"{directory}: the artifact has {len(results)} results; give as many --output "
            f"files, got {len(output_files)}"
        )
    start = time.perf_counter()
    outputs = artifact.call(inputs)
    seconds = time.perf_counter() - start
    for path, array in zip(output_files, outputs, strict=False):
        np.save(path, array)
    fields: dict[str, Any] = {}
    if reference is not None:
        verdict = check_outputs(artifact, inputs, outputs, reference, str(check))
        fields.update(verified=verdict.ok, message=verdict.message,
                      max_abs_error=verdict.max_abs_error)  # fmt: skip
    if bench is not None:
        fields.update(time_artifact(artifact, inputs, bench))
    return ExecReport(
        directory=str(directory),
        name=artifact.manifest.name,
        inputs=sources,
        outputs=[str(p) for p in output_files],
        run_seconds=seconds,
        **fields,
    )


def time_artifact(artifact: Any, inputs: list[Any], options: BenchOptions) -> dict[str, Any]:
    """Samples of one call each, until the median's interval is tight or the budget ends."""
    from stagegraph.runtime.stats import assess, collect_samples, summarize

    run, _outputs = artifact.bind(inputs)
    for _ in range(options.warmup):
        run()

    def measure(count: int) -> np.ndarray:
        samples = np.empty(count)
        for i in range(count):
            start = time.perf_counter()
            run()
            samples[i] = time.perf_counter() - start
        return samples

    samples, converged = collect_samples(
        measure,
        rel_halfwidth=options.rel_halfwidth,
        budget_s=options.budget_s,
        min_samples=max(2, options.repeat),
        min_time_s=options.min_time_s,
    )
    stats = summarize(samples)
    return {"timing": stats, "converged": converged, "warning": assess(stats).warning}
