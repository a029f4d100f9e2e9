"""Pass-pipeline stages: textual pass pipelines run by the PassManager.

The named stages (``bufferize``, ``linalg_to_loops``, ``lower_to_llvm``) carry the IR level
they expect and produce, so the graph type-checks where in the flow they can go.
"""

from __future__ import annotations

from typing import Literal

from stagegraph.core.ports import AnyModule, BufferModule, Config, LLVMModule, Module, TensorModule
from stagegraph.core.stage import stage
from stagegraph.mlir.diagnostics import VERIFY_PASSES
from stagegraph.mlir.pipelines import anchored
from stagegraph.stages.common import lowering
from stagegraph.stages.common.rewrites import (
    copies_to_linalg,
    decompose_aggregated_ops,
    define_bf16_builtins,
    expand_bf16_truncation,
    split_fresh_deallocations,
    split_shared_empties,
    write_results_in_place,
)


class PipelineConfig(Config):
    """A pass pipeline: bare (``canonicalize,cse``, run nested in ``builtin.module(...)``)
    or anchored the mlir-opt way (``builtin.module(canonicalize,cse)``)."""

    pipeline: str = ""

    def static_problems(self) -> list[str]:
        """The pipeline does not parse (an unknown pass or option). A stage's own default
        pipeline is the project's, tested with it: not parsing it keeps ``validate`` of the
        shipped graphs from loading MLIR."""
        from stagegraph.mlir.pipelines import pipeline_problem

        if (
            not self.pipeline.strip()
            or self.pipeline == type(self).model_fields["pipeline"].default
        ):
            return []
        problem = pipeline_problem(anchored(self.pipeline))
        return [f"pass pipeline {self.pipeline!r} does not parse: {problem}"] if problem else []


Level = Literal["tensor", "buffer", "llvm", "any"]

#: Passes that change the IR level, in the order a flow meets them: (pass, takes, gives).
LEVEL_PASSES = (
    ("one-shot-bufferize", "tensor", "buffer"),
    ("finalize-memref-to-llvm", "buffer", "llvm"),
    ("convert-to-llvm", "buffer", "llvm"),
    ("convert-func-to-llvm", "buffer", "llvm"),
)


def infer_levels(pipeline: str) -> tuple[str | None, str | None]:
    """IR levels (taken, given) a pipeline implies by its level-changing passes; None for
    what its passes do not tell (``canonicalize,cse`` runs at any level)."""
    import re

    names = re.findall(r"[\w.-]+", pipeline)
    found = [(takes, gives) for name in names for p, takes, gives in LEVEL_PASSES if name == p]
    if not found:
        return None, None
    return found[0][0], found[-1][1]


class GenericPipelineConfig(PipelineConfig):
    """Any pass pipeline, with the IR levels it takes and gives: ``takes``/``gives`` when
    given, else inferred from its passes (``one-shot-bufferize``: tensor to buffer,
    ``convert-to-llvm``/``finalize-memref-to-llvm``: to llvm), else the level fed in."""

    takes: Level | None = None
    gives: Level | None = None

    def port_levels(self) -> tuple[str | None, str | None]:
        takes, gives = infer_levels(self.pipeline)
        return self.takes or takes, self.gives or gives


def run_pipeline(module: Module, pipeline: str) -> Module:
    """Run ``pipeline`` on the module in place, then verify the result (an empty pipeline
    only verifies).

    The pass manager's own verifier is off (unless :data:`VERIFY_PASSES`): it verifies the
    whole module after every pass, which on a large module cost as much as the passes
    themselves (an unrolled LSTM's lowering to LLVM: 4.3 s with it, 2.1 s without). The
    result is verified once instead.

    Raises:
        ir.MLIRError: the pipeline's result does not verify (with the verifier's diagnostics).
    """
    from stagegraph.mlir.bindings import passmanager

    if pipeline.strip():
        manager = passmanager.PassManager.parse(anchored(pipeline), context=module.ir.context)
        manager.enable_verifier(VERIFY_PASSES.get())
        manager.run(module.ir.operation)
    if not module.ir.operation.verify():  # these bindings raise ir.MLIRError, with its diagnostics
        raise ValueError(f"the module does not verify after {pipeline or 'nothing'!r}")
    return module


