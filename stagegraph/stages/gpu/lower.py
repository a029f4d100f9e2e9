"""GPU lowering: block/thread foralls to ``gpu.launch``, kernels outlined into
``gpu.module``s and lowered there to the LLVM and NVVM dialects.

The host function keeps its buffers and gets ``gpu.launch_func`` ops: what
:mod:`stagegraph.stages.gpu.plan` reads into the host-side plan. Each block forall becomes
its own launch (``transform.gpu.map_forall_to_blocks``), its thread foralls the block's
threads (``transform.gpu.map_nested_forall_to_threads``, block dims from the params).
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.ports import AnyModule, BufferModule, Config
from stagegraph.core.stage import stage
from stagegraph.stages.gpu.params import GpuParams
from stagegraph.stages.gpu.schedule import OP_ATTR
from stagegraph.stages.gpu.target import GpuTarget

LAUNCH_ATTR = "stagegraph.gpu_launch"

#: Inside each ``gpu.module``: everything to the LLVM and NVVM dialects (math functions
#: without an NVVM intrinsic call libdevice's ``__nv_*``, linked when PTX is emitted).
KERNEL_TO_NVVM = (
    "gpu.module(math-expand-ops{ops=fpowi},"
    "convert-vector-to-scf{full-unroll=true target-rank=1},canonicalize,"
    "expand-strided-metadata,lower-affine,convert-nvgpu-to-nvvm,convert-scf-to-cf,"
    "convert-vector-to-llvm{use-vector-alignment=true},"
    "convert-gpu-to-nvvm{index-bitwidth=64},convert-nvvm-to-llvm,canonicalize,cse,"
    "reconcile-unrealized-casts)"
)
LOOPS = "func.func(convert-linalg-to-loops)"
OUTLINE = "func.func(scf-forall-to-for),gpu-kernel-outlining,canonicalize,cse"


def block_foralls(entry: Any) -> list[Any]:
    """The entry's top-level ``scf.forall`` ops the schedule mapped to blocks. A forall
    without a ``mapping`` (the rows of a vector scan, built when the payload was parsed)
    stays host work, which :mod:`stagegraph.stages.gpu.host_kernels` runs serially in a
    one-thread kernel, as it runs the stepping form of a scan."""
    from stagegraph.mlir.walk import top_level_ops

    return [
        op for op in top_level_ops(entry)
        if op.name == "scf.forall" and "mapping" in op.attributes
    ]  # fmt: skip


def block_dims(forall: Any, params: GpuParams) -> list[int]:
    """The block's thread counts (x, y, z) for the kernel whose op sits in ``forall``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    tagged = [forall, *collect(forall, lambda op: OP_ATTR in op.attributes)]
    indices = {ir.IntegerAttr(op.attributes[OP_ATTR]).value for op in tagged
               if OP_ATTR in op.attributes}  # fmt: skip
    from stagegraph.stages.gpu.wgmma import plan_threads

    spans = [1, 1, 1]
    for plan in params.kernels:
        if plan.op in indices:
            for axis, count in enumerate(plan_threads(plan)):
                spans[axis] = max(spans[axis], count)
    return spans


