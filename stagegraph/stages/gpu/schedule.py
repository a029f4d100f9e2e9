"""The GPU schedule: a transform-dialect script that tiles each op to a ``forall`` over
blocks and, inside it, a ``forall`` over threads, following the cost model's plan.

Ops are addressed by an attribute (:data:`OP_ATTR`, the op's index in the analysis's program
order), set on the payload before the script runs. Block foralls carry ``#gpu.block``
linear mappings (any number of grid dims, folded onto the 3-D grid when mapped), thread
foralls ``#gpu.thread<x|y>``. After bufferization the GPU lowering maps the
foralls to ``gpu.launch`` (:mod:`stagegraph.stages.gpu.lower`).
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.ports import Config, TensorModule
from stagegraph.core.stage import stage
from stagegraph.stages.gpu.params import GpuParams, KernelPlan
from stagegraph.stages.gpu.simt_plan import block_mapping, thread_mapping

#: Marks each linalg op of the entry with its index in the analysis's order.
OP_ATTR = "stagegraph.gpu_op"
_ANY = "!transform.any_op"
_TILED = f"({_ANY}) -> ({_ANY}, {_ANY})"


def tag_ops(module: Any) -> int:
    """Set :data:`OP_ATTR` on every linalg op of the entry (analysis order); returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import payload_functions, select_entry
    from stagegraph.stages.analysis import linalg_ops

    entry = select_entry(payload_functions(module))
    ops = linalg_ops(entry)
    i64 = ir.IntegerType.get_signless(64)
    for index, op in enumerate(ops):
        op.attributes[OP_ATTR] = ir.IntegerAttr.get(i64, index)
    return len(ops)


def _match(handle: str, index: int) -> str:
    return (
        f"    {handle} = transform.structured.match attributes{{{OP_ATTR} = {index} : i64}} "
        f"in %root : ({_ANY}) -> {_ANY}\n"
    )


def _tile(target: str, tiles: tuple[int, ...], mapping: list[str], out: str) -> str:
    sizes = ", ".join(map(str, tiles))
    return (
        f"    {out}_op, {out} = transform.structured.tile_using_forall {target} tile_sizes "
        f"[{sizes}] (mapping = [{', '.join(mapping)}]) : {_TILED}\n"
    )


def kernel_script(plan: KernelPlan) -> str:
    """The transform ops that tile one op to blocks, then each block's piece to threads."""
    i = plan.op
    if plan.stages and plan.fused:
        from stagegraph.stages.gpu.wgmma_epilogue import wgmma_epilogue_script

        return wgmma_epilogue_script(plan, OP_ATTR)
    if plan.stages:
        from stagegraph.stages.gpu.wgmma import wgmma_script

        return wgmma_script(i, plan.tile_n, plan.stages, OP_ATTR, plan.warp_specialized,
                            plan.group_m)  # fmt: skip
    if plan.fused:
        from stagegraph.stages.gpu.epilogue import epilogue_kernel_script

        inner = (plan.block_tile[:-1], plan.thread_tile[:-1])  # SIMT: C's loops, without K
        maps = (block_mapping(inner[0]), thread_mapping(inner[1]))
        return epilogue_kernel_script(plan, OP_ATTR, maps)
    if plan.mma:
        from stagegraph.stages.gpu.mma import mma_script

        batched = plan.name == "linalg.batch_matmul"
        return mma_script(i, (plan.tile_m, plan.tile_n), OP_ATTR, batched)
    text = _match(f"%op{i}", i)
    text += _tile(f"%op{i}", plan.block_tile, block_mapping(plan.block_tile), f"%blocks{i}")
    # The block forall carries its op's index too (vectorizing replaces the op itself).
    text += f"    %index{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
    text += (
        f'    transform.annotate %blocks{i} "{OP_ATTR}" = %index{i} '
        f": {_ANY}, !transform.param<i64>\n"
    )
    text += _tile(
        f"%blocks{i}_op", plan.thread_tile, thread_mapping(plan.thread_tile), f"%threads{i}"
    )
    if plan.accumulate:  # a reduction: each thread's steps accumulate in a register
        from stagegraph.stages.gpu.reduction import thread_steps

        row, steps = plan.accumulate
        text += thread_steps(f"{i}r", f"%threads{i}_op", f"%threads{i}", plan.block_tile,
                             steps, row)  # fmt: skip
    if plan.vector > 1:  # each thread's 1x..xV piece becomes vector transfers, where it can
        text += (
            f"    transform.sequence %threads{i}_op : {_ANY} failures(suppress) {{\n"
            f"    ^bb0(%piece{i}: {_ANY}):\n"
            f"      transform.structured.vectorize %piece{i} : {_ANY}\n"
            "    }\n"
        )
    return text


def schedule_text(params: GpuParams, rows: dict[int, tuple[int, ...]] | None = None) -> str:
    """The whole transform module for ``params``: one kernel script per mapped op
    (``rows``: the shapes of the cooperative reductions, as their rewrite left them)."""
    from stagegraph.stages.gpu.full_reduction import full_reduction_script, is_full
    from stagegraph.stages.gpu.reduction import row_reduction_script
    from stagegraph.stages.gpu.row_fusion import grouped, row_kernel_script

    inside = grouped(params.kernels)
    plans = {plan.op: plan for plan in params.kernels}
    body = ""
    for plan in params.kernels:
        if plan.op in inside:
            continue  # scheduled inside its row kernel
        if plan.group and rows:
            body += row_kernel_script(plan, plans, OP_ATTR, rows)
        elif is_full(plan) and rows and plan.op in rows:
            body += full_reduction_script(plan, OP_ATTR, rows[plan.op])
        elif plan.lanes and rows and plan.op in rows:
            body += row_reduction_script(plan, OP_ATTR, rows[plan.op])
        elif plan.split:
            from stagegraph.stages.gpu.column_reduction import column_script

            body += column_script(plan, OP_ATTR)
        elif plan.mapped:
            body += kernel_script(plan)
    return wrap_script(body)


def wrap_script(body: str) -> str:
    """A transform module whose ``@__transform_main`` on the payload root runs ``body``."""
    return (
        "module attributes {transform.with_named_sequence} {\n"
        f"  transform.named_sequence @__transform_main(%root: {_ANY} {{transform.readonly}}) {{\n"
        f"{body}    transform.yield\n  }}\n}}\n"
    )


class GpuScheduleConfig(Config):
    """No options yet: the schedule follows the params."""


@stage("schedule", name="gpu.schedule")
def gpu_schedule(
    module: TensorModule, params: GpuParams, config: GpuScheduleConfig
) -> TensorModule:
    """Tile every op to a block forall and a thread forall, as the params say."""
    from stagegraph.mlir.build import ir_location
    from stagegraph.stages.common.transform import apply_transform_module
    from stagegraph.stages.gpu.reduction import expand_reduction_loops

    with module.ir.context, ir_location(module.ir):
        tag_ops(module.ir)
        rows = expand_reduction_loops(module.ir, params.kernels, OP_ATTR)
    text = schedule_text(params, rows)
    apply_transform_module(module, text, "__transform_main", "<gpu schedule>")
    return module
