"""Matmul epilogues on the GPU: the elementwise consumer of a matmul (bias added along rows
or columns, an activation, a scaling, a residual add reading another tensor of the output's
shape, a cast), and the fill that zeroes its accumulator, run in the matmul's kernel.

The cost model folds them into the matmul's plan (:func:`fuse_epilogues`: ``fused`` lists
them; their own plans map nothing, so they get no kernel of their own). The schedule tiles
the *consumer* to blocks (and warps, or threads) and fuses the matmul and its fill into
each level (``transform.structured.fuse_into_containing_op``): every block computes its
tile of C and applies the epilogue to that tile. On the tensor-core path the rewrite of the
warp's matmul (:mod:`stagegraph.stages.gpu.mma`) then starts the accumulators at the fill's
value, applies the consumer's body to each accumulator element in registers and stores
only the consumer's result (:func:`apply_in_registers`): C never goes to memory. On the
SIMT path each thread's fill, matmul and epilogue run on its own output elements in one
kernel.

``gpu_cpu`` runs the fused schedule on the CPU, so the fusion's meaning is checked by
numbers there; what the register rewrite emits is checked by its IR and PTX.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.build import clone_mapped
from stagegraph.stages.analysis import OpFacts, PayloadFacts

#: Marks the warp's (or thread's) epilogue op left for the register rewrite.
EPILOGUE_ATTR = "stagegraph.gpu_epilogue"
_ANY = "!transform.any_op"
_TILED = f"({_ANY}) -> ({_ANY}, {_ANY})"
_FUSED = f"({_ANY}, {_ANY}) -> ({_ANY}, {_ANY})"


def init_fill(facts: PayloadFacts, matmul: OpFacts) -> int | None:
    """The index of the ``linalg.fill`` that initialises ``matmul``'s accumulator (its
    layer's ``init``), or None."""
    for layer in facts.layers:
        if layer.contraction == matmul.index and layer.init is not None:
            return layer.init if facts.ops[layer.init].name == "linalg.fill" else None
    return None


def epilogue_consumer(facts: PayloadFacts, matmul: OpFacts) -> int | None:
    """The elementwise consumer fused into ``matmul``'s kernel: the first op of its layer's
    epilogue (the analysis's single-use chain of same-shape elementwise consumers; the GPU
    normalization has already merged such a chain into one op), else the layer's cast (the
    single consumer that rounds C to another type, with or without more epilogue), or
    None."""
    for layer in facts.layers:
        if layer.contraction == matmul.index:
            return layer.epilogue[0] if layer.epilogue else layer.cast
    return None


def fuse_epilogues(kernels: list[Any], facts: PayloadFacts) -> list[Any]:
    """Fold each matmul's consumer and init fill into the matmul's plan (its ``fused``),
    where the matmul has an ``mma.sync`` plan (the fill alone too), a wgmma plan or a SIMT
    plan tiling both output dims (with a consumer); the folded ops' own plans then map
    nothing.
    Returns the new plans."""
    by_op = {plan.op: n for n, plan in enumerate(kernels)}
    ops = {op.index: op for op in facts.ops}
    out = list(kernels)
    claimed: set[int] = set()  # a consumer of two matmuls (mm1 + mm2) fuses with the first
    for plan in kernels:
        op = ops.get(plan.op)
        if op is None or op.name not in ("linalg.matmul", "linalg.batch_matmul"):
            continue
        if not plan.mma and not _simt_fusable(plan):
            continue
        consumer = epilogue_consumer(facts, op)
        consumer = None if consumer in claimed else consumer
        fill = init_fill(facts, op)
        fused = tuple(i for i in (consumer, fill) if i is not None and i in by_op)
        if not fused or (consumer not in fused and (plan.stages or not plan.mma)):
            continue  # (mma.sync: a fill alone is worth folding, C starts in registers; a
            # wgmma block drops a zero fill without a consumer itself: zero_fill.py)
        claimed.update(fused)
        out[by_op[plan.op]] = out[by_op[plan.op]].model_copy(update={"fused": fused})
        for index in fused:
            folded = kernels[by_op[index]]
            out[by_op[index]] = type(folded)(op=folded.op, name=folded.name)
    return out