def map_to_gpu(module: Any, params: GpuParams) -> int:
    """Turn every top-level block forall of the entry into a ``gpu.launch``; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import payload_functions, select_entry
    from stagegraph.stages.common.transform import apply_schedule_module
    from stagegraph.stages.gpu.block_grid import check_grids, fold_block_foralls, static_counts

    entry = select_entry(payload_functions(module))
    foralls = fold_block_foralls(block_foralls(entry))
    i64 = ir.IntegerType.get_signless(64)
    steps = []
    for n, forall in enumerate(foralls):
        forall.attributes[LAUNCH_ATTR] = ir.IntegerAttr.get(i64, n)
        dims = ", ".join(map(str, block_dims(forall, params)))
        steps.append(
            f"    %f{n} = transform.structured.match attributes{{{LAUNCH_ATTR} = {n} : i64}} "
            "in %root : (!transform.any_op) -> !transform.any_op\n"
            f"    %l{n} = transform.gpu.map_forall_to_blocks %f{n} generate_gpu_launch "
            ": (!transform.any_op) -> !transform.any_op\n"
            f"    %t{n} = transform.gpu.map_nested_forall_to_threads %l{n} block_dims = [{dims}] "
            ": (!transform.any_op) -> !transform.any_op\n"
        )
    if not steps:
        return 0
    text = (
        "module attributes {transform.with_named_sequence} {\n"
        "  transform.named_sequence @__transform_main(%root: !transform.any_op "
        "{transform.readonly}) {\n" + "".join(steps) + "    transform.yield\n  }\n}\n"
    )
    from stagegraph.mlir.diagnostics import parse_module

    counts = static_counts(foralls)
    apply_schedule_module(module, parse_module(text, module.context, source="<gpu mapping>"))
    from stagegraph.mlir.walk import top_level_ops

    check_grids(counts, [op for op in top_level_ops(entry) if op.name == "gpu.launch"])
    return len(steps)


#: Op indices of the host ops tiled at buffer level start here (after the payload's ops).
LEFTOVER_BASE = 1 << 20


def schedule_leftovers(module: Any, params: GpuParams) -> GpuParams:
    """Tile what bufferization left on the host (pads' fills, copies into padded buffers)
    to block and thread foralls too, as the cost model maps any op; returns the params
    extended with their plans (for the launch's block dims)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import payload_functions, select_entry
    from stagegraph.mlir.walk import top_level_ops
    from stagegraph.stages.analysis import is_linalg_op, op_facts
    from stagegraph.stages.common.rewrites import copies_to_linalg
    from stagegraph.stages.common.transform import apply_schedule_module
    from stagegraph.stages.gpu.schedule import kernel_script, wrap_script
    from stagegraph.stages.gpu.simt_plan import plan_op

    copies_to_linalg(module)
    entry = select_entry(payload_functions(module))
    leftovers = [op for op in top_level_ops(entry) if is_linalg_op(op)]
    plans = []
    i64 = ir.IntegerType.get_signless(64)
    for n, op in enumerate(leftovers):
        index = LEFTOVER_BASE + n
        op.attributes[OP_ATTR] = ir.IntegerAttr.get(i64, index)
        plan = plan_op(op_facts(op, index, "the host function"), params.threads_per_block)
        if plan.mapped:
            plans.append(plan)
    if not plans:
        return params
    from stagegraph.mlir.diagnostics import parse_module

    text = wrap_script("".join(kernel_script(plan) for plan in plans))
    apply_schedule_module(module, parse_module(text, module.context, source="<gpu leftovers>"))
    return params.model_copy(update={"kernels": (*params.kernels, *plans)})


class GpuLowerConfig(Config):
    """``kernel_pipeline``: the passes run inside each ``gpu.module``."""

    kernel_pipeline: str = KERNEL_TO_NVVM


@stage("passes", name="gpu.lower")
def gpu_lower(
    module: BufferModule, params: GpuParams, target: GpuTarget, config: GpuLowerConfig
) -> AnyModule:
    """Foralls to launches, linalg to loops, kernels outlined and lowered to NVVM (the
    target's warp size sizes the blocks of a scan's row launch)."""
    from stagegraph.mlir.functions import payload_functions, select_entry
    from stagegraph.stages.common.passes import run_pipeline
    from stagegraph.stages.gpu.epilogue import rewrite_simt_epilogues
    from stagegraph.stages.gpu.host_kernels import (
        sink_constants,
        unalign_one_thread_vectors,
        wrap_host_work,
    )
    from stagegraph.stages.gpu.mma import rewrite_mma
    from stagegraph.stages.gpu.mma_bounds import static_warp_grids
    from stagegraph.stages.gpu.mma_staged import allocs_to_globals
    from stagegraph.stages.gpu.reduction import partials_to_shared
    from stagegraph.stages.gpu.wgmma import align_dynamic_shared, give_dynamic_shared
    from stagegraph.stages.gpu.wgmma_rewrite import rewrite_wgmma

    with module.ir.context:
        rewrite_wgmma(module.ir)
        static_warp_grids(module.ir)
        rewrite_mma(module.ir)
        rewrite_simt_epilogues(module.ir)
        params = schedule_leftovers(module.ir, params)
        partials_to_shared(module.ir, params.kernels, OP_ATTR)
        map_to_gpu(module.ir, params)
    run_pipeline(module, LOOPS)
    with module.ir.context:
        entry = select_entry(payload_functions(module.ir))
        wrap_host_work(entry, target.warp_size)
        sink_constants(entry)
    run_pipeline(module, OUTLINE)
    with module.ir.context:
        allocs_to_globals(module.ir)
        give_dynamic_shared(module.ir)
    run_pipeline(module, config.kernel_pipeline)
    with module.ir.context:
        align_dynamic_shared(module.ir)
        unalign_one_thread_vectors(module.ir)
    return module
