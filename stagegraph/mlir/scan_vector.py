"""A scan along the contiguous (last) dimension, as vector code: an in-register prefix scan.

Stepping the scanned dimension one index at a time (:mod:`stagegraph.mlir.scan`) reads a
strided column per step when that dimension is the last one: a gather that bufferization
copies element by element, nothing vectorized. Here each row is scanned in chunks of
``lanes`` contiguous elements instead:

1. ``x = transfer_read(row[c : c + lanes])``;
2. an in-register inclusive prefix scan (Hillis-Steele): for ``s = 1, 2, 4, ...``,
   ``x = f(x, shift_right(x, s))``, the combiner's identity shifted in: ``log2(lanes)``
   shuffles and combines;
3. the carry: ``x = f(x, broadcast(previous chunk's last lane))`` (the first chunk of an
   inclusive scan has none; an exclusive scan starts from its initial accumulator);
4. an exclusive scan writes ``[carry, x[0], ..., x[lanes - 2]]`` (one two-source shuffle).

Only a combiner that is one associative arith op of the two block arguments is taken
(``addf``/``mulf``/``maximumf``/``minimumf`` and their integer forms): the prefix scan
reassociates it, which for floats changes the rounding as any blocked sum does. Rows are
:data:`LANES` long chunks and, where the length is not a multiple, one shorter last chunk
(no masks). Rows are independent: the outer loop is an ``scf.forall``, so they spread over
threads. Anything else (another combiner, a dynamic shape, a used final accumulator) keeps
the stepping form.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.scan_flip import reverse_scan_operands
from stagegraph.mlir.walk import defining_op

#: Associative combiners the in-register prefix scan may reassociate, with their identity
#: (floats: a number; integers: a function of the bit width). Lanes shifted in below the
#: first carry the identity, so every lane holds a real value: a junk lane combined and then
#: discarded could be a denormal, and one denormal operand costs a microcode assist per
#: vector instruction (a cumprod was 15x slower that way).
IDENTITY: dict[str, Any] = {
    "arith.addf": -0.0, "arith.mulf": 1.0,
    "arith.maximumf": float("-inf"), "arith.minimumf": float("inf"),
    "arith.addi": lambda width: 0, "arith.muli": lambda width: 1,
    "arith.maxsi": lambda width: -(1 << (width - 1)),
    "arith.minsi": lambda width: (1 << (width - 1)) - 1,
    "arith.maxui": lambda width: 0, "arith.minui": lambda width: -1,
}  # fmt: skip
ASSOCIATIVE = frozenset(IDENTITY)
#: Chunk length (elements): 512 bits of f32, two AVX2 registers; LLVM splits as the
#: target needs. A row whose length it does not divide ends with one shorter chunk.
LANES = 16


def combiner_op(op: Any) -> Any | None:
    """The scan region's single associative op combining its two arguments (None: other)."""
    block = op.regions[0].blocks[0]
    inner = [child.operation for child in block.operations]
    if len(inner) != 2 or inner[0].name not in ASSOCIATIVE:
        return None
    combine, done = inner
    arguments = set(block.arguments)
    if len(combine.operands) != 2 or set(combine.operands) != arguments:
        return None
    if len(done.operands) != 1 or done.operands[0] != combine.results[0]:
        return None
    return combine


def try_vector_scan(op: Any, source: Any, acc_init: Any, dim: int) -> bool:
    """Replace the scan ``op`` by the chunked vector form when it fits; True when done."""
    from stagegraph.mlir.bindings import ir

    in_type = ir.RankedTensorType(source.type)
    if in_type.rank < 2 or dim != in_type.rank - 1 or not in_type.has_static_shape:
        return False
    if len(list(op.results[1].uses)) != 0:  # the final accumulator is not computed here
        return False
    combine = combiner_op(op)
    if combine is None:
        return False
    inclusive = ir.BoolAttr(op.attributes["inclusive"]).value
    reverse = reverse_scan_operands(source, op.results[0], dim)
    with ir.InsertionPoint(op):
        read = source if reverse is None else reverse[0]
        rows = _as_rows(read)
        acc_rows = acc_init if inclusive else _as_rows(acc_init, last=False)  # unread: inclusive
        emitter = _Emitter(combine, ir.RankedTensorType(rows.type), reverse is not None)
        out = _from_rows(emitter.rows(rows, acc_rows, inclusive), in_type)
    if reverse is None:
        op.results[0].replace_all_uses_with(out)
        return True
    for flip in reverse[1]:  # the flips of the result: the reverse scan is their value
        flip.results[0].replace_all_uses_with(out)
        flip.erase()
    op.results[0].replace_all_uses_with(out)  # no uses left: erasing the scan is safe
    flip_in = defining_op(source)
    if not list(flip_in.results[0].uses) or all(
        use.owner.operation == op for use in flip_in.results[0].uses
    ):
        op.operands[0] = read  # then the input's flip has no reader left
        flip_in.erase()
    return True