#: ``buffer-deallocation-pipeline`` in two halves (as this MLIR expands it), so that
#: :func:`~stagegraph.stages.common.rewrites.split_fresh_deallocations` runs between them.
DEALLOCATION_PIPELINE = "buffer-deallocation-pipeline"
PLACE_DEALLOCATIONS = (
    "expand-realloc{emit-deallocs=false},canonicalize,ownership-based-buffer-deallocation,"
    "canonicalize"
)
LOWER_DEALLOCATIONS = (
    "buffer-deallocation-simplification,bufferization-lower-deallocations,cse,canonicalize"
)


def run_lowering(module: Module, pipeline: str) -> Module:
    """:func:`run_pipeline`, except that a top-level ``buffer-deallocation-pipeline`` in
    ``pipeline`` runs in its two halves with
    :func:`~stagegraph.stages.common.rewrites.split_fresh_deallocations` between them: the
    same deallocations, without the simplification's comparison of every pair of buffers
    one block allocates."""
    parts = pipeline.split(",")
    if DEALLOCATION_PIPELINE not in parts:
        return run_pipeline(module, pipeline)
    at = parts.index(DEALLOCATION_PIPELINE)
    before, after = ",".join(parts[:at]), ",".join(parts[at + 1 :])
    if before.count("(") != before.count(")"):  # nested in an op's pipeline: leave it
        return run_pipeline(module, pipeline)
    run_pipeline(module, ",".join(p for p in (before, PLACE_DEALLOCATIONS) if p))
    split_fresh_deallocations(module.ir)
    return run_pipeline(module, ",".join(p for p in (LOWER_DEALLOCATIONS, after) if p))


@stage("passes", name="pipeline")
def pipeline(module: AnyModule, config: GenericPipelineConfig) -> AnyModule:
    """Any textual pass pipeline, at the IR levels its config declares or its passes imply.

    ``takes``/``gives`` (tensor, buffer, llvm) type this instance's ports; without them
    they come from the passes (``one-shot-bufferize`` takes tensors and gives buffers,
    ``convert-to-llvm`` gives llvm), and a pipeline that does not change the level passes
    on the level fed into it.

    A pipeline that bufferizes (takes tensors, gives buffers or LLVM) gets what the built-in
    ``bufferize`` stage does around its passes, however it bufferizes: public functions
    record their calling convention first (runners need it after lowering) and their
    tensor arguments become read-only (no run may write the caller's arrays); after a
    tensor-to-buffer pipeline, results still returned as memrefs become out-parameters (the
    convention recorded).
    """
    takes, gives = config.port_levels()
    bufferizes = (takes or module.level) == "tensor" and gives in ("buffer", "llvm")
    if bufferizes:
        prepare_bufferization(module)
    module = run_pipeline(module, config.pipeline)
    if bufferizes and gives == "buffer" and returns_buffers(module.ir):
        run_pipeline(module, lowering.RESULTS_TO_OUT_PARAMS)
    return module


def prepare_bufferization(module: Module) -> None:
    """What every bufferization of a payload needs first: recorded public signatures, one
    ``tensor.empty`` per few users (bufferizing stays linear), read-only tensor arguments."""
    record_public_signatures(module)
    split_shared_empties(module.ir)
    inputs_read_only(module.ir)


def returns_buffers(module) -> bool:
    """Whether a public function of the module returns a memref (not yet an out-parameter)."""
    from stagegraph.mlir.bindings import ir

    for op in module.body.operations:
        if op.operation.name != "func.func" or "sym_visibility" in op.attributes:
            continue
        kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        if any(isinstance(t, ir.MemRefType) for t in kind.results):
            return True
    return False


@stage("passes", name="verify")
def verify(module: TensorModule, config: PipelineConfig) -> TensorModule:
    """The payload as given, verified (and optionally cleaned up by ``pipeline``); named
    aggregates such as ``linalg.softmax`` decomposed into the generic ops they stand for,
    so every later stage (analysis, schedules, lowering to loops) sees only ops it knows.
    A tensor of no elements is refused here (:mod:`.empty_tensors`)."""
    from stagegraph.stages.common.empty_tensors import refuse_empty_tensors

    refuse_empty_tensors(module.ir)
    decompose_aggregated_ops(module.ir)
    return run_pipeline(module, config.pipeline)


class BufferizeConfig(PipelineConfig):
    pipeline: str = lowering.BUFFERIZE


