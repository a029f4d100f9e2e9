"""Depthwise and grouped NCHW convolutions (f32/f64, stride <= 2) as a direct kernel
vectorized along the output width.

A depthwise convolution (``groups == channels``, any channel multiplier) has no reduction
over channels to vectorize, and its NCHW rows are contiguous: the kernel reads a vector of
one input row per window tap, multiplies it by the tap's broadcast weight and accumulates
a vector of one output row (register blocked: several width vectors and, for a channel
multiplier, several filters per block, and rows; window taps unrolled; a stride ``s``
reads ``s`` vectors and keeps every ``s``-th lane with one shuffle; a grouped convolution
loops over the channels of its group inside). Nothing is transposed: an NCHW
model stays NCHW (its 1x1 convolutions are NCHW matmuls, :mod:`.pointwise`), where the
channels-last form (:func:`.rewrites.depthwise_to_channels_last`) pays two transposes per
convolution, more than the convolution itself at MobileNet sizes.

The rewrite runs before the generic schedule labels its ops (``prepare``); the kernel is
``scf`` loops and ``vector`` ops on tensors, so the schedule leaves it as it is and
bufferization turns it into loads and stores. Output channels run as ``scf.forall`` (the
threads' loop); rows and width blocks as ``scf.for``. Which convolutions take it, and its
blocking, come from the shape and the target's lanes (:func:`width_plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.bindings import arith, ir, scf, tensor, vector
from stagegraph.mlir.build import collapse_shape, expand_shape
from stagegraph.mlir.walk import top_level_ops
from stagegraph.stages.x86.conv.index_arith import IndexArithmetic
from stagegraph.stages.x86.conv.pointwise import window_attr
from stagegraph.stages.x86.generic.params import largest_divisor_at_most

_DEPTHWISE = "linalg.depthwise_conv_2d_nchw_chw"
_GROUPED = "linalg.conv_2d_ngchw_gfchw"
#: Accumulator vectors per block: the rest of 16 registers holds the input vector, the
#: broadcast weights and the shuffles of a strided read (the AVX2 floor; AVX-512 has 32).
ACCUMULATORS = 8
#: Broadcast weights kept in registers per output channel when they fit (depthwise 3x3:
#: 9); a larger window reloads them from the filter per block (a broadcast load).
HOISTED_WEIGHTS = 16
#: Strides this kernel reads with one shuffle per tap; larger ones keep the other paths.
MAX_STRIDE = 2


@dataclass(frozen=True)
class WidthPlan:
    """Register blocking of the output: ``rows`` rows times ``vectors`` vectors of
    ``lanes`` columns times ``filters`` filters of a group per block; along a row,
    ``blocks`` whole blocks, then ``tail`` columns in a block whose last vector is
    masked."""

    lanes: int
    vectors: int
    filters: int
    rows: int
    blocks: int
    tail: int


def width_plan(out_width: int, filters: int, lanes: int, out_height: int = 1) -> WidthPlan:
    """The blocking of an output of ``out_height`` rows of ``out_width`` columns:
    vectors of the target's ``lanes`` (fewer, a power of two, when the row is shorter: a
    7-wide row takes 8 lanes), as many per block as the row and :data:`ACCUMULATORS`
    allow; then the largest divisor of the group's ``filters`` that fits the remaining
    accumulators (each input vector then feeds that many FMAs); then the largest divisor
    of the rows that fits the rest (independent FMA chains for short rows: a 14-wide row
    is one vector, whose single chain waits on the FMA latency)."""
    width_lanes = min(lanes, 1 << max(0, math.ceil(math.log2(max(1, out_width)))))
    row_vectors = math.ceil(out_width / width_lanes)
    vectors = min(row_vectors, ACCUMULATORS)
    block_filters = largest_divisor_at_most(filters, ACCUMULATORS // vectors)
    rows = largest_divisor_at_most(out_height, ACCUMULATORS // (vectors * block_filters))
    blocks, tail = divmod(out_width, vectors * width_lanes)
    return WidthPlan(width_lanes, vectors, block_filters, rows, blocks, tail)


def _static(value: Any) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _float(value: Any) -> bool:
    element = ir.RankedTensorType(value.type).element_type
    return isinstance(element, ir.F32Type | ir.F64Type)


def takes_width_kernel(op: Any) -> bool:
    """Whether ``op`` is a static float depthwise/grouped NCHW convolution this kernel
    runs: a window wider than one column (a pointwise one is a matmul per group,
    :mod:`.pointwise`) and a stride of at most :data:`MAX_STRIDE`.

    Any number of channels per group: the alternative, a loop over the groups of dense
    NCHW convolutions (:func:`.rewrites.grouped_conv_to_group_loops`), gathers its
    channel vectors lane by lane. Measured on an AVX-512 Xeon, one thread, against
    PyTorch eager (time ratios, loaded machine): 64 channels at 56x56 in 4 groups 2.6 ->
    0.94, in 2 groups 16 -> 1.1; 256 channels at 28x28 in 32 groups 1.6 -> 0.46."""
    if op.name not in (_DEPTHWISE, _GROUPED) or len(op.operands) != 3 or len(op.results) != 1:
        return False
    if not all(isinstance(v.type, ir.RankedTensorType) for v in op.operands):
        return False
    if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
        return False
    if not all(_float(v) for v in op.operands):
        return False
    if len({str(ir.RankedTensorType(v.type).element_type) for v in op.operands}) != 1:
        return False
    kernel = _static(op.operands[1])
    return kernel[-1] > 1 and max(window_attr(op, "strides")) <= MAX_STRIDE


def grouped_to_width_kernels(fn: Any, lanes: int) -> int:
    """Rewrite every convolution of ``fn`` that :func:`takes_width_kernel` into the width
    kernel, with vectors of up to ``lanes`` lanes; returns the count."""
    count = 0
    for op in top_level_ops(fn):
        if not takes_width_kernel(op):
            continue
        init = op.operands[2].owner
        with ir.InsertionPoint(op), op.location:
            result = _rewrite(op, lanes)
        op.results[0].replace_all_uses_with(result)
        op.erase()
        erase_unused_init(init)
        count += 1
    return count


def erase_unused_init(op: Any) -> None:
    """Erase ``op`` (the replaced convolution's init: a fill, a reshape) and then its
    operands' producers while nothing uses them: the kernel starts from the fill's value."""
    if not isinstance(op, ir.Operation | ir.OpView):
        return
    op = op.operation
    if op.name not in ("linalg.fill", "tensor.empty", "tensor.expand_shape"):
        return
    if any(True for result in op.results for _ in result.uses):
        return
    producers = [operand.owner for operand in op.operands]
    op.erase()
    for producer in producers:
        erase_unused_init(producer)


def _rewrite(op: Any, lanes: int) -> Any:
    """The kernel's result in ``op``'s type (depthwise: through NGCHW views, free
    reshapes)."""
    image, kernel, init = op.operands
    fill = fill_value(init)
    if op.name == _GROUPED:
        return _Kernel(op, image, kernel, init, lanes, fill).build()
    n, c, h, w = _static(image)
    _, kh, kw = _static(kernel)
    out = _static(init)
    groups, shape = [[0], [1, 2], [3], [4]], [out[0], out[1], 1, out[2], out[3]]
    made = _Kernel(
        op,
        expand_shape(image, groups, [n, c, 1, h, w]),
        expand_shape(kernel, [[0, 1, 2], [3], [4]], [c, 1, 1, kh, kw]),
        init if fill is not None else expand_shape(init, groups, shape),
        lanes,
        fill,
        shape,
    ).build()
    return collapse_shape(made, groups, out)


def fill_value(init: Any) -> Any:
    """The scalar a ``linalg.fill`` init holds, else None."""
    owner = init.owner
    if isinstance(owner, ir.Operation | ir.OpView) and owner.operation.name == "linalg.fill":
        return owner.operation.operands[0]
    return None


class _Kernel(IndexArithmetic):
    """Builds the loops of one NGCHW convolution at the current insertion point."""

    def __init__(
        self,
        op: Any,
        image: Any,
        kernel: Any,
        init: Any,
        lanes: int,
        fill: Any = None,
        shape: list[int] | None = None,
    ) -> None:
        """``init``: the NGCHW accumulator, or when ``fill`` (its scalar) is given, any
        tensor of ``shape`` (default: ``init``'s), whose values are not read."""
        self.image, self.kernel = image, kernel
        shape = shape or _static(init)
        self.n, self.groups, self.filters, self.oh, self.ow = shape
        _, _, self.channels, self.kh, self.kw = _static(kernel)
        self.in_width = _static(image)[-1]
        self.strides, self.dilations = window_attr(op, "strides"), window_attr(op, "dilations")
        self.plan = width_plan(self.ow, self.filters, lanes, self.oh)
        self.element = ir.RankedTensorType(init.type).element_type
        self.vector_type = ir.VectorType.get([self.plan.lanes], self.element)
        self.fill, self.init = fill, init
        IndexArithmetic.__init__(self, op)
        if self.fill is not None:  # accumulators start at the fill value: no fill pass
            self.init = tensor.EmptyOp(shape, self.element).result

    def build(self) -> Any:
        plan = self.plan
        for value in (0, 1):
            self.index(value)
        bounds = [self.n, self.groups, self.filters // plan.filters]
        over_channels = scf.ForallOp([0, 0, 0], bounds, [1, 1, 1], [self.init])
        with ir.InsertionPoint(over_channels.body):
            n, g, block = over_channels.induction_variables
            shared = over_channels.inner_iter_args[0]
            first = self.affine(block, plan.filters, 0)
            sizes = [1, 1, plan.filters, self.oh, self.ow]
            offsets = [ir.ShapedType.get_dynamic_stride_or_offset()] * 3 + [0, 0]
            tile_type = ir.RankedTensorType.get(sizes, self.element)
            tile = tensor.ExtractSliceOp(
                tile_type, shared, [n, g, first], [], [], offsets, sizes, [1] * 5
            ).result
            weights = self._hoisted_weights(g, first)
            step = self.index(plan.rows)
            over_rows = scf.ForOp(self.index(0), self.index(self.oh), step, [tile])
            with ir.InsertionPoint(over_rows.body):
                row = over_rows.induction_variable
                rows = [self.affine(row, 1, r) for r in range(plan.rows)]
                made = self._rows(over_rows.inner_iter_args[0], (n, g, first, rows), weights)
                scf.YieldOp([made])
            terminator = scf.InParallelOp()
            with ir.InsertionPoint(terminator.region.blocks[0]):
                tensor.ParallelInsertSliceOp(
                    over_rows.results[0], shared, [n, g, first], [], [], offsets, sizes, [1] * 5
                )
        return over_channels.results[0]

    def _hoisted_weights(self, g: Any, first: Any) -> dict | None:
        """The block's broadcast weights, once per output channel, when one input channel
        per group and they fit :data:`HOISTED_WEIGHTS` (else None: loaded per tap)."""
        if self.channels != 1 or self.plan.filters * self.kh * self.kw > HOISTED_WEIGHTS:
            return None
        zero = self.index(0)
        return {
            (f, kh, kw): self._weight(g, self.affine(first, 1, f), zero, kh, kw)
            for f in range(self.plan.filters)
            for kh in range(self.kh)
            for kw in range(self.kw)
        }

    def _weight(self, g: Any, f: Any, channel: Any, kh: int, kw: int) -> Any:
        at = [g, f, channel, self.index(kh), self.index(kw)]
        scalar = tensor.ExtractOp(self.kernel, at).result
        return vector.BroadcastOp(self.vector_type, scalar).result

    def _rows(self, tile: Any, where: tuple, weights: dict | None) -> Any:
        """One block of output rows: the loop over whole blocks, then the tail block."""
        plan = self.plan
        step = plan.vectors * plan.lanes
        loop_blocks, peeled = plan.blocks, []
        if plan.blocks and not self._reads_in_bounds((plan.blocks - 1) * step, plan.vectors):
            loop_blocks -= 1  # its strided reads pass the row's end: masked, peeled
            peeled.append(((plan.blocks - 1) * step, plan.vectors))
        if plan.tail:
            peeled.append((plan.blocks * step, math.ceil(plan.tail / plan.lanes)))
        if loop_blocks:
            over_blocks = scf.ForOp(self.index(0), self.index(loop_blocks), self.index(1), [tile])
            with ir.InsertionPoint(over_blocks.body):
                start = self.affine(over_blocks.induction_variable, step, 0)
                body = over_blocks.inner_iter_args[0]
                scf.YieldOp([self._block(body, where, start, None, plan.vectors, weights)])
            tile = over_blocks.results[0]
        for start, vectors in peeled:
            tile = self._block(tile, where, self.index(start), start, vectors, weights)
        return tile

    def _reads_in_bounds(self, start: int, vectors: int, kw: int | None = None) -> bool:
        """Whether the reads of a block at column ``start`` (of tap ``kw``, default the
        last; ``stride`` vectors each) end inside the input row."""
        kw = self.kw - 1 if kw is None else kw
        last = (start + (vectors - 1) * self.plan.lanes) * self.strides[1]
        end = last + kw * self.dilations[1] + self.strides[1] * self.plan.lanes
        return end <= self.in_width

    def _block(
        self,
        tile: Any,
        where: tuple,
        start: Any,
        static_start: int | None,
        vectors: int,
        weights: dict | None,
    ) -> Any:
        """Accumulate one block of rows x filters x ``vectors`` output vectors and write
        it. ``static_start``: the block's first column when it is peeled (its vectors are
        then masked where they pass the row's end), None in the loop (all in bounds)."""
        n, g, first, rows = where
        lanes, filters = self.plan.lanes, self.plan.filters
        columns = [self.affine(start, 1, u * lanes) for u in range(vectors)]
        if static_start is None:
            whole = [True] * vectors
            reads = {(u, kw): True for u in range(vectors) for kw in range(self.kw)}
        else:
            whole = [static_start + (u + 1) * lanes <= self.ow for u in range(vectors)]
            reads = {
                (u, kw): self._reads_in_bounds(static_start + u * lanes, 1, kw)
                for u in range(vectors)
                for kw in range(self.kw)
            }
        units = [
            (r, f, u) for r in range(len(rows)) for f in range(filters) for u in range(vectors)
        ]
        flat = [self._initial(tile, f, rows[r], columns[u], whole[u]) for r, f, u in units]

        def taps(channel: Any, values: list[Any]) -> list[Any]:
            acc = dict(zip(units, values, strict=True))
            for kh in range(self.kh):
                for kw in range(self.kw):
                    inputs = {}
                    for r, row in enumerate(rows):
                        in_row = self.affine(row, self.strides[0], kh * self.dilations[0])
                        for u, col in enumerate(columns):
                            inputs[r, u] = self._read(n, g, channel, in_row, col, kw, reads[u, kw])
                    for f in range(filters):
                        weight = (weights or {}).get((f, kh, kw))
                        if weight is None:
                            weight = self._weight(g, self.affine(first, 1, f), channel, kh, kw)
                        for r in range(len(rows)):
                            for u in range(vectors):
                                acc[r, f, u] = vector.FMAOp(
                                    inputs[r, u], weight, acc[r, f, u]
                                ).result
            return [acc[unit] for unit in units]

        if self.channels == 1:
            flat = taps(self.index(0), flat)
        else:
            over = scf.ForOp(self.index(0), self.index(self.channels), self.index(1), flat)
            with ir.InsertionPoint(over.body):
                scf.YieldOp(taps(over.induction_variable, list(over.inner_iter_args)))
            flat = list(over.results)
        for (r, f, u), value in zip(units, flat, strict=True):
            tile = self._write(value, tile, f, rows[r], columns[u], whole[u])
        return tile

    def _minor(self) -> Any:
        return ir.AffineMap.get_minor_identity(5, 1)

    def _initial(self, tile: Any, f: int, row: Any, col: Any, whole: bool) -> Any:
        if self.fill is not None:
            return vector.BroadcastOp(self.vector_type, self.fill).result
        at = [self.index(0), self.index(0), self.index(f), row, col]
        padding = arith.ConstantOp(self.element, 0.0).result
        return vector.TransferReadOp(
            self.vector_type, tile, at, self._minor(), padding, [whole]
        ).result

    def _write(self, value: Any, tile: Any, f: int, row: Any, col: Any, whole: bool) -> Any:
        at = [self.index(0), self.index(0), self.index(f), row, col]
        made = vector.TransferWriteOp(tile.type, value, tile, at, self._minor(), [whole])
        return made.result

    def _read(
        self, n: Any, g: Any, channel: Any, in_row: Any, col: Any, kw: int, in_bounds: bool
    ) -> Any:
        """The input under output columns ``col..`` for tap ``kw``: one vector at unit
        stride, else ``stride`` vectors' worth and every ``stride``-th lane."""
        stride, lanes = self.strides[1], self.plan.lanes
        at = self.affine(col, stride, kw * self.dilations[1])
        wide = ir.VectorType.get([lanes * stride], self.element)
        padding = arith.ConstantOp(self.element, 0.0).result
        read = vector.TransferReadOp(
            wide, self.image, [n, g, channel, in_row, at], self._minor(), padding, [in_bounds]
        ).result
        if stride == 1:
            return read
        return vector.ShuffleOp(read, read, [i * stride for i in range(lanes)]).result