def _as_rows(value: Any, last: bool = True) -> Any:
    """``value`` with its leading dims collapsed into one: rows x the last dim (``last``),
    or one dim of rows (an accumulator, which has no scanned dim)."""
    from stagegraph.mlir.bindings import ir, tensor

    kind = ir.RankedTensorType(value.type)
    keep = 1 if last else 0
    if kind.rank <= 1 + keep:
        return value
    leading = list(range(kind.rank - keep))
    groups = [leading, [kind.rank - 1]] if last else [leading]
    rows = 1
    for extent in kind.shape[: kind.rank - keep]:
        rows *= extent
    shape = [rows, kind.shape[-1]] if last else [rows]
    flat = ir.RankedTensorType.get(shape, kind.element_type)
    return tensor.CollapseShapeOp(flat, value, _reassociation(groups)).result


def _from_rows(value: Any, kind: Any) -> Any:
    """``value`` (rows x last dim) expanded back to ``kind``'s shape."""
    from stagegraph.mlir.bindings import tensor

    if kind.rank == 2:
        return value
    groups = [list(range(kind.rank - 1)), [kind.rank - 1]]
    return tensor.ExpandShapeOp(kind, value, _reassociation(groups), [], list(kind.shape)).result


def _reassociation(groups: list[list[int]]) -> Any:
    from stagegraph.mlir.bindings import ir

    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get(
        [ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in group]) for group in groups]
    )