@stage("passes", name="bufferize")
def bufferize(module: TensorModule, config: BufferizeConfig) -> BufferModule:
    """Tensors to memrefs; results become caller-allocated out-parameters.

    Before that, every public function records its calling convention (which arguments
    are outputs), so runners can call the binary without the tensor-level IR; and no
    ``tensor.empty`` keeps more than a few users (:func:`split_shared_empties`: bufferizing
    stays linear in the number of ops); tensor arguments are read-only
    (:func:`inputs_read_only`). After it, results returned through reshapes are
    written straight into their out-parameters (:func:`write_results_in_place`), not
    copied there.
    """
    prepare_bufferization(module)
    module = run_pipeline(module, config.pipeline)
    write_results_in_place(module.ir)
    return module


WRITABLE_ATTR = "bufferization.writable"


def inputs_read_only(module) -> int:
    """Mark every tensor argument of the module's public functions not writable; returns
    how many were marked.

    A tensor argument is a value: a payload whose op accumulates into it (``linalg.matmul
    outs(%c)`` with ``%c`` an argument) must not write the caller's array. Left writable,
    one-shot bufferization computes in place in the argument's buffer and copies the result
    out: every call then changed its own input (the reference run's and the checked run's
    results differed). Marked, it copies the argument first.
    """
    from stagegraph.mlir.bindings import ir

    marked = 0
    for op in module.body.operations:
        if op.operation.name != "func.func" or not op.regions[0].blocks:
            continue
        attrs = op.operation.attributes
        if "sym_visibility" in attrs and ir.StringAttr(attrs["sym_visibility"]).value == "private":
            continue
        arguments = op.regions[0].blocks[0].arguments
        old = list(ir.ArrayAttr(attrs["arg_attrs"])) if "arg_attrs" in attrs else []
        new = []
        for i, argument in enumerate(arguments):
            entries = {n.name: n.attr for n in ir.DictAttr(old[i])} if i < len(old) else {}
            if isinstance(argument.type, ir.RankedTensorType) and WRITABLE_ATTR not in entries:
                entries[WRITABLE_ATTR] = ir.BoolAttr.get(False)
                marked += 1
            new.append(ir.DictAttr.get(entries))
        attrs["arg_attrs"] = ir.ArrayAttr.get(new)
    return marked


def record_public_signatures(module: Module) -> None:
    from stagegraph.errors import SignatureError
    from stagegraph.runtime.memref import SIGNATURE_ATTR, record_signature

    for op in module.ir.body.operations:
        if op.operation.name != "func.func" or not op.regions[0].blocks:
            continue
        visibility = (
            op.attributes["sym_visibility"].value if "sym_visibility" in op.attributes else ""
        )
        if visibility != "private" and SIGNATURE_ATTR not in op.attributes:
            try:
                record_signature(module.ir, op.attributes["sym_name"].value)
            except SignatureError:
                continue  # not callable from numpy (e.g. scalar results): not an entry


class LoopsConfig(PipelineConfig):
    pipeline: str = lowering.LINALG_TO_LOOPS


@stage("passes", name="linalg_to_loops")
def linalg_to_loops(module: BufferModule, config: LoopsConfig) -> BufferModule:
    """Linalg ops on buffers (and strided copies) to scalar loops: the naive lowering."""
    copies_to_linalg(module.ir)
    return run_pipeline(module, config.pipeline)


class LowerConfig(PipelineConfig):
    pipeline: str = lowering.LOWER_TO_LLVM


@stage("passes", name="lower_to_llvm")
def lower_to_llvm(module: BufferModule, config: LowerConfig) -> LLVMModule:
    """Buffers, loops and vectors to the LLVM dialect.

    Copies become loops first: the wheel has no ``memrefCopy`` runtime to call; and bf16
    truncations become integer rounding (no ``__truncsfbf2`` builtin is linked).
    """
    if copies_to_linalg(module.ir):
        run_pipeline(module, lowering.LINALG_TO_LOOPS)
    lowering.require_lowerable(
        module.ir, "the stage that produced this stage's input (e.g. linalg_to_loops)"
    )
    expand_bf16_truncation(module.ir)
    define_bf16_builtins(module.ir)
    run_lowering(module, config.pipeline)
    lowering.require_llvm_level(module.ir, "this lowering stage")
    return module
