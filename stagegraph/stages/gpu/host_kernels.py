"""Host work left between the launches, moved into single-thread kernels.

After the block/thread mapping, what the schedule could not tile stays in the host
function: ops without loops (a reduction to a scalar writes its one element with
``memref.store``), loops around other work (a scan's serial steps). The host plan can only
allocate, copy and launch, so each run of such ops becomes a ``gpu.launch`` of one block of
one thread (``scf.forall`` loops inside run serially there). Correct, not fast: what it
covers is listed by the GPU graph's docs as not yet parallel.
"""

from __future__ import annotations

from typing import Any

#: Ops the host plan runs itself (:mod:`stagegraph.stages.gpu.plan`).
HOST_OPS = frozenset({
    "arith.constant", "memref.alloc", "memref.alloca", "memref.dealloc", "memref.get_global",
    "memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.cast",
    "memref.reinterpret_cast", "memref.copy", "gpu.launch", "gpu.launch_func", "func.return",
    "memref.assume_alignment", "ub.poison", "nvgpu.tma.create.descriptor",
    "builtin.unrealized_conversion_cast",
})  # fmt: skip


#: Constants the kernels' outlining copies into each kernel (they never end a run).
CONSTANTS = frozenset({"arith.constant", "ub.poison"})


def host_runs(entry: Any) -> list[list[Any]]:
    """Runs of consecutive top-level ops the host cannot run (constants do not end a run)."""
    from stagegraph.mlir.walk import top_level_ops

    runs: list[list[Any]] = []
    current: list[Any] = []
    for op in top_level_ops(entry):
        if op.name in CONSTANTS:
            continue
        if op.name in HOST_OPS:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(op)
    if current:
        runs.append(current)
    return runs


def _escapes(run: list[Any]) -> bool:
    """Whether a value the run defines is used after it (it cannot then move into a kernel)."""
    from stagegraph.mlir.walk import nested_in

    group = {op.operation for op in run}
    return any(
        not nested_in(use.owner.operation, group)
        for op in run
        for result in op.results
        for use in result.uses
    )


def wrap_host_work(entry: Any, rows_per_block: int) -> int:
    """Move every run of host-side work into a one-thread ``gpu.launch`` (a lone row
    forall into a launch of a thread per row, ``rows_per_block`` to a block,
    :mod:`.row_kernels`); returns how many.

    Raises:
        UnsupportedPayloadError: a run defines a value the host needs afterwards.
    """
    from stagegraph.errors import UnsupportedPayloadError
    from stagegraph.mlir.bindings import arith, gpu, ir
    from stagegraph.stages.gpu.row_kernels import launch_rows

    wrapped = 0
    for run in host_runs(entry):
        if launch_rows(run, rows_per_block):
            wrapped += 1
            continue
        if _escapes(run):
            raise UnsupportedPayloadError(
                f"host op {run[0].name} defines a value the host uses later; the GPU plan "
                "cannot compute it (stage gpu.lower)"
            )
        with ir.InsertionPoint(run[0]), run[0].location:
            one = arith.ConstantOp(ir.IndexType.get(), 1).result
            launch = gpu.LaunchOp((one, one, one), (one, one, one))
        block = launch.regions[0].blocks[0]
        with ir.InsertionPoint(block), run[0].location:
            terminator = gpu.TerminatorOp()
        for op in run:
            op.move_before(terminator)
        wrapped += 1
    return wrapped


def sink_constants(entry: Any) -> int:
    """Copy the host constants every ``gpu.launch`` uses into its body; returns how many.

    Canonicalization hoists a kernel's constants (vector splats, transfer padding poison)
    to the function's entry, and outlining would pass those it does not sink as kernel
    arguments, which the host plan cannot (it passes buffers and scalars)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect, nested_in, top_level_ops

    sunk = 0
    for launch in (op for op in top_level_ops(entry) if op.name == "gpu.launch"):
        body = launch.regions[0].blocks[0]
        copies: dict[Any, Any] = {}
        for op in collect(launch, lambda o: o.name != "gpu.launch"):
            for i, value in enumerate(op.operands):
                owner = value.owner
                if isinstance(owner, ir.Block) or owner.name not in CONSTANTS:
                    continue
                if nested_in(owner.operation, {launch.operation}):
                    continue
                if owner not in copies:
                    copies[owner] = owner.operation.clone(ir.InsertionPoint.at_block_begin(body))
                    sunk += 1
                op.operands[i] = copies[owner].results[0]
    return sunk


def unalign_one_thread_vectors(module: Any) -> int:
    """In the one-thread kernels, claim only element alignment for vector loads and
    stores; returns how many were changed.

    The vector-to-LLVM conversion claims each vector's natural alignment
    (``use-vector-alignment``: the schedule's thread-level vectors are laid out aligned),
    but the host work wrapped here was vectorized for another layout: a scan over rows of
    255 floats reads 16-float vectors at every row start, and the GPU refused the
    misaligned 16-byte accesses (``CUDA_ERROR_MISALIGNED_ADDRESS``, found on an H200).
    One thread runs these serially, so scalar accesses cost nothing that matters."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    def one_thread(kernel: Any) -> bool:
        sizes = [kernel.attributes[name] for name in ("gpu.known_block_size",
                 "gpu.known_grid_size") if name in kernel.attributes]  # fmt: skip
        return len(sizes) == 2 and all(list(ir.DenseI32ArrayAttr(s)) == [1, 1, 1] for s in sizes)

    i64 = ir.IntegerType.get_signless(64)
    changed = 0
    for kernel in filter(one_thread, collect(module, "llvm.func")):
        for access in collect(kernel, {"llvm.load", "llvm.store"}):
            value = access.results[0] if access.name == "llvm.load" else access.operands[0]
            if isinstance(value.type, ir.VectorType):
                bits = value.type.element_type.width
                access.attributes["alignment"] = ir.IntegerAttr.get(i64, max(1, bits // 8))
                changed += 1
    return changed