class _Emitter:
    """Builds the row loops of one scan (insertion point and location set by the caller)."""

    def __init__(self, combine: Any, in_type: Any, reverse: bool = False) -> None:
        from stagegraph.mlir.bindings import ir

        self.combine, self.reverse = combine, reverse
        self.rows_count, self.length = in_type.shape
        self.element = in_type.element_type
        self.index = ir.IndexType.get()
        self.map = ir.AffineMapAttr.get(ir.AffineMap.get_minor_identity(2, 1))
        self.first = ir.BlockArgument(combine.operands[0]).arg_number  # the block arg "input"

    def vector_type(self, lanes: int) -> Any:
        from stagegraph.mlir.bindings import ir

        return ir.VectorType.get([lanes], self.element)

    def constant(self, value: int) -> Any:
        from stagegraph.mlir.bindings import arith, ir

        return arith.ConstantOp(self.index, ir.IntegerAttr.get(self.index, value)).result

    def f(self, later: Any, earlier: Any) -> Any:
        """The combiner on vectors: block argument 0 is the input (later), 1 the accumulator."""
        from stagegraph.mlir.bindings import ir

        operands = [later, earlier] if self.first == 0 else [earlier, later]
        held = self.combine.attributes
        attributes = {held[i].name: held[i].attr for i in range(len(held))}
        return ir.Operation.create(self.combine.name, results=[later.type], operands=operands,
                                   attributes=attributes).result  # fmt: skip

    def identity(self, lanes: int) -> Any:
        """The combiner's identity splat over ``lanes``."""
        from stagegraph.mlir.bindings import arith, ir

        value = IDENTITY[self.combine.name]
        if isinstance(self.element, ir.FloatType):
            scalar = ir.FloatAttr.get(self.element, value)
        else:
            scalar = ir.IntegerAttr.get(self.element, value(self.element.width))
        kind = self.vector_type(lanes)
        return arith.ConstantOp(kind, ir.DenseElementsAttr.get_splat(kind, scalar)).result

    def prefix(self, x: Any, lanes: int) -> Any:
        """In-register inclusive prefix scan of one chunk (Hillis-Steele): for shift 1, 2,
        4, ... each lane combines with the lane ``shift`` below it (the identity below 0)."""
        from stagegraph.mlir.bindings import vector

        identity = self.identity(lanes)
        shift = 1
        while shift < lanes:
            # shuffle(x, identity): lane i takes x[i - shift], or the identity below lane 0.
            picks = [i - shift if i >= shift else lanes for i in range(lanes)]
            x = self.f(x, vector.shuffle(x, identity, picks))
            shift *= 2
        return x

    def rows(self, source: Any, acc_init: Any, inclusive: bool) -> Any:
        """An ``scf.forall`` over rows, each scanned by :meth:`row`; returns the output."""
        from stagegraph.mlir.bindings import ir, scf, tensor

        row_type = ir.RankedTensorType.get([1, self.length], self.element)
        # Every element is written: a fresh tensor, so the init's fill (dead now) goes away.
        fresh = tensor.EmptyOp([self.rows_count, self.length], self.element).result
        forall = scf.ForallOp([0], [self.rows_count], [1], shared_outs=[fresh])
        with ir.InsertionPoint(forall.body):
            r = forall.induction_variables[0]
            shared = forall.inner_iter_args[0]
            dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
            offsets = ir.DenseI64ArrayAttr.get([dynamic, 0])
            sizes = ir.DenseI64ArrayAttr.get([1, self.length])
            ones = ir.DenseI64ArrayAttr.get([1, 1])
            row_out = tensor.ExtractSliceOp(row_type, shared, [r], [], [], offsets, sizes,
                                            ones).result  # fmt: skip
            done = self.row(source, row_out, acc_init, r, inclusive)
            terminator = forall.terminator()
            with ir.InsertionPoint(terminator.regions[0].blocks[0]):
                tensor.ParallelInsertSliceOp(done, shared, [r], [], [], offsets, sizes, ones)
        return forall.results[0]

    def row(self, source: Any, row_out: Any, acc_init: Any, r: Any, inclusive: bool) -> Any:
        """Scan row ``r`` of ``source`` into ``row_out`` (1 x length): a loop over the
        full chunks, then the shorter last chunk. ``carry`` is the scan so far, broadcast
        (None before the first chunk of an inclusive scan)."""
        from stagegraph.mlir.bindings import ir, scf, tensor, vector

        full = self.length // LANES * LANES
        carry, start = None, 0
        if not inclusive:
            carry = vector.broadcast(self.vector_type(LANES), tensor.extract(acc_init, [r]))
        elif full:  # the first chunk has no carry: peeled
            row_out, carry = self.chunk(source, row_out, r, self.constant(0), LANES, None, True)
            start = LANES
        if start < full:
            loop = scf.ForOp(self.constant(start), self.constant(full), self.constant(LANES),
                             [row_out, carry])  # fmt: skip
            with ir.InsertionPoint(loop.body):
                out_c, carry_c = loop.inner_iter_args
                done = self.chunk(source, out_c, r, loop.induction_variable, LANES, carry_c,
                                  inclusive)  # fmt: skip
                scf.YieldOp(list(done))
            row_out, carry = loop.results
        tail = self.length - full
        if tail:
            if carry is not None:  # the carry is the same in every lane: take the first ones
                carry = vector.shuffle(carry, carry, [0] * tail)
            row_out, _ = self.chunk(source, row_out, r, self.constant(full), tail, carry,
                                    inclusive)  # fmt: skip
        return row_out

    def chunk(self, source: Any, row_out: Any, r: Any, c: Any, lanes: int, carry: Any,
              inclusive: bool) -> tuple[Any, Any]:  # fmt: skip
        """Scan ``lanes`` elements of row ``r`` from column ``c`` after ``carry`` (None:
        nothing before) into ``row_out``; returns it and the new carry."""
        from stagegraph.mlir.bindings import arith, vector

        flip = list(range(lanes - 1, -1, -1))
        if self.reverse:  # logical column c is physical length - 1 - c: read from the end
            c = arith.subi(self.constant(self.length - lanes), c)
        x = self.read(source, r, c, lanes)
        if self.reverse:
            x = vector.shuffle(x, x, flip)
        x = self.prefix(x, lanes)
        if carry is not None:
            x = self.f(x, carry)
        written = x
        if not inclusive:  # [carry, x[0], ..., x[lanes - 2]]
            written = vector.shuffle(carry, x, [0] + [lanes + i for i in range(lanes - 1)])
        if self.reverse:
            written = vector.shuffle(written, written, flip)
        return self.write(written, row_out, c), vector.shuffle(x, x, [lanes - 1] * lanes)

    def read(self, source: Any, r: Any, c: Any, lanes: int) -> Any:
        from stagegraph.mlir.bindings import arith, ir, vector

        if isinstance(self.element, ir.FloatType):  # in bounds: the padding is never read
            padding = arith.ConstantOp(self.element, ir.FloatAttr.get(self.element, 0.0)).result
        else:
            padding = arith.ConstantOp(self.element, ir.IntegerAttr.get(self.element, 0)).result
        kind = self.vector_type(lanes)
        return vector.transfer_read(kind, source, [r, c], self.map, padding, [True])

    def write(self, x: Any, row_out: Any, c: Any) -> Any:
        from stagegraph.mlir.bindings import vector

        return vector.transfer_write(row_out.type, x, row_out, [self.constant(0), c], self.map,
                                     [True])  # fmt: skip