def _simt_fusable(plan: Any) -> bool:
    """A SIMT matmul plan whose block and thread tiles leave the reduction loop whole."""
    return bool(plan.block_tile) and plan.block_tile[-1] == 0 and plan.thread_tile[-1] == 0


def _match(handle: str, index: int, attr: str) -> str:
    return (
        f"    {handle} = transform.structured.match attributes{{{attr} = {index} : i64}} "
        f"in %root : ({_ANY}) -> {_ANY}\n"
    )


def _fuse(producer: str, into: str, out: str) -> str:
    return (
        f"    {out}, {into}_f = transform.structured.fuse_into_containing_op {producer} "
        f"into {into} : {_FUSED}\n"
    )


def fused_script(plan: Any, attr: str, mapping: tuple[list[str], list[str]],
                 tiles: tuple[tuple[int, ...], tuple[int, ...]],
                 mma_attr: str | None) -> str:  # fmt: skip
    """Transform ops for a matmul ``plan`` with ``fused`` ops (a consumer comes after the
    matmul in program order, a fill before it): the consumer (else the matmul itself) tiled
    by ``tiles`` (block, then warp or thread tiles of C; or block tiles alone) with
    ``mapping`` at each level, the matmul and its fill fused into each; the inner matmul
    annotated
    ``mma_attr`` (tensor cores), the inner consumer :data:`EPILOGUE_ATTR`."""
    i = plan.op
    consumers = [x for x in plan.fused if x > i]
    fills = [x for x in plan.fused if x < i]
    root = "ep" if consumers else "mm"
    text = _match(f"%mm{i}", i, attr)
    if consumers:
        text += _match(f"%ep{i}", consumers[0], attr)
    if fills:
        text += _match(f"%fl{i}", fills[0], attr)
    level_handles = []
    for level, (sizes, maps) in enumerate(zip(tiles, mapping, strict=True)):
        target = f"%{root}{i}" if level == 0 else f"%{root}{i}_l0"
        forall = f"%fa{i}_l{level}"
        sizes = sizes if consumers else (*sizes, 0)  # the matmul's K loop stays whole
        text += (
            f"    %{root}{i}_l{level}, {forall} = transform.structured.tile_using_forall "
            f"{target} tile_sizes [{', '.join(map(str, sizes))}] "
            f"(mapping = [{', '.join(maps)}]) : {_TILED}\n"
        )
        into = forall
        if consumers:
            source = f"%mm{i}" if level == 0 else f"%mm{i}_l0"
            text += _fuse(source, forall, f"%mm{i}_l{level}")
            into = f"{forall}_f"
        if fills:
            fill = f"%fl{i}" if level == 0 else f"%fl{i}_l0"
            text += _fuse(fill, into, f"%fl{i}_l{level}")
        level_handles.append(forall)
    # The block forall carries the matmul's index (the launch's block dims are its plan's).
    text += f"    %ix{i} = transform.param.constant {i} : i64 -> !transform.param<i64>\n"
    text += (
        f'    transform.annotate {level_handles[0]} "{attr}" = %ix{i} '
        f": {_ANY}, !transform.param<i64>\n"
    )
    last = len(tiles) - 1  # the innermost level's handles
    if mma_attr is not None:
        from stagegraph.stages.gpu.mma_bounds import tile_annotations

        text += f'    transform.annotate %mm{i}_l{last} "{mma_attr}" : {_ANY}\n'
        text += tile_annotations(f"%mm{i}_l{last}", *tiles[last][-2:], str(i))
    if consumers:
        text += f'    transform.annotate %ep{i}_l{last} "{EPILOGUE_ATTR}" : {_ANY}\n'
    # The matmul and fill the fusion copied (the whole op, the block's) are dead once the
    # sizes read from their results read their inits instead.
    text += (
        f'    %fn{i} = transform.structured.match ops{{["func.func"]}} in %root '
        f": ({_ANY}) -> {_ANY}\n"
        f"    transform.apply_patterns to %fn{i} {{\n"
        "      transform.apply_patterns.memref.resolve_ranked_shaped_type_result_dims\n"
        f"    }} : {_ANY}\n    transform.apply_dce to %fn{i} : {_ANY}\n"
    )
    return text


