"""IR rewrites the pass registry lacks, done through the bindings.

``vector.reduction`` of floats is an ordered reduction unless it may reassociate: LLVM then
adds the lanes one after another (a chain of dependent adds as the vector), where a
reassociating reduction is a tree of vector adds. :func:`reassociate_reductions` allows it.

``memref.copy`` between strided buffers lowers to a call of ``memrefCopy`` from
``libmlir_c_runner_utils``, which the torch-mlir wheel does not ship (the JIT then fails to
resolve the symbol and crashes). Rewriting such copies as ``linalg.copy`` lets them lower to
plain loops instead.

A ``tensor.empty`` shared by very many ops makes one-shot bufferization quadratic:
:func:`split_shared_empties` bounds its users.

A result returned through reshapes (PyTorch's norms view ``NCHW`` as ``1 x NC x H x W``
and back) is not the allocation itself, so ``buffer-results-to-out-params`` copies it into
the out-parameter: one more pass over the output. :func:`write_results_in_place` makes the
allocation a view of the out-parameter instead.
"""

from __future__ import annotations

from typing import Any


def copies_to_linalg(module: Any) -> int:
    """Replace every ``memref.copy`` in ``module`` by ``linalg.copy``; returns the count.

    Built generically (:func:`~stagegraph.mlir.build.named_structured_op`): the OpDSL
    builder of the bindings' ``linalg`` module takes a millisecond per op, and an outlined
    recurrent network's entry holds hundreds of copies."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import named_structured_op
    from stagegraph.mlir.walk import collect

    copies = collect(module, "memref.copy")
    for op in copies:
        with ir.InsertionPoint(op), op.location:
            named_structured_op("linalg.copy", [op.operands[0]], [op.operands[1]])
        op.erase()
    return len(copies)


_RESHAPES = ("memref.expand_shape", "memref.collapse_shape")


def _reshape_chain(value: Any) -> tuple[Any, list[Any]] | None:
    """(``memref.alloc``, reshapes from it to ``value`` in order) when ``value`` is an
    allocation seen through expand/collapse reshapes only; else None."""
    from stagegraph.mlir.bindings import ir

    chain: list[Any] = []
    while True:
        owner = value.owner
        if not isinstance(owner, ir.Operation | ir.OpView):
            return None  # a block argument
        op = owner.operation
        if op.name == "memref.alloc" and not list(op.operands):
            return op, chain[::-1]
        if op.name not in _RESHAPES:
            return None
        chain.append(op)
        value = op.operands[0]


def _inverse_reshapes(value: Any, chain: list[Any]) -> Any:
    """``value`` (the chain's result type) seen back through ``chain``, innermost last: an
    expand undone by a collapse of the same reassociation and vice versa."""
    from stagegraph.mlir.bindings import dialect, ir

    memref = dialect("memref")
    for op in reversed(chain):
        source_type = op.operands[0].type
        reassociation = op.attributes["reassociation"]
        if op.name == "memref.expand_shape":
            value = memref.CollapseShapeOp(source_type, value, reassociation).result
        else:
            shape = list(ir.MemRefType(source_type).shape)
            value = memref.ExpandShapeOp(source_type, value, reassociation, [], shape).result
    return value


def write_results_in_place(module: Any) -> int:
    """Write each result that a function copies into its out-parameter from an allocation
    seen through reshapes straight into the out-parameter; returns the count.

    ``memref.copy %view, %out`` qualifies when ``%out`` is an argument of the function the
    copy is directly in, used by nothing else; ``%view`` is reshapes (expand/collapse,
    which keep the element order) of a static ``memref.alloc`` of the same block; and
    after the copy the block only copies and returns (so nothing writes the allocation
    once its contents were taken). The allocation becomes the out-parameter reshaped back
    to its type (the same bytes: reshapes of contiguous buffers are views), and the copy
    goes.
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    count = 0
    for fn in collect(module, "func.func"):
        if not fn.regions[0].blocks:
            continue
        block = fn.regions[0].blocks[0]
        ops = [op.operation for op in block.operations]
        arguments = list(block.arguments)
        for position, copy in enumerate(ops):
            if copy.name != "memref.copy" or copy.operands[1] not in arguments:
                continue
            out = copy.operands[1]
            if len(list(out.uses)) != 1:
                continue
            if any(op.name not in ("memref.copy", "func.return") for op in ops[position + 1 :]):
                continue
            found = _reshape_chain(copy.operands[0])
            if found is None or out.type != copy.operands[0].type:
                continue
            alloc, chain = found
            if alloc not in ops or any(
                u.owner.name == "memref.dealloc" for u in alloc.results[0].uses
            ):
                continue
            with ir.InsertionPoint(alloc), alloc.location:
                view = _inverse_reshapes(out, chain)
            copy.erase()
            for op in reversed(chain):
                if not list(op.results[0].uses):
                    op.erase()
            alloc.results[0].replace_all_uses_with(view)
            alloc.erase()
            count += 1
    return count


# Users one ``tensor.empty`` may keep (see split_shared_empties).
EMPTY_USERS = 8


def split_shared_empties(module: Any, users: int = EMPTY_USERS) -> int:
    """Give each ``tensor.empty`` of ``module`` at most ``users`` uses, cloning it for the
    rest; returns the number of clones.

    Every destination-style op writing into one empty tensor joins one alias set in
    one-shot-bufferize's analysis, which scans the set for conflicts on every write: an
    empty shared by thousands of ops (an unrolled recurrent model writes every step into
    the same one) makes bufferization quadratic. An empty has no contents, so a clone is
    the same value; a few users per empty still let short chains reuse one buffer.
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    clones = 0
    for op in collect(module, "tensor.empty"):
        uses = [(u.owner.operation, u.operand_number) for u in op.results[0].uses]
        for start in range(users, len(uses), users):
            with ir.InsertionPoint(op), op.location:
                clone = op.clone()
            clones += 1
            for user, number in uses[start : start + users]:
                user.operands[number] = clone.results[0]
    return clones


def reassociate_reductions(module: Any) -> int:
    """Let every float ``vector.reduction`` of ``module`` reassociate (the schedules made
    them from chunks of a row, whose order is no more meaningful than a tree's); returns
    the count. Every float combining kind (add, mul, min/max) is associative; sums then
    round differently, as any blocked or parallel sum does."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    reductions = collect(
        module,
        lambda op: (
            op.name == "vector.reduction"
            and isinstance(ir.VectorType(op.operands[0].type).element_type, ir.FloatType)
        ),
    )
    for op in reductions:
        op.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc>")
    return len(reductions)


def expand_bf16_truncation(module: Any) -> int:
    """Round ``f32 -> bf16`` truncations with integer ops; returns the count rewritten.

    Without a native conversion (AVX-512 BF16), LLVM lowers ``fptrunc float to bfloat`` to a
    call of compiler-rt's ``__truncsfbf2``, which neither the wheel nor the system provides:
    the JIT then cannot resolve the symbol. Rounding to nearest even on the bit pattern is
    what that builtin does (``bits + 0x7fff + lsb``, then the high half; NaN stays a quiet
    NaN), and on vectors it stays vector integer code instead of one call per lane.
    """
    from stagegraph.mlir.bindings import arith, ir
    from stagegraph.mlir.walk import collect

    found = collect(
        module,
        lambda op: (
            op.name == "arith.truncf"
            and _element(op.results[0].type) == "bf16"
            and _element(op.operands[0].type) == "f32"
        ),
    )
    for op in found:
        source = op.operands[0]
        with ir.InsertionPoint(op), op.location:
            i32, i16 = _like(source.type, 32), _like(source.type, 16)
            bits = arith.bitcast(i32, source)
            sixteen = _int_constant(i32, 16)
            lsb = arith.andi(arith.shrui(bits, sixteen), _int_constant(i32, 1))
            rounded = arith.addi(arith.addi(bits, _int_constant(i32, 0x7FFF)), lsb)
            narrow = arith.trunci(i16, arith.shrui(rounded, sixteen))
            is_nan = arith.cmpf(arith.CmpFPredicate.UNO, source, source)
            quiet_nan = _int_constant(i16, 0x7FC0)
            value = arith.bitcast(op.results[0].type, arith.select(is_nan, quiet_nan, narrow))
        op.results[0].replace_all_uses_with(value)
        op.erase()
    return len(found)


def _element(value_type: Any) -> str | None:
    """The element type name of a scalar, vector, tensor or memref type."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.types import element_name

    shaped = isinstance(value_type, ir.ShapedType)
    return element_name(ir.ShapedType(value_type).element_type if shaped else value_type)


def _like(value_type: Any, width: int) -> Any:
    """An integer type of ``width`` bits with the shape of ``value_type`` (scalar or vector)."""
    from stagegraph.mlir.bindings import ir

    integer = ir.IntegerType.get_signless(width)
    if isinstance(value_type, ir.VectorType):
        vector = ir.VectorType(value_type)
        return ir.VectorType.get(vector.shape, integer, scalable=vector.scalable_dims)
    return integer


def _int_constant(value_type: Any, value: int) -> Any:
    from stagegraph.mlir.bindings import arith, ir

    if isinstance(value_type, ir.VectorType):
        element = ir.VectorType(value_type).element_type
        attr = ir.DenseElementsAttr.get_splat(value_type, ir.IntegerAttr.get(element, value))
        return arith.ConstantOp(value_type, attr).result
    return arith.ConstantOp(value_type, ir.IntegerAttr.get(value_type, value)).result


TRUNC_BF16_BUILTIN = "__truncsfbf2"


def uses_bf16(module: Any) -> bool:
    """Whether any op of ``module`` takes or makes a bf16 value (scalar, vector or buffer).

    Only results and function arguments are looked at: every operand is one of those or a
    block argument of a nested region, which carries the type of a value that is (a loop's
    iteration arguments, a linalg body's elements). Half the values of a walk that visits
    every op of a large module."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import contains

    def bf16(op: Any) -> bool:
        if op.name == "func.func":
            kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            return any(_element(t) == "bf16" for t in [*kind.inputs, *kind.results])
        return any(_element(r.type) == "bf16" for r in op.results)

    return contains(module, bf16)


def define_bf16_builtins(module: Any) -> bool:
    """Define compiler-rt's ``__truncsfbf2`` (f32 -> bf16) in ``module`` when it uses bf16.

    LLVM legalizes bf16 vectors on CPUs without AVX-512 BF16 by promoting them to f32 and
    truncating back, and calls that builtin for each truncation it cannot fold (masked
    loads and selects of bf16 vectors do this). Nothing the JIT links provides it, so the
    module carries its own: the same rounding as :func:`expand_bf16_truncation`, as a
    public function LLVM's calls resolve to. Returns whether it was added.
    """
    from stagegraph.mlir.bindings import func, ir

    if not uses_bf16(module) or TRUNC_BF16_BUILTIN in ir.SymbolTable(module.operation):
        return False
    with module.context, ir.Location.unknown(), ir.InsertionPoint(module.body):
        f32, bf16 = ir.F32Type.get(), ir.BF16Type.get()
        builtin = func.FuncOp(TRUNC_BF16_BUILTIN, ir.FunctionType.get([f32], [bf16]))
        block = builtin.add_entry_block()
        with ir.InsertionPoint(block):
            from stagegraph.mlir.bindings import arith

            truncated = arith.truncf(bf16, block.arguments[0])
            func.ReturnOp([truncated])
    expand_bf16_truncation(module)
    return True


#: Named ops that are aggregates of simpler linalg ops (``AggregatedOpInterface``): no
#: conversion to loops or vectors knows them, so they are decomposed first.
AGGREGATED_OPS = ("linalg.softmax",)


def decompose_aggregated_ops(module: Any) -> int:
    """Rewrite every aggregated named op (``linalg.softmax``: max, sub+exp, sum, div) into the
    ``linalg.generic`` ops it stands for, with the transform dialect's
    ``decompose_interface``; returns how many were decomposed. Without it the op survives to
    LLVM translation, which fails far from the cause."""
    from stagegraph.mlir.walk import collect

    count = len(collect(module, AGGREGATED_OPS))
    if not count:
        return 0
    from stagegraph.mlir.bindings import ir, structured, transform
    from stagegraph.stages.common.transform import apply_schedule_module, new_schedule
    from stagegraph.stages.common.transform_build import any_op

    with module.context, ir.Location.unknown():
        schedule, sequence = new_schedule()
        with ir.InsertionPoint(sequence.body):
            ops = structured.MatchOp.match_op_names(sequence.bodyTarget, list(AGGREGATED_OPS))
            each = transform.ForeachOp([], [ops.result])
            with ir.InsertionPoint(each.body):
                structured.DecomposeInterfaceOp(any_op(), each.body.arguments[0])
                transform.YieldOp([])
            transform.YieldOp([])
        apply_schedule_module(module, schedule)
    return count


# --------------------------------------------------------------------------- deallocation


def split_fresh_deallocations(module: Any) -> int:
    """Split each ``bufferization.dealloc`` that frees only distinct fresh allocations (and
    retains nothing) into one dealloc per buffer; returns how many were split.

    Ownership-based deallocation frees the buffers allocated in a block with one dealloc at
    the block's end. ``buffer-deallocation-simplification`` then asks, for every pair of
    its buffers, whether they may alias: quadratic in the buffers of one block, and an
    outlined recurrent network's entry holds thousands (an LSTM's 1,561 made it the
    slowest pass of the lowering). Buffers that are the results of distinct
    ``memref.alloc`` ops never alias, so freeing each under its own condition is the same
    (a multi-buffer dealloc only avoids freeing one buffer twice); the simplification then
    has nothing left to compare. A dealloc with any buffer of unknown origin is left whole.
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import DefUse, collect

    deallocs = [
        op for op in collect(module, "bufferization.dealloc") if not len(op.results)
    ]  # no results: nothing retained
    if not deallocs:
        return 0
    def_use = DefUse(module)
    split = 0
    for op in deallocs:
        operands = list(op.operands)
        count = len(operands) // 2
        if count < 2:
            continue
        buffers, conditions = operands[:count], operands[count:]
        origins = [_fresh_allocation(buffer, def_use) for buffer in buffers]
        if any(o is None for o in origins) or len(set(origins)) != count:
            continue
        segments = ir.DenseI32ArrayAttr.get([1, 1, 0], op.context)
        with ir.InsertionPoint(op), op.location:
            for buffer, condition in zip(buffers, conditions, strict=True):
                ir.Operation.create(
                    "bufferization.dealloc",
                    operands=[buffer, condition],
                    attributes={"operandSegmentSizes": segments},
                )
        op.erase()
        split += 1
    return split


def _fresh_allocation(buffer: Any, def_use: Any) -> Any:
    """The ``memref.alloc`` op ``buffer`` is the result of, directly or as the base buffer
    ``memref.extract_strided_metadata`` gives of it (what ownership-based deallocation
    frees); None for any other origin."""
    owner = def_use.owner(buffer)
    if owner is not None and owner.name == "memref.extract_strided_metadata":
        if buffer != owner.results[0]:
            return None
        owner = def_use.owner(owner.operands[0])
    return owner if owner is not None and owner.name == "memref.alloc" else None
