"""Hopper tensor-core matmuls (``wgmma``, sm_90a): TMA loads into 128-byte-swizzled shared
memory, an mbarrier pipeline of several stages, ``wgmma.mma_async`` by warpgroups, and
warp specialization for long K loops.

The schedule tiles a plain ``linalg.matmul`` (f16/bf16 inputs, f32 output) to a forall over
``128 x tile_n`` blocks and marks the block's matmul with :data:`WGMMA_ATTR` (its value:
the pipeline depth; :data:`WS_ATTR`: warp-specialized; :data:`GROUP_ATTR`: the block
order). After bufferization ``wgmma_rewrite.rewrite_wgmma`` replaces that matmul by the kernel body,
built op by op through the bindings from the nvgpu and nvvm dialects
(:mod:`stagegraph.stages.gpu.wgmma_kernel`, :mod:`stagegraph.stages.gpu.wgmma_specialized`):

* on the host, before the block loop, one ``nvgpu.tma.create.descriptor`` per operand
  (A's ``128 x 64`` box, B's ``64 x 64`` box, both 128-byte swizzled; the host plan encodes
  them with ``cuTensorMapEncodeTiled``, :mod:`stagegraph.stages.gpu.tma`);
* in the block: ``stages`` mbarriers (``nvgpu.mbarrier.create/init``), TMA loads
  (``nvgpu.tma.async.load`` after ``arrive.expect_tx`` of the stage's bytes) running
  ``stages - 1`` K steps ahead, and a loop over the K steps of 64 that waits on the step's
  barrier (``try_wait.parity``, the phase flipping each round) and issues
  ``nvgpu.warpgroup.mma`` on descriptors of the staged tiles
  (``nvgpu.warpgroup.generate.descriptor``; B is K x N, so transposed) with the
  accumulator carried as a loop value. A plain block's thread 0 issues the loads; a
  warp-specialized block has a producer warpgroup for them and two consumer warpgroups;
* after the loop the accumulator goes into C: stored where C held zeros (the zero fill is
  then dropped, :mod:`stagegraph.stages.gpu.zero_fill`), else added to C through shared
  memory in coalesced loads and stores.

``convert-nvgpu-to-nvvm`` and ``convert-nvvm-to-llvm`` lower these to ``wgmma.mma_async``,
``cp.async.bulk.tensor``, ``mbarrier`` and ``setmaxnreg`` PTX. Where the shape does not
split into these tiles the cost model keeps the ``mma.sync`` path
(:mod:`stagegraph.stages.gpu.mma`).
"""

from __future__ import annotations

from typing import Any

#: Marks the block-level matmuls the schedule leaves for ``wgmma_rewrite.rewrite_wgmma``.
WGMMA_ATTR = "stagegraph.gpu_wgmma"
#: Rows of C per block (one warpgroup: two ``m64`` wgmma rows) and K per pipeline step
#: (64 halves: one 128-byte swizzled row).
TILE_M = 128
TILE_K = 64
#: Rows of one wgmma (``m64``): a warpgroup's accumulator fragment.
WGMMA_M = 64
#: Columns of B per TMA box: 128 bytes of f16/bf16, the widest a 128-byte swizzle takes.
BOX_N = 64
WARPGROUP = 128
#: Block tile widths (columns of C) the path takes; the accumulator is ``tile_n`` f32
#: registers per thread of one warpgroup on 128 rows, half that with two consumers.
TILE_NS = (64, 128, 256)
#: Warp specialization: consumer warpgroups (64 rows each), and the registers per thread
#: ``setmaxnreg`` leaves the producer and gives each consumer (multiples of 8; with 384
#: threads they add up to at most 64 Ki registers).
CONSUMERS = 2
PRODUCER_REGISTERS = 24
CONSUMER_REGISTERS = 240
#: K steps from which a block is warp-specialized (a shorter loop is mostly prologue).
SPECIALIZE_FROM_STEPS = 8
#: Marks a block matmul to build warp-specialized.
WS_ATTR = "stagegraph.gpu_wgmma_ws"
#: On a block matmul: tile rows per group of blocks (:mod:`stagegraph.stages.gpu.raster`).
GROUP_ATTR = "stagegraph.gpu_wgmma_group"
#: Pipeline depths (one mbarrier and one A and B slot each).
STAGES = (2, 3, 4, 5, 6, 7, 8)
#: Registers per thread beyond the accumulator (addresses, loop, barriers, epilogue).
REGISTER_RESERVE = 64
#: Bytes per mbarrier (static shared memory, beside the dynamic stages).
BARRIER_BYTES = 8
#: The dynamic shared memory's alignment: the 128-byte swizzle repeats every 1024 bytes,
#: and TMA and wgmma must see the same pattern.
SHARED_ALIGN = 1024
#: ``try_wait.parity`` suspend-time hint (nanoseconds) per try.
WAIT_TICKS = 10_000_000