def epilogue_kernel_script(plan: Any, attr: str, simt_maps: tuple[list[str], list[str]]) -> str:
    """The fused kernel's transform ops for ``plan`` (one with ``fused`` ops), on the
    tensor-core path (block tile, then the 2x2 warps' tiles) or the SIMT one (the plan's
    block and thread tiles without the reduction loop, mapped by ``simt_maps``: the
    schedule's block and thread mappings of those tiles)."""
    from stagegraph.stages.gpu.mma_layout import MMA_ATTR, WARP_GRID

    batched = plan.name == "linalg.batch_matmul"
    if plan.mma:
        blocks: tuple[int, ...] = (plan.tile_m, plan.tile_n)
        warps: tuple[int, ...] = (plan.tile_m // WARP_GRID[0], plan.tile_n // WARP_GRID[1])
        block_maps = ["#gpu.block<linear_dim_1>", "#gpu.block<linear_dim_0>"]
        if batched:
            blocks, warps = (1, *blocks), (0, *warps)
            block_maps.insert(0, "#gpu.block<linear_dim_2>")
        warp_maps = ["#gpu.warp<linear_dim_1>", "#gpu.warp<linear_dim_0>"]
        return fused_script(plan, attr, (block_maps, warp_maps), (blocks, warps), MMA_ATTR)
    tiles = (plan.block_tile[:-1], plan.thread_tile[:-1])
    return fused_script(plan, attr, simt_maps, tiles, None)


# -- the register rewrite (after bufferization, on one warp's memrefs) --------------------


class WarpEpilogue:
    """What surrounds one warp's matmul on its accumulator buffer ``c``: the fill before it
    (its scalar: the accumulators' start) or the copy into it (``source``: where C's start
    is read from, else ``c`` itself), and the consumer after it (:data:`EPILOGUE_ATTR`),
    each None when absent."""

    def __init__(self, matmul: Any) -> None:
        from stagegraph.mlir.bindings import ir

        c = matmul.operands[2]
        self.c, self.fill, self.consumer, self.copy = c, None, None, None
        for use in c.uses:
            owner = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if owner.name == "linalg.fill" and use.operand_number == 1:
                self.fill = owner
            elif owner.name == "memref.copy" and use.operand_number == 1:
                self.copy = owner  # a start shared with another matmul, copied in
            elif EPILOGUE_ATTR in owner.attributes:
                self.consumer = owner
        self.source = self.copy.operands[0] if self.copy is not None else c
        self.start = self.fill.operands[0] if self.fill is not None else None
        self.buffer = c.owner.operation if isinstance(c.owner, ir.Operation | ir.OpView) else None

    def finish(self, matmul: Any) -> None:
        """Erase the consumer, the matmul, the fill and the (now unread) accumulator buffer."""
        for op in (self.consumer, matmul, self.fill, self.copy):
            if op is not None:
                op.erase()
        buffer = self.buffer
        unread = buffer is not None and not list(buffer.results[0].uses)
        if unread and buffer.name == "memref.alloc":
            buffer.erase()


def _operand_split(op: Any) -> tuple[list[Any], list[Any]]:
    sizes = [int(x) for x in op.attributes["operandSegmentSizes"]]
    operands = list(op.operands)
    return operands[: sizes[0]], operands[sizes[0] :]


def _access(build: Any, amap: Any, loops: list[Any]) -> list[Any]:
    """The indices an indexing map reads at loop indices ``loops`` (each result a loop
    index or a constant: the projected permutations and broadcasts elementwise ops use)."""
    from stagegraph.errors import UnsupportedPayloadError
    from stagegraph.mlir.bindings import ir

    out = []
    for expr in amap.results:
        if isinstance(expr, ir.AffineDimExpr) or ir.AffineDimExpr.isinstance(expr):
            out.append(loops[ir.AffineDimExpr(expr).position])
        elif ir.AffineConstantExpr.isinstance(expr):
            out.append(build.const(ir.AffineConstantExpr(expr).value))
        else:
            raise UnsupportedPayloadError(
                f"the gpu schedule's epilogue reads an operand at {amap}: only loop indices "
                "and constants are supported")  # fmt: skip
    return out


def apply_in_registers(build: Any, consumer: Any, c: Any, value: Any, loops: list[Any]) -> None:
    """Store ``consumer``'s result at loop indices ``loops``: its body applied to the
    accumulator element ``value`` (for the input that is the accumulator buffer ``c``;
    converted to that input's type) and to the other inputs, each loaded where its
    indexing map reads at ``loops``."""
    from stagegraph.mlir.bindings import ir, linalg_native

    maps = [ir.AffineMapAttr(a).value for a in linalg_native.get_indexing_maps(consumer)]
    ins, outs = _operand_split(consumer)
    block = consumer.regions[0].blocks[0]
    args = list(block.arguments)
    mapped: dict[Any, Any] = {}
    for n, (operand, arg) in enumerate(zip([*ins, *outs], args, strict=True)):
        if operand == c and n < len(ins):
            mapped[arg] = _convert(build, value, arg.type)
        elif n < len(ins) or list(arg.uses):
            element = ir.MemRefType(operand.type).element_type
            mapped[arg] = build.op("memref.load", [element],
                                   [operand, *_access(build, maps[n], loops)])  # fmt: skip
    result = None
    for inner in block.operations:
        if inner.name == "linalg.yield":
            result = mapped.get(inner.operands[0], inner.operands[0])
            break
        if inner.name == "linalg.index":
            mapped[inner.results[0]] = loops[ir.IntegerAttr(inner.attributes["dim"]).value]
            continue
        with build.point, build.location:
            clone_mapped(inner, mapped)
    target = outs[0]
    build.op("memref.store", [], [result, target, *_access(build, maps[len(ins)], loops)])


def _convert(build: Any, value: Any, to: Any) -> Any:
    """``value`` (an f32 accumulator element) as float type ``to`` (truncated or widened)."""
    from stagegraph.mlir.bindings import ir

    have = ir.FloatType(value.type).width
    want = ir.FloatType(to).width
    if value.type == to:
        return value
    name = "arith.truncf" if want < have else "arith.extf"
    return build.op(name, [to], [value])


def rewrite_simt_epilogues(module: Any) -> int:
    """On the SIMT path, each thread's fused fill, matmul and consumer (on its few output
    elements) become scalar accumulators carried through one loop over K, the consumer's
    body applied to them, and only its result stored: no buffer for C. Returns how many."""
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.gpu.mma_layout import MMA_ATTR

    count = 0
    for consumer in collect(module, lambda op: EPILOGUE_ATTR in op.attributes):
        matmul = _matmul_feeding(consumer)
        if matmul is None or MMA_ATTR in matmul.attributes:
            continue
        _rewrite_simt(matmul)
        count += 1
    return count


def _matmul_feeding(consumer: Any) -> Any | None:
    """The matmul writing the buffer one of ``consumer``'s inputs reads, if any."""
    ins, _ = _operand_split(consumer)
    for value in ins:
        for use in value.uses:
            owner = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if owner.name in ("linalg.matmul", "linalg.batch_matmul") and use.operand_number == 2:
                return owner
    return None


def _rewrite_simt(matmul: Any) -> None:
    """One thread's ``tm x tn x K`` matmul and its epilogue, as described above."""
    from stagegraph.mlir.bindings import dialect, ir
    from stagegraph.stages.gpu.mma_layout import Builder as _Builder

    build, scf = _Builder(matmul), dialect("scf")
    epilogue = WarpEpilogue(matmul)
    a, b, c = (matmul.operands[i] for i in range(3))
    (tm, k), tn = ir.MemRefType(a.type).shape[-2:], ir.MemRefType(b.type).shape[-1]
    kind = ir.MemRefType(c.type).element_type
    places = [(i, j) for i in range(tm) for j in range(tn)]
    index = {v: build.const(v) for v in {0, 1, k, *range(tm), *range(tn)}}
    source = epilogue.source
    start = [epilogue.start if epilogue.start is not None else
             build.op("memref.load", [kind], [source, *build.batch(source), index[i], index[j]])
             for i, j in places]  # fmt: skip
    with build.location:
        loop = scf.ForOp(index[0], index[k], index[1], start, ip=build.point)
    outer, build.point = build.point, ir.InsertionPoint(loop.body)
    kk = loop.induction_variable
    element = ir.MemRefType(a.type).element_type
    rows = {i: _widen(build, build.op("memref.load", [element],
                                      [a, *build.batch(a), index[i], kk]), kind)
            for i in range(tm)}  # fmt: skip
    cols = {j: _widen(build, build.op("memref.load", [ir.MemRefType(b.type).element_type],
                                      [b, *build.batch(b), kk, index[j]]), kind)
            for j in range(tn)}  # fmt: skip
    sums = [build.op("math.fma", [kind], [rows[i], cols[j], acc])  # one rounding, as cuBLAS
            for (i, j), acc in zip(places, loop.inner_iter_args, strict=True)]  # fmt: skip
    build.op("scf.yield", [], sums)
    build.point = outer
    if epilogue.consumer is not None:
        build.point = ir.InsertionPoint(epilogue.consumer)
    for (i, j), value in zip(places, loop.results, strict=True):
        loops = [*build.batch(c), index[i], index[j]]
        if epilogue.consumer is None:
            build.op("memref.store", [], [value, c, *loops])
        else:
            apply_in_registers(build, epilogue.consumer, c, value, loops)
    epilogue.finish(matmul)


def _widen(build: Any, value: Any, to: Any) -> Any:
    """An input element in the accumulator's type (linalg.matmul's cast of its inputs)."""
    return value if value.type == to else _convert(build, value, to)


# -- normalization: a matmul reads the narrow inputs its widening copies were made from ----


def fold_input_widening(module: Any) -> int:
    """Let each matmul read the f16/bf16 tensors that an elementwise ``extf`` copy widened
    for it (PyTorch's half Linear layers import as a widening of x and W, an f32 matmul and
    a rounding back): ``linalg.matmul`` widens its inputs to the accumulator's type itself,
    so the meaning is the same, no widened copy is written, and the matmul takes the tensor
    cores. Returns how many operands changed."""
    from stagegraph.mlir.bindings import dialect, ir
    from stagegraph.mlir.walk import collect

    linalg = dialect("linalg")
    count = 0
    for op in collect(module, lambda o: o.name in ("linalg.matmul", "linalg.batch_matmul")):
        if "indexing_maps" in op.attributes and not _default_maps(op):
            continue  # a transposed or broadcast matmul: left as it is
        inputs = [_widened_from(op.operands[k]) for k in range(2)]
        if all(narrow is None for narrow in inputs):
            continue
        a, b = (narrow or op.operands[k] for k, narrow in enumerate(inputs))
        build = getattr(linalg, op.name.removeprefix("linalg."))
        with ir.InsertionPoint(op), op.location:
            made = build(a, b, outs=[op.operands[2]])  # its body widens the new inputs
        op.results[0].replace_all_uses_with(made)
        op.erase()
        count += sum(n is not None for n in inputs)
    return count


def _default_maps(op: Any) -> bool:
    """Whether a matmul's explicit indexing maps are the default ones (its builder's)."""
    from stagegraph.mlir.bindings import ir, linalg_native

    maps = [ir.AffineMapAttr(a).value for a in linalg_native.get_indexing_maps(op)]
    batch = 1 if op.name == "linalg.batch_matmul" else 0
    d = [ir.AffineExpr.get_dim(i) if hasattr(ir.AffineExpr, "get_dim") else
         ir.AffineDimExpr.get(i) for i in range(3 + batch)]  # fmt: skip
    lead = d[:batch]
    m, n, k = d[batch:]
    want = [[*lead, m, k], [*lead, k, n], [*lead, m, n]]
    return [list(x.results) for x in maps] == want


def _widened_from(value: Any) -> Any | None:
    """The input of the elementwise generic that only ``extf``-widens it into ``value``."""
    from stagegraph.mlir.bindings import ir, linalg_native

    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView) or owner.name != "linalg.generic":
        return None
    ins, outs = _operand_split(owner)
    if len(ins) != 1 or len(outs) != 1:
        return None
    maps = [ir.AffineMapAttr(a).value for a in linalg_native.get_indexing_maps(owner)]
    rank = ir.RankedTensorType(value.type).rank
    identity = ir.AffineMap.get_identity(rank)
    if any(m != identity for m in maps) or ir.RankedTensorType(ins[0].type).rank != rank:
        return None
    block = owner.regions[0].blocks[0]
    body = list(block.operations)
    if [o.name for o in body] != ["arith.extf", "linalg.yield"]:
        return None
    widen, done = body
    if widen.operands[0] != block.arguments[0] or done.operands[0] != widen.results[0]:
        return None
    return ins[0]
