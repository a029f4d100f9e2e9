"""Passes over memory and speed against PyTorch eager, per payload: what fusion changes.

For each workload (a ``.mlir`` payload, a ``FILE.py[:name=value,...]`` problem file or a
``package.module:factory``) the script prints the passes over memory of the x86 graph's
code (:func:`stagegraph.app.memory_passes.payload_memory_passes`: loops that stream a buffer
larger than a cache-resident tile) and the time of x86 against eager PyTorch, measured
interleaved in one run (``bench --vs torch``; for a ``.mlir`` payload, against its problem
file in ``../src/levelN`` when there is one, else the passes alone). The table names the
host CPU and the thread count. Usage:

    python benchmarks/fusion.py ../shared/kernelbench/src/level3/l3_009_ResNet18.py:batch_size=1
    python benchmarks/fusion.py --eval ../shared/kernelbench/src/level3/l3_015_DenseNet121.py
    python benchmarks/fusion.py --passes-only ../shared/kernelbench/level2/*.mlir

``--eval`` runs each problem file's model in eval mode (BatchNorm with its running
statistics, as a model serves; KernelBench builds models in training mode), through a
factory module written to a temporary directory. ``--no-fold`` measures the x86 graph
without the BatchNorm fold (``stages.common.fold_batchnorm``), ``--two-pass-stats``
without a norm's statistics in one pass (``stages.x86.generic.batch_stats``),
``--unfused-rows`` without softmax-shaped row chains as one kernel per row
(``stages.x86.generic.row_chains``), each for a before/after pair.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

EVAL_FACTORY = """
from pathlib import Path

from stagegraph.workload.torch_source import load_problem_file, parse_value


def make():
    problem = load_problem_file(Path({path!r}), {{k: parse_value(v) for k, v in {overrides!r}}},
                                0)
    return problem.model.eval(), tuple(problem.inputs)
"""


def eval_spec(spec: str, directory: Path, index: int) -> str:
    """A factory spec for ``spec`` (a ``FILE.py[:k=v,...]`` problem file) in eval mode."""
    path, _, rest = spec.partition(":")
    overrides = [tuple(item.split("=", 1)) for item in rest.split(",") if "=" in item]
    package = directory / "sg_fusion_eval"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    module = f"m{index}"
    text = EVAL_FACTORY.format(path=str(Path(path).resolve()), overrides=overrides)
    (package / f"{module}.py").write_text(text)
    return f"sg_fusion_eval.{module}:make"


def torch_spec(spec: str) -> str | None:
    """What ``--vs torch`` can time for ``spec``: itself, or a shipped ``.mlir`` payload's
    problem file in ``../src/levelN`` at the payload's scaled sizes (None: no PyTorch
    side)."""
    if not spec.endswith(".mlir"):
        return spec
    from kernelbench_torch_coverage import payload_problem_spec

    return payload_problem_spec(Path(spec))


def measure(spec: str, label: str, options: argparse.Namespace) -> dict[str, Any]:
    from stagegraph import api
    from stagegraph.app.memory_passes import payload_memory_passes

    row: dict[str, Any] = {"payload": label, "passes": None, "ratio": None, "error": ""}
    try:
        row["passes"] = payload_memory_passes(spec, threads=options.threads).total
        timed = None if options.passes_only else torch_spec(spec)
        if timed is not None:
            result = api.bench("x86", timed, vs="torch", threads=options.threads,
                               budget=options.budget)  # fmt: skip
            if getattr(result, "ratio", None) is not None:
                row.update(x86_ms=result.a.median_s * 1e3, torch_ms=result.b.median_s * 1e3,
                           ratio=1 / result.ratio)  # fmt: skip
    except Exception as exc:  # one payload's failure is reported, the table goes on
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=3.0)
    parser.add_argument("--eval", action="store_true", help="problem files in eval mode")
    parser.add_argument("--no-fold", action="store_true", help="without the BatchNorm fold")
    parser.add_argument("--passes-only", action="store_true", help="count, do not time")
    parser.add_argument("--two-pass-stats", action="store_true",
                        help="norm statistics as imported (three reductions)")  # fmt: skip
    parser.add_argument("--unfused-rows", action="store_true",
                        help="softmax rows as imported (four ops, five passes)")  # fmt: skip
    options = parser.parse_args(argv)
    if options.no_fold:
        from stagegraph.stages.common import fold_batchnorm

        fold_batchnorm.fold_channel_affine_chains = lambda module: 0
    if options.two_pass_stats:
        from stagegraph.stages.x86.generic import batch_stats

        batch_stats.one_pass_statistics = lambda module: 0
    if options.unfused_rows:
        from stagegraph.stages.x86.generic import row_chains

        row_chains.fuse_row_chains = lambda fn, lanes: 0
    from stagegraph.app.host import host_info

    host = host_info()
    print(f"# host {host.cpu_model} ({host.target}); {options.threads} thread(s); x86 graph"
          f"{' without the BatchNorm fold' if options.no_fold else ''}"
          f"{' with two-pass norm statistics' if options.two_pass_stats else ''}"
          f"{' with unfused softmax rows' if options.unfused_rows else ''} vs PyTorch eager"
          f"{' (models in eval mode)' if options.eval else ''}; measured side by side")  # fmt: skip
    print(f"{'payload':60} {'passes':>6} {'x86 ms':>9} {'torch ms':>9} {'torch/x86':>9}")
    with tempfile.TemporaryDirectory() as scratch:
        sys.path.insert(0, scratch)
        for index, spec in enumerate(options.workloads):
            label = spec.rsplit("/", 1)[-1]
            use = eval_spec(spec, Path(scratch), index) if options.eval else spec
            row = measure(use, label, options)
            if row["error"]:
                print(f"{label:60} {'-':>6} {row['error']}")
                continue
            timed = (f"{row['x86_ms']:9.3f} {row['torch_ms']:9.3f} {row['ratio']:9.2f}"
                     if row["ratio"] is not None else f"{'-':>9} {'-':>9} {'-':>9}")  # fmt: skip
            print(f"{label:60} {row['passes']:>6} {timed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