def takes_wgmma(arch: str, dtype: str) -> bool:
    """Whether ``arch`` runs this path for inputs of ``dtype`` (f16/bf16 on ``sm_90a``:
    wgmma needs the architecture-specific ``a`` features)."""
    return arch == "sm_90a" and dtype in ("f16", "bf16")


def stage_bytes(tile_n: int, element_bytes: int = 2) -> int:
    """Shared memory of one pipeline stage: A's ``128 x 64`` and B's ``64 x tile_n`` tiles."""
    return (TILE_M * TILE_K + TILE_K * tile_n) * element_bytes


def dynamic_shared_bytes(stages: int, tile_n: int, element_bytes: int = 2) -> int:
    """The block's dynamic shared memory: every stage, or the f32 C tile the epilogue
    stages through the same bytes, whichever is larger."""
    return max(stages * stage_bytes(tile_n, element_bytes), TILE_M * tile_n * 4)


def block_shared_bytes(stages: int, tile_n: int, element_bytes: int = 2) -> int:
    """All of a block's shared memory: the dynamic part, the barriers and the alignment
    slack that puts the dynamic part on a 1024-byte boundary after them."""
    return dynamic_shared_bytes(stages, tile_n, element_bytes) + SHARED_ALIGN


def accumulator_registers(tile_n: int, specialized: bool = False) -> int:
    """f32 accumulator registers per consumer thread: 128 x tile_n over one warpgroup, or
    64 x tile_n per consumer warpgroup when warp-specialized."""
    rows = TILE_M // CONSUMERS if specialized else TILE_M
    return rows * tile_n // WARPGROUP


def block_threads(specialized: bool) -> int:
    """Threads of a block: one warpgroup, or a producer and the consumers."""
    return WARPGROUP * (1 + CONSUMERS) if specialized else WARPGROUP


def plan_threads(plan: Any) -> tuple[int, ...]:
    """A kernel plan's block dims: a wgmma plan's follow its warp specialization (which a
    tuner may have switched), any other plan's are its ``threads``."""
    return (block_threads(plan.warp_specialized),) if plan.stages else tuple(plan.threads)


def registers_fit(tile_n: int, specialized: bool, registers: int, per_block: int) -> bool:
    """Whether the accumulator and :data:`REGISTER_RESERVE` fit a thread: ``registers``
    per thread of a plain block, or the consumers' ``setmaxnreg`` count (whose split must
    fit the block's ``per_block`` registers)."""
    if specialized:
        split = WARPGROUP * (PRODUCER_REGISTERS + CONSUMERS * CONSUMER_REGISTERS)
        budget = CONSUMER_REGISTERS if split <= per_block else 0
    else:
        budget = registers
    return accumulator_registers(tile_n, specialized) + REGISTER_RESERVE <= budget


def tile_fits(m: int, n: int, k: int, tile_n: int) -> bool:
    """Whether ``128 x tile_n`` blocks and 64-deep K steps divide the matmul exactly."""
    return m % TILE_M == 0 and n % tile_n == 0 and k % TILE_K == 0 and k >= TILE_K


