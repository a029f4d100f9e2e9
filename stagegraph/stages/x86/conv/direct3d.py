"""Channels-last 3-D convolutions (``linalg.conv_3d_ndhwc_dhwcf``, f32/f64) as one direct
kernel, register blocked over images, rows, columns and filter vectors
(:mod:`.direct3d_plan`).

The depth loops of 2-D convolutions (:func:`.rewrites.conv3d_to_conv2d_loops`) reload and
store every output tile once per depth tap and per channel chunk, with at most a row of
accumulators for one filter vector; its fully unrolled 2-D window kept every broadcast of
an input row live, so LLVM spilled them (a 16 -> 16 channel 5^3 window ran at 16% of the
FMA peak). Here a block's accumulators stay in registers for the whole reduction: loops
over the depth taps and the rows of taps, and one loop over the taps of a row times the
channels, which are contiguous in both the channels-last input and the filter (``kw * C
+ c``; with a dilated width, a loop over the taps around one over the channels). Each step
loads the block's filter vectors, broadcasts one input element per output position and
issues one FMA per accumulator.

A convolution of a zero-padded input (``tensor.insert_slice`` into zeros, through the
transpose into channels-last: a stride-1 transposed convolution, a padded convolution)
gives each block the taps that read real input for at least one of its positions (loop
bounds computed from the block's position); the others only multiply zeros. Filters that
end in a partial vector are padded to whole vectors in a copy of the (small) filter, and
the output's last vector is written masked.

Images, output depth and filter blocks run as ``scf.forall`` (the threads' loop); rows and
column blocks as ``scf.for``. The rewrite runs in ``prepare`` before the generic schedule
labels its ops (the kernel is ``scf``, ``tensor`` and ``vector`` ops, which the schedule
leaves as they are); ``GenericParams.conv3d_direct`` turns it off (the depth loops of 2-D
convolutions then), ``GenericParams.conv3d_accumulators`` caps the block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stagegraph.mlir.bindings import arith, ir, scf, tensor, vector
from stagegraph.mlir.build import collapse_shape, named_structured_op
from stagegraph.mlir.walk import DefUse, top_level_ops
from stagegraph.stages.x86.conv.depthwise import erase_unused_init, fill_value
from stagegraph.stages.x86.conv.direct3d_plan import (
    BlockPlan,
    Conv3dShape,
    Target3d,
    Window,
    plan_blocks,
    tap_range,
)
from stagegraph.stages.x86.conv.index_arith import IndexArithmetic
from stagegraph.stages.x86.conv.pointwise import window_attr
from stagegraph.stages.x86.conv.transposed import _zero_tensor

_CONV = "linalg.conv_3d_ndhwc_dhwcf"
#: Channels-first to channels-last: where the transpose into NDHWC takes its spatial dims.
_NCDHW_TO_NDHWC = [0, 2, 3, 4, 1]


def _static(value: Any) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _element_bytes(value: Any) -> int:
    element = ir.RankedTensorType(value.type).element_type
    if isinstance(element, ir.F32Type):
        return 4
    return 8 if isinstance(element, ir.F64Type) else 0


def padding(
    image: Any, uses: DefUse, spatial: tuple[int, ...] = (1, 2, 3)
) -> list[tuple[int, int]] | None:
    """(real size, low pad) per spatial dim (``spatial``: channels-last by default) of an
    ``image`` that is a zero tensor with the real input inserted (directly, or before the
    transpose into channels-last), else ``None``."""
    owner = uses.owner(image)
    if owner is not None and owner.name == "linalg.transpose" and spatial == (1, 2, 3):
        permutation = list(ir.DenseI64ArrayAttr(owner.attributes["permutation"]))
        if permutation != _NCDHW_TO_NDHWC:
            return None
        owner, spatial = uses.owner(owner.operands[0]), (2, 3, 4)
    if owner is None or owner.name != "tensor.insert_slice" or len(owner.operands) != 2:
        return None
    if _zero_tensor(owner.operands[1], uses) is None:
        return None

    def array(name: str) -> list[int]:
        return list(ir.DenseI64ArrayAttr(owner.attributes[name]))

    offsets, sizes, steps = array("static_offsets"), array("static_sizes"), array("static_strides")
    full = _static(owner.operands[1])
    if any(s != 1 for s in steps) or min(offsets) < 0:
        return None
    if any(offsets[d] or sizes[d] != full[d] for d in range(5) if d not in spatial):
        return None
    return [(sizes[d], offsets[d]) for d in spatial]


#: Per 3-D convolution op: (first spatial dim of image and output, first spatial dim of the
#: filter, the image's channel dim, the filter's output-channel dim).
_LAYOUTS = {_CONV: (1, 0, 4, 4), "linalg.conv_3d_ncdhw_fcdhw": (2, 2, 1, 0)}


def conv_shape(op: Any, uses: DefUse) -> Conv3dShape | None:
    """``op`` as a :class:`Conv3dShape` when it is a static float channels-last 3-D
    convolution of one element type, else ``None``."""
    return _shape(op, uses) if op.name == _CONV else None


def _channels_first_shape(op: Any, uses: DefUse) -> Conv3dShape | None:
    """A static float ``linalg.conv_3d_ncdhw_fcdhw`` as a :class:`Conv3dShape`."""
    return _shape(op, uses) if op.name == "linalg.conv_3d_ncdhw_fcdhw" else None


def _shape(op: Any, uses: DefUse) -> Conv3dShape | None:
    """A static float 3-D convolution of a :data:`_LAYOUTS` op of one element type."""
    if len(op.operands) != 3 or len(op.results) != 1:
        return None
    if not all(ir.RankedTensorType(v.type).has_static_shape for v in op.operands):
        return None
    if len({_element_bytes(v) for v in op.operands}) != 1 or not _element_bytes(op.operands[0]):
        return None
    spatial, taps, channel, filters = _LAYOUTS[op.name]
    image, kernel, init = (_static(v) for v in op.operands)
    strides, dilations = window_attr(op, "strides"), window_attr(op, "dilations")
    dims = tuple(spatial + d for d in range(3))
    pads = padding(op.operands[0], uses, dims) or [(image[d], 0) for d in dims]
    windows = tuple(
        Window(init[spatial + d], kernel[taps + d], strides[d], dilations[d], *pads[d])
        for d in range(3)
    )
    return Conv3dShape(image[0], image[channel], kernel[filters], windows)  # type: ignore[arg-type]


def takes_channels_first(fn: Any, target: Target3d) -> Callable[[Any], bool]:
    """Whether the kernel takes a channels-first 3-D convolution of ``fn`` once it is
    channels-last (for :func:`.rewrites.conv_to_channels_last`: filters that do not fill
    whole vector groups go channels-last too, the kernel writes its last vector masked)."""
    uses = DefUse(fn)

    def takes(op: Any) -> bool:
        shape = _channels_first_shape(op, uses)
        if shape is None:
            return False
        lanes = max(1, target.vector_bytes // _element_bytes(op.operands[0]))
        plan = plan_blocks(shape, lanes, target.registers, target.fma_units, target.accumulators)
        return plan is not None

    return takes


def conv3d_to_direct_kernels(fn: Any, target: Target3d) -> int:
    """Rewrite every convolution of ``fn`` that :func:`conv_shape` takes and the blocking
    fits into the direct kernel; returns the count."""
    uses = DefUse(fn)
    found = []
    for op in top_level_ops(fn):
        shape = conv_shape(op, uses)
        if shape is None:
            continue
        lanes = max(1, target.vector_bytes // _element_bytes(op.operands[0]))
        plan = plan_blocks(shape, lanes, target.registers, target.fma_units, target.accumulators)
        if plan is not None:
            found.append((op, shape, plan))
    for op, shape, plan in found:
        init = op.operands[2].owner
        with ir.InsertionPoint(op), op.location:
            result = _Kernel(op, shape, plan).build()
        op.results[0].replace_all_uses_with(result)
        op.erase()
        erase_unused_init(init)
    return len(found)


class _Kernel(IndexArithmetic):
    """Builds the loops of one convolution at the current insertion point."""

    def __init__(self, op: Any, shape: Conv3dShape, plan: BlockPlan) -> None:
        self.shape, self.plan = shape, plan
        image, kernel, init = op.operands
        n, d, h, w, c = _static(image)
        kd, kh, kw, _, f = _static(kernel)
        self.element = ir.RankedTensorType(init.type).element_type
        self.image = collapse_shape(image, [[0], [1], [2], [3, 4]], [n, d, h, w * c])
        self.kernel = self._padded_filter(
            collapse_shape(kernel, [[0], [1], [2, 3], [4]], [kd, kh, kw * c, f])
        )
        self.fill = fill_value(init)
        self.init = (
            init if self.fill is None else tensor.EmptyOp(_static(init), self.element).result
        )
        self.vector_type = ir.VectorType.get([plan.lanes], self.element)
        self.filter_tile = min(plan.vectors * plan.lanes, f)
        IndexArithmetic.__init__(self, op)

    def _padded_filter(self, kernel: Any) -> Any:
        """The filter with its filters padded with zeros to whole vectors."""
        shape = _static(kernel)
        whole = self.plan.filter_vectors * self.plan.lanes
        if shape[-1] == whole:
            return kernel
        padded = [*shape[:-1], whole]
        zero = arith.ConstantOp(self.element, 0.0).result
        empty = tensor.EmptyOp(padded, self.element).result
        zeros = named_structured_op("linalg.fill", [zero], [empty])  # (no OpDSL import)
        return tensor.InsertSliceOp(kernel, zeros, [], [], [], [0] * 4, shape, [1] * 4).result

    def taps(self, window: Window, first: Any, count: int) -> tuple[Any, Any]:
        """The loop bounds of :func:`~.direct3d_plan.tap_range` for outputs ``first ..
        first + count - 1`` (constants when every block reads every tap)."""
        last_start = window.out - count
        if all(tap_range(window, s, count) == (0, window.taps) for s in range(last_start + 1)):
            return self.index(0), self.index(window.taps)
        s, d = window.stride, window.dilation
        # lo = max(0, ceil((pad - last * s) / d)); hi = min(T, floor((size-1+pad-first*s)/d)+1)
        below = arith.SubIOp(self.index(window.pad), self.affine(first, s, (count - 1) * s))
        lo = below.result if d == 1 else arith.CeilDivSIOp(below.result, self.index(d)).result
        lo = arith.MaxSIOp(lo, self.index(0)).result
        above = arith.SubIOp(self.index(window.size - 1 + window.pad), self.affine(first, s, 0))
        hi = above.result if d == 1 else arith.FloorDivSIOp(above.result, self.index(d)).result
        hi = arith.MinSIOp(arith.AddIOp(hi, self.index(1)).result, self.index(window.taps))
        return lo, hi.result

    def build(self) -> Any:
        plan, shape = self.plan, self.shape
        depth, height, _ = shape.windows
        bounds = [shape.n // plan.images, depth.out, plan.filter_vectors // plan.vectors]
        over = scf.ForallOp([0, 0, 0], bounds, [1, 1, 1], [self.init])
        with ir.InsertionPoint(over.body):
            block, od, filters = over.induction_variables
            shared = over.inner_iter_args[0]
            n0 = self.affine(block, plan.images, 0)
            f0 = self.affine(filters, plan.vectors * plan.lanes, 0)
            dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
            offsets = [dynamic, dynamic, 0, 0, dynamic]
            sizes = [plan.images, 1, height.out, shape.windows[2].out, self.filter_tile]
            tile_type = ir.RankedTensorType.get(sizes, self.element)
            tile = tensor.ExtractSliceOp(
                tile_type, shared, [n0, od, f0], [], [], offsets, sizes, [1] * 5
            ).result
            depth_taps = self.taps(depth, od, 1)
            rows = scf.ForOp(self.index(0), self.index(height.out), self.index(plan.rows), [tile])
            with ir.InsertionPoint(rows.body):
                where = (n0, od, f0, rows.induction_variable, depth_taps)
                scf.YieldOp([self._row(rows.inner_iter_args[0], where)])
            terminator = scf.InParallelOp()
            with ir.InsertionPoint(terminator.region.blocks[0]):
                tensor.ParallelInsertSliceOp(
                    rows.results[0], shared, [n0, od, f0], [], [], offsets, sizes, [1] * 5
                )
        return over.results[0]

    def _row(self, tile: Any, where: tuple) -> Any:
        """One block of rows: the loop over whole column blocks, then the tail block."""
        plan, width = self.plan, self.shape.windows[2]
        whole = width.out // plan.columns
        row_taps = self.taps(self.shape.windows[1], where[3], plan.rows)
        if whole:
            over = scf.ForOp(self.index(0), self.index(whole), self.index(1), [tile])
            with ir.InsertionPoint(over.body):
                start = self.affine(over.induction_variable, plan.columns, 0)
                made = self._block(over.inner_iter_args[0], where, row_taps, start, plan.columns)
                scf.YieldOp([made])
            tile = over.results[0]
        if plan.tail:
            start = self.index(whole * plan.columns)
            tile = self._block(tile, where, row_taps, start, plan.tail)
        return tile

    def _block(self, tile: Any, where: tuple, row_taps: tuple, col0: Any, columns: int) -> Any:
        """Accumulate one block over the whole reduction and write it into ``tile``."""
        plan = self.plan
        units = [
            (b, r, u, v)
            for b in range(plan.images)
            for r in range(plan.rows)
            for u in range(columns)
            for v in range(plan.vectors)
        ]
        positions = (where[0], where[1], where[2], where[3], col0)
        acc = [self._initial(tile, unit, positions) for unit in units]
        column_taps = self.taps(self.shape.windows[2], col0, columns)
        lo, hi = where[4]
        over_depth = scf.ForOp(lo, hi, self.index(1), acc)
        with ir.InsertionPoint(over_depth.body):
            kd = over_depth.induction_variable
            over_rows = scf.ForOp(*row_taps, self.index(1), list(over_depth.inner_iter_args))
            with ir.InsertionPoint(over_rows.body):
                taps = (kd, over_rows.induction_variable, column_taps)
                made = self._width(list(over_rows.inner_iter_args), units, positions, taps)
                scf.YieldOp(made)
            scf.YieldOp(list(over_rows.results))
        for unit, value in zip(units, over_depth.results, strict=True):
            tile = self._write(tile, unit, positions, value)
        return tile

    def _width(self, acc: list, units: list, positions: tuple, taps: tuple) -> list:
        """The loop over a row of taps times the channels (one loop ``j = kw * C + c`` when
        the width is not dilated, else taps around channels)."""
        width, channels = self.shape.windows[2], self.shape.c
        lo, hi = taps[2]
        if width.dilation == 1:
            start = arith.MulIOp(lo, self.index(channels)).result
            end = arith.MulIOp(hi, self.index(channels)).result
            over = scf.ForOp(start, end, self.index(1), acc)
            with ir.InsertionPoint(over.body):
                j = over.induction_variable
                step = self._step(list(over.inner_iter_args), units, positions, taps, (j, j))
                scf.YieldOp(step)
            return list(over.results)
        over_taps = scf.ForOp(lo, hi, self.index(1), acc)
        with ir.InsertionPoint(over_taps.body):
            kw = over_taps.induction_variable
            over = scf.ForOp(self.index(0), self.index(channels), self.index(1),
                             list(over_taps.inner_iter_args))  # fmt: skip
            with ir.InsertionPoint(over.body):
                c = over.induction_variable
                j = arith.AddIOp(self.affine(kw, channels, 0), c).result
                read = arith.AddIOp(self.affine(kw, channels * width.dilation, 0), c).result
                step = self._step(list(over.inner_iter_args), units, positions, taps, (j, read))
                scf.YieldOp(step)
            scf.YieldOp(list(over.results))
        return list(over_taps.results)

    def _step(self, acc: list, units: list, positions: tuple, taps: tuple, j: tuple) -> list:
        """One reduction step: the filter vectors at ``j[0]``, one broadcast per position
        (its input column offset by ``j[1]``), an FMA per accumulator."""
        plan, (depth, height, width) = self.plan, self.shape.windows
        n0, od, f0, row0, col0 = positions
        kd, kh, _ = taps
        channels = self.shape.c
        minor = ir.AffineMap.get_minor_identity(4, 1)
        padding = arith.ConstantOp(self.element, 0.0).result
        filters = [
            vector.TransferReadOp(
                self.vector_type, self.kernel, [kd, kh, j[0], self.affine(f0, 1, v * plan.lanes)],
                minor, padding, [True],
            ).result
            for v in range(plan.vectors)
        ]  # fmt: skip
        in_depth = arith.AddIOp(
            self.affine(od, depth.stride, 0), self.affine(kd, depth.dilation, 0)
        )
        broadcasts: dict[tuple[int, int, int], Any] = {}
        values = dict(zip(units, acc, strict=True))
        for b, r, u, v in units:
            if (b, r, u) not in broadcasts:
                in_row = arith.AddIOp(
                    self.affine(row0, height.stride, r * height.stride),
                    self.affine(kh, height.dilation, 0),
                ).result
                column = self.affine(col0, width.stride * channels, u * width.stride * channels)
                at = [self.affine(n0, 1, b), in_depth.result, in_row,
                      arith.AddIOp(column, j[1]).result]  # fmt: skip
                scalar = tensor.ExtractOp(self.image, at).result
                broadcasts[b, r, u] = vector.BroadcastOp(self.vector_type, scalar).result
            values[b, r, u, v] = vector.FMAOp(
                broadcasts[b, r, u], filters[v], values[b, r, u, v]
            ).result
        return [values[unit] for unit in units]

    def _tile_at(self, unit: tuple, positions: tuple) -> tuple[list[Any], bool]:
        """Where an accumulator lives in the tile, and whether its vector is whole."""
        b, r, u, v = unit
        _, _, _, row0, col0 = positions
        at = [self.index(b), self.index(0), self.affine(row0, 1, r), self.affine(col0, 1, u),
              self.index(v * self.plan.lanes)]  # fmt: skip
        return at, (v + 1) * self.plan.lanes <= self.filter_tile

    def _initial(self, tile: Any, unit: tuple, positions: tuple) -> Any:
        if self.fill is not None:
            return vector.BroadcastOp(self.vector_type, self.fill).result
        at, whole = self._tile_at(unit, positions)
        padding = arith.ConstantOp(self.element, 0.0).result
        minor = ir.AffineMap.get_minor_identity(5, 1)
        return vector.TransferReadOp(self.vector_type, tile, at, minor, padding, [whole]).result

    def _write(self, tile: Any, unit: tuple, positions: tuple, value: Any) -> Any:
        at, whole = self._tile_at(unit, positions)
        minor = ir.AffineMap.get_minor_identity(5, 1)
        return vector.TransferWriteOp(tile.type, value, tile, at, minor, [whole]).result