def choose(m: int, n: int, k: int, sm_count: int, shared_limit: int, registers: int,
           per_block: int = 65536) -> tuple[int, int, bool] | None:  # fmt: skip
    """``(tile_n, stages, specialized)`` for an ``m x n x k`` matmul: warp-specialized
    where the K loop has :data:`SPECIALIZE_FROM_STEPS` steps or more; the widest tile
    whose accumulator fits and that still gives every SM a block (else the one with the
    most blocks); the deepest pipeline that fits ``shared_limit`` bytes and has no more
    loads in flight (``stages - 1``) than K steps. None where no tile fits."""
    options = (True, False) if k // TILE_K >= SPECIALIZE_FROM_STEPS else (False,)
    for specialized in options:
        fitting = [t for t in sorted(TILE_NS, reverse=True) if tile_fits(m, n, k, t)
                   and registers_fit(t, specialized, registers, per_block)]  # fmt: skip
        filling = [t for t in fitting if (m // TILE_M) * (n // t) >= sm_count]
        rest = sorted(set(fitting) - set(filling), key=lambda t: -(m // TILE_M) * (n // t))
        for tile_n in (*filling, *rest):
            depths = [s for s in STAGES if s - 1 <= k // TILE_K
                      and block_shared_bytes(s, tile_n) <= shared_limit]  # fmt: skip
            if depths:
                return tile_n, max(depths), specialized
    return None


def wgmma_script(op: int, tile_n: int, stages: int, attr: str, specialized: bool = False,
                 group: int = 0) -> str:  # fmt: skip
    """Transform ops for op ``op`` (matched by ``attr``): tiled to ``128 x tile_n`` blocks;
    the block's matmul is annotated for ``wgmma_rewrite.rewrite_wgmma``
    (:func:`wgmma_annotations`)."""
    any_op = "!transform.any_op"
    blocks = "#gpu.block<linear_dim_1>, #gpu.block<linear_dim_0>"
    return (
        f"    %wm{op} = transform.structured.match attributes{{{attr} = {op} : i64}} "
        f"in %root : ({any_op}) -> {any_op}\n"
        f"    %wb{op}_op, %wb{op} = transform.structured.tile_using_forall %wm{op} "
        f"tile_sizes [{TILE_M}, {tile_n}, 0] (mapping = [{blocks}]) "
        f": ({any_op}) -> ({any_op}, {any_op})\n"
        f"    %wi{op} = transform.param.constant {op} : i64 -> !transform.param<i64>\n"
        f'    transform.annotate %wb{op} "{attr}" = %wi{op} : {any_op}, !transform.param<i64>\n'
        + wgmma_annotations(f"%wb{op}_op", op, stages, specialized, group)
    )


def wgmma_annotations(handle: str, op: int, stages: int, specialized: bool, group: int) -> str:
    """Transform ops marking the block matmul ``handle`` with the pipeline depth
    (:data:`WGMMA_ATTR`), :data:`WS_ATTR` when warp-specialized and :data:`GROUP_ATTR`
    with the block grouping."""
    any_op = "!transform.any_op"
    return (
        f"    %ws{op} = transform.param.constant {stages} : i64 -> !transform.param<i64>\n"
        f'    transform.annotate {handle} "{WGMMA_ATTR}" = %ws{op} '
        f": {any_op}, !transform.param<i64>\n"
        + (f'    transform.annotate {handle} "{WS_ATTR}" : {any_op}\n' if specialized else "")
        + (
            f"    %wg{op} = transform.param.constant {group} : i64 -> !transform.param<i64>\n"
            f'    transform.annotate {handle} "{GROUP_ATTR}" = %wg{op} '
            f": {any_op}, !transform.param<i64>\n"
            if group
            else ""
        )
    )


def dynamic_shared_of(kernel: Any) -> int:
    """The dynamic shared memory bytes a kernel (``gpu.func``) built here needs: read from
    the :data:`SHARED_ATTR` its block body carries (0 for other kernels)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    marks = collect(kernel, lambda op: SHARED_ATTR in op.attributes)
    return max((ir.IntegerAttr(op.attributes[SHARED_ATTR]).value for op in marks), default=0)


#: Set on the kernel's ``gpu.dynamic_shared_memory`` ops: the bytes its launch must give.
SHARED_ATTR = "stagegraph.dynamic_shared_bytes"


def plan_wgmma(op: Any, target: Any) -> Any:
    """A wgmma plan (a :class:`~stagegraph.stages.gpu.params.KernelPlan` with ``stages``)
    for a plain f16/bf16 -> f32 ``linalg.matmul`` on an ``sm_90a`` target whose shape
    splits into the tiles, or None (the caller then tries ``mma.sync``)."""
    from stagegraph.stages.gpu.kernel_plan import KernelPlan
    from stagegraph.stages.gpu.raster import group_rows

    if op.name != "linalg.matmul" or len(op.inputs) != 2 or len(op.outputs) != 1:
        return None
    dtypes = {v.dtype for v in op.inputs}
    if op.outputs[0].dtype != "f32" or len(dtypes) != 1:
        return None
    if not takes_wgmma(target.arch, next(iter(dtypes))):
        return None
    m, n, k = op.loop_ranges[-3:]
    chosen = choose(m, n, k, target.sm_count, target.shared_bytes_per_block_optin,
                    thread_registers(target), target.registers_per_block)  # fmt: skip
    if chosen is None or block_threads(chosen[2]) > target.max_threads_per_block:
        return None
    tile_n, stages, specialized = chosen
    group = group_rows(target.sm_count, TILE_M, tile_n, m // TILE_M, n // tile_n)
    return KernelPlan(op=op.index, name=op.name, threads=(block_threads(specialized),),
                      mma=(64, tile_n, 16), tile_m=TILE_M, tile_n=tile_n, stages=stages,
                      warp_specialized=specialized, group_m=group)  # fmt: skip


def thread_registers(target: Any) -> int:
    """Registers one thread of a warpgroup block may hold on ``target``."""
    return min(target.max_registers_per_thread, target.registers_per_block // WARPGROUP)


def give_dynamic_shared(module: Any) -> int:
    """Give each ``gpu.launch_func`` of a kernel built here the dynamic shared memory its
    body asks for (:data:`SHARED_ATTR`): the launch is rebuilt with that operand, which the
    host plan reads into the launch's ``shared_mem_bytes``; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    kernels = {}
    for gpu_module in collect(module, "gpu.module"):
        name = ir.StringAttr(gpu_module.attributes["sym_name"]).value
        for func in collect(gpu_module, "gpu.func"):
            kernels[(name, ir.StringAttr(func.attributes["sym_name"]).value)] = func
    given = 0
    for launch in collect(module, "gpu.launch_func"):
        symbol = ir.SymbolRefAttr(launch.attributes["kernel"]).value
        needed = dynamic_shared_of(kernels[tuple(symbol)]) if tuple(symbol) in kernels else 0
        segments = list(ir.DenseI32ArrayAttr(launch.attributes["operandSegmentSizes"]))
        if not needed or segments[-3]:
            continue
        operands, at = list(launch.operands), sum(segments[:-3])
        with launch.location, ir.InsertionPoint(launch):
            i32 = ir.IntegerType.get_signless(32)
            size = ir.Operation.create(
                "arith.constant",
                results=[i32],
                attributes={"value": ir.IntegerAttr.get(i32, needed)},
            )
            attributes = {name: launch.attributes[name] for name in launch.attributes}
            attributes["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get(
                [*segments[:-3], 1, *segments[-2:]]
            )
            ir.Operation.create("gpu.launch_func", results=[],
                                operands=[*operands[:at], size.results[0], *operands[at:]],
                                attributes=attributes)  # fmt: skip
        launch.erase()
        given += 1
    return given


def align_dynamic_shared(module: Any) -> int:
    """Make every kernel module's dynamic shared memory (the zero-sized ``addr_space = 3``
    global the NVVM lowering makes of ``gpu.dynamic_shared_memory``) an external
    declaration on a :data:`SHARED_ALIGN` boundary: PTX ``.extern .shared .align 1024 .b8
    name[]``, the dynamic memory itself (an internal one prints as a one-byte static
    variable), placed where the 128-byte swizzle of TMA and wgmma, which repeats every
    1024 bytes and is computed from the address, starts with a slot; returns how many."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    i64 = ir.IntegerType.get_signless(64)
    raised = 0
    for found in collect(module, "llvm.mlir.global"):
        if found.parent.name != "gpu.module" or not _is_dynamic_shared(found):
            continue
        found.attributes["alignment"] = ir.IntegerAttr.get(i64, SHARED_ALIGN)
        found.attributes["linkage"] = ir.Attribute.parse("#llvm.linkage<external>")
        raised += 1
    return raised


def _is_dynamic_shared(global_op: Any) -> bool:
    """An ``addr_space = 3`` global of a zero-length array (the dynamic shared memory)."""
    from stagegraph.mlir.bindings import ir, llvm

    if "addr_space" not in global_op.attributes:
        return False
    if ir.IntegerAttr(global_op.attributes["addr_space"]).value != 3:
        return False
    kind = ir.TypeAttr(global_op.attributes["global_type"]).value
    return isinstance(kind, llvm.ArrayType) and kind.num_elements == 0
