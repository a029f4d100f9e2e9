"""Strided transposed convolutions become one small convolution per output phase.

PyTorch's ``ConvTranspose`` is imported as a zero tensor, the input inserted into it with the
transposed convolution's stride ``s`` (``tensor.insert_slice ... [1, 1, s, s]``, offset: the
padding ``P``), then a plain stride-1 convolution of that zero-stuffed tensor with the
flipped kernel. Of its multiply-adds, ``(s^dims - 1) / s^dims`` read inserted zeros (75 %
in 2-D at ``s = 2``), and the stuffed tensor itself is ``s^dims`` times the input.

Per spatial dim, output ``o = s*q + r`` (phase ``r``) only meets taps ``k`` whose stuffed
position ``o + d*k - P`` is a multiple of ``s``: ``d*k = P - r (mod s)``, an arithmetic
progression ``k0, k0 + t, ...`` with ``t = s / gcd(s, d)``. They read the original input at
``i = q + (r + d*k0 - P)/s + m * d/gcd(s, d)``. So each phase is a stride-1 convolution of
the original input (a window of it, zero-padded where it runs off the edges) with a strided
slice of the filter, dilation ``d / gcd(s, d)``, accumulating into the phase's strided slice
of the output's init (a fresh fill or bias broadcast of the phase's shape when the init is
one, so it stays a cheap producer the schedule fuses). Phases without taps keep the init.
Only the multiply-adds that meet real inputs remain.

Grouped ones (``linalg.conv_2d_ngchw_gfchw``, or a ``linalg.generic`` for 3-D: linalg has
no named grouped 3-D convolution) read the stuffed tensor through a ``tensor.expand_shape``
that splits its channels into groups; the phases read the original input split the same
way. A generic qualifies when its body is ``out + image * filter`` and its last image dims
read ``d_out + dilation * d_tap`` (stride 1); its phases are generics with the same loops.

Runs in ``x86.normalize``, before the analysis, so the cost model sees the phase
convolutions the schedule will run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.build import named_structured_op
from stagegraph.mlir.constants import is_zero_constant
from stagegraph.mlir.walk import DefUse, top_level_ops
from stagegraph.stages.x86.conv.generic_convolution import generic_convolution
from stagegraph.stages.x86.conv.pointwise import window_attr

# Convolutions whose spatial dims come last in all three operands (image, filter, output),
# after the batch/group/channel dims: how many spatial dims each has.
_CONVOLUTIONS = {
    "linalg.conv_1d_ncw_fcw": 1,
    "linalg.conv_2d_nchw_fchw": 2,
    "linalg.conv_3d_ncdhw_fcdhw": 3,
    "linalg.conv_2d_ngchw_gfchw": 2,
}


@dataclass(frozen=True)
class _Phase:
    """One output phase ``r`` of one spatial dim: outputs ``r, r + s, ...`` (``count`` of
    them) sum taps ``first, first + step, ...`` (``taps`` of them, 0: none) over the input
    window starting at ``start`` (may be negative: zero padding) of ``length`` elements,
    with dilation ``dilation``."""

    r: int
    count: int
    first: int
    taps: int
    step: int
    start: int
    length: int
    dilation: int


@dataclass(frozen=True)
class _Match:
    """A convolution reading a zero-stuffed input: what the rewrite needs of it."""

    conv: Any
    stuffed: Any  # the tensor.insert_slice op
    expand: Any | None  # a tensor.expand_shape splitting the channels into groups, if any
    zeros: Any  # the linalg.fill or arith.constant op making the zero tensor
    strides: list[int]  # per spatial dim
    phases: list[list[_Phase]]  # per spatial dim


def decompose_strided_transposed_convolutions(module: Any) -> int:
    """Rewrite every static convolution of ``module``'s functions that reads a zero tensor
    with the input inserted at strides > 1 (an imported strided transposed convolution) into
    one convolution per output phase that has taps; returns how many were rewritten. Other
    convolutions, and any whose zero tensor or stuffed tensor is not provably what the
    rewrite assumes, are left as they are."""
    count = 0
    for fn in top_level_ops(module.operation):
        if fn.name != "func.func":
            continue
        uses = DefUse(fn)
        found = [m for op in top_level_ops(fn) if (m := _match(op, uses)) is not None]
        for match in found:
            _rewrite(match, uses)
        count += len(found)
    return count


def _array(op: Any, name: str) -> list[int]:
    from stagegraph.mlir.bindings import ir

    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _zero_tensor(value: Any, uses: DefUse) -> Any | None:
    """The op making ``value`` if it is provably all zero (a fill of constant 0, or a
    splat constant 0; either sign: a product with a signed zero still adds nothing), else
    ``None``."""
    owner = uses.owner(value)
    if owner is None:
        return None
    if owner.name == "linalg.fill" and len(owner.operands) == 2:
        scalar = uses.owner(owner.operands[0])
        return owner if scalar is not None and is_zero_constant(scalar) else None
    return owner if is_zero_constant(owner) else None


def _match(op: Any, uses: DefUse) -> _Match | None:
    """``op`` as a convolution of a zero-stuffed input, or ``None``."""
    from stagegraph.mlir.bindings import ir

    if op.name not in _CONVOLUTIONS and op.name != "linalg.generic":
        return None
    if len(op.operands) != 3 or len(op.results) != 1:
        return None
    types = [op.operands[i].type for i in range(3)]
    if not all(isinstance(t, ir.RankedTensorType) for t in types):
        return None
    image_t, kernel_t, out_t = (ir.RankedTensorType(t) for t in types)
    if not all(t.has_static_shape for t in (image_t, kernel_t, out_t)):
        return None
    element = out_t.element_type
    if not isinstance(element, ir.FloatType):
        return None  # a fill of float 0 is what proves the inserted-into tensor zero
    if image_t.element_type != element or kernel_t.element_type != element:
        return None
    if op.name == "linalg.generic":
        spatial = generic_convolution(op)
        if spatial is None:
            return None
        rank, dilations = len(spatial.pairs), spatial.dilations
    else:
        rank = _CONVOLUTIONS[op.name]
        conv_strides, dilations = window_attr(op, "strides"), window_attr(op, "dilations")
        if len(conv_strides) != rank or len(dilations) != rank or any(s != 1 for s in conv_strides):
            return None
    if op.operands[2] == op.operands[0] or not _only_reader(op.operands[0], op, uses):
        return None  # something else reads the stuffed tensor: it stays anyway
    stuffed, expand = uses.owner(op.operands[0]), None
    if stuffed is not None and stuffed.name == "tensor.expand_shape":
        expand, stuffed = stuffed, uses.owner(stuffed.operands[0])
        if not _splits_leading_dims(expand, rank) or not _only_reader(
            expand.operands[0], expand, uses
        ):
            return None
    if stuffed is None or stuffed.name != "tensor.insert_slice" or len(stuffed.operands) != 2:
        return None  # dynamic offsets/sizes/strides are operands
    source_t = ir.RankedTensorType(stuffed.operands[0].type)
    if not source_t.has_static_shape:
        return None
    lead = source_t.rank - rank
    zeros = _zero_tensor(stuffed.operands[1], uses)
    if zeros is None:
        return None
    offsets, sizes = _array(stuffed, "static_offsets"), _array(stuffed, "static_sizes")
    steps = _array(stuffed, "static_strides")
    if sizes != list(source_t.shape):
        return None
    dest = ir.RankedTensorType(stuffed.operands[1].type).shape
    for dim in range(lead):  # batch and channels: whole, unstrided
        if offsets[dim] != 0 or steps[dim] != 1 or sizes[dim] != dest[dim]:
            return None
    strides = steps[lead:]
    if any(s < 1 for s in strides) or all(s == 1 for s in strides):
        return None  # stride 1: only a zero border, no inserted zeros to skip
    kernel_sizes, out_sizes = kernel_t.shape[-rank:], out_t.shape[-rank:]
    phases = [
        _dim_phases(size, pad, stride, kernel, dilation, out)
        for size, pad, stride, kernel, dilation, out in zip(
            source_t.shape[lead:], offsets[lead:], strides, kernel_sizes, dilations, out_sizes,
            strict=True,
        )
    ]  # fmt: skip
    return _Match(op, stuffed, expand, zeros, strides, phases)


def _only_reader(value: Any, op: Any, uses: DefUse) -> bool:
    users = uses.users(value)
    return len(users) == 1 and users[0] == op


def _splits_leading_dims(expand: Any, rank: int) -> bool:
    """Whether the ``tensor.expand_shape`` ``expand`` (static) keeps its last ``rank`` dims
    (the spatial ones) as they are: it only splits the channels into groups."""
    from stagegraph.mlir.bindings import ir

    if len(expand.operands) != 1:
        return False
    groups = [[ir.IntegerAttr(d).value for d in g] for g in expand.attributes["reassociation"]]
    width = ir.RankedTensorType(expand.results[0].type).rank
    return len(groups) > rank and groups[-rank:] == [[d] for d in range(width - rank, width)]


def _dim_phases(size: int, pad: int, s: int, kernel: int, d: int, out: int) -> list[_Phase]:
    """The phases of one spatial dim: input of ``size`` inserted at ``pad`` with stride
    ``s``, a window of ``kernel`` taps at dilation ``d``, ``out`` outputs.

    Output ``o = s*q + r`` meets tap ``k`` at stuffed position ``o + d*k``, the input
    ``(o + d*k - pad) / s`` when that divides and lies in ``[0, size)``. Taps whose whole
    window of reads falls off the input are dropped: they only ever meet padding."""
    g = math.gcd(s, d)
    step, dilation = s // g, d // g
    phases = []
    for r in range(min(s, out)):
        count = (out - r + s - 1) // s
        first = next((k for k in range(step) if (r + d * k - pad) % s == 0), None)
        taps = 0 if first is None or first >= kernel else (kernel - first + step - 1) // step
        start = (r + d * first - pad) // s if taps else 0
        # Tap m reads inputs start + dilation*m + [0, count): drop those outside [0, size).
        while taps and start + count <= 0:
            first, start, taps = first + step, start + dilation, taps - 1
        while taps and start + dilation * (taps - 1) >= size:
            taps -= 1
        length = count + dilation * (taps - 1) if taps else 0
        # One tap: no window to dilate (a 1-element window reads as pointwise).
        phases.append(
            _Phase(r, count, first or 0, taps, step, start, length, dilation if taps > 1 else 1)
        )
    return phases


def _rewrite(match: _Match, uses: DefUse) -> None:
    """Replace ``match.conv`` with its phase convolutions and erase what only it read."""
    from stagegraph.mlir.bindings import dialect, ir

    tensor = dialect("tensor")
    conv = match.conv
    image = match.stuffed.operands[0]
    kernel, init = conv.operands[1], conv.operands[2]
    kernel_t, out_t = ir.RankedTensorType(kernel.type), ir.RankedTensorType(init.type)
    element = out_t.element_type
    rank = len(match.phases)
    combos = list(itertools.product(*match.phases))
    live = [c for c in combos if all(p.taps for p in c)]
    with ir.InsertionPoint(conv), conv.location:
        padded, low = _padded(image, match, element, uses)
        if match.expand is not None:  # the same channel groups, of the padded image
            padded = _grouped(padded, match.expand, rank)
        image_t = ir.RankedTensorType(padded.type)
        lead, kernel_lead, out_lead = (t.rank - rank for t in (image_t, kernel_t, out_t))
        # Every output in some phase with taps: the phases write it all, the init is unread.
        acc = (
            tensor.EmptyOp(list(out_t.shape), element).result if len(live) == len(combos)
            else init
        )  # fmt: skip
        for combo in live:
            window = _slice(
                padded,
                [0] * lead + [p.start - lo for p, lo in zip(combo, low, strict=True)],
                [*image_t.shape[:lead], *(p.length for p in combo)],
                [1] * image_t.rank,
            )
            taps = _slice(
                kernel,
                [0] * kernel_lead + [p.first for p in combo],
                [*kernel_t.shape[:kernel_lead], *(p.taps for p in combo)],
                [1] * kernel_lead + [p.step for p in combo],
            )
            offsets = [0] * out_lead + [p.r for p in combo]
            sizes = [*out_t.shape[:out_lead], *(p.count for p in combo)]
            steps = [1] * out_lead + match.strides
            start = _phase_init(init, offsets, sizes, steps, rank, uses)
            dilations = [p.dilation for p in combo]
            if conv.name == "linalg.generic":
                made = _generic_phase(conv, [window, taps], start, dilations)
            else:
                attributes = {"dilations": _vector(dilations), "strides": _vector([1] * rank)}
                made = named_structured_op(conv.name, [window, taps], [start], attributes)
            acc = tensor.InsertSliceOp(made, acc, [], [], [], offsets, sizes, steps).result
    conv.results[0].replace_all_uses_with(acc)
    conv.erase()
    stuffed = [match.stuffed, match.zeros]
    _erase_if_unused([match.expand, *stuffed] if match.expand else stuffed, uses)


def _grouped(image: Any, like: Any, rank: int) -> Any:
    """``image`` with its channels split into groups as the ``tensor.expand_shape``
    ``like`` splits the stuffed tensor's (its spatial dims: ``image``'s own)."""
    from stagegraph.mlir.bindings import dialect, ir

    image_t = ir.RankedTensorType(image.type)
    shape = ir.RankedTensorType(like.results[0].type).shape
    shape = [*shape[:-rank], *image_t.shape[-rank:]]
    result = ir.RankedTensorType.get(shape, image_t.element_type)
    reassociation = like.attributes["reassociation"]
    return dialect("tensor").ExpandShapeOp(result, image, reassociation, [], shape).result


def _generic_phase(conv: Any, inputs: list[Any], init: Any, dilations: list[int]) -> Any:
    """The ``linalg.generic`` convolution ``conv`` over ``inputs`` into ``init`` at
    ``dilations``: the same loops and body, the image read at ``d_out + dilation * d_tap``."""
    from stagegraph.mlir.bindings import dialect, ir

    spatial = generic_convolution(conv)
    assert spatial is not None  # matched before
    maps = [ir.AffineMapAttr(m).value for m in conv.attributes["indexing_maps"]]
    image = list(maps[0].results)[: -len(dilations)]
    for (output, tap), dilation in zip(spatial.pairs, dilations, strict=True):
        step = ir.AffineDimExpr.get(tap)
        if dilation != 1:
            step = ir.AffineMulExpr.get(step, ir.AffineConstantExpr.get(dilation))
        image.append(ir.AffineAddExpr.get(ir.AffineDimExpr.get(output), step))
    maps[0] = ir.AffineMap.get(maps[0].n_dims, 0, image)
    op = ir.Operation.create(
        "linalg.generic",
        results=[init.type],
        operands=[*inputs, init],
        attributes={
            "indexing_maps": ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            "iterator_types": conv.attributes["iterator_types"],
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([2, 1]),
        },
        regions=1,
    )
    element = ir.RankedTensorType(init.type).element_type
    block = op.regions[0].blocks.append(element, element, element)
    arith = dialect("arith")
    with ir.InsertionPoint(block):
        product = arith.MulFOp(block.arguments[0], block.arguments[1]).result
        total = arith.AddFOp(product, block.arguments[2]).result
        ir.Operation.create("linalg.yield", operands=[total])
    return op.results[0]


def _vector(values: list[int]) -> Any:
    """A convolution's ``strides``/``dilations`` attribute: ``dense<...> : vector<Nxi64>``."""
    from stagegraph.mlir.bindings import ir

    i64 = ir.IntegerType.get_signless(64)
    vector = ir.VectorType.get([len(values)], i64)
    return ir.DenseElementsAttr.get([ir.IntegerAttr.get(i64, v) for v in values], vector)


def _padded(image: Any, match: _Match, element: Any, uses: DefUse) -> tuple[Any, list[int]]:
    """``image`` zero-padded so that every live phase's window lies inside it (once for all
    phases: their windows are slices of it), and where the image starts in it per spatial
    dim (the padding's low edge, negated)."""
    from stagegraph.mlir.bindings import dialect, ir

    image_t = ir.RankedTensorType(image.type)
    shape = list(image_t.shape)
    lead = len(shape) - len(match.phases)
    low, high = [], []
    for size, phases in zip(shape[lead:], match.phases, strict=True):
        live = [p for p in phases if p.taps]
        low.append(min([0, *(p.start for p in live)]))
        high.append(max([size, *(p.start + p.length for p in live)]))
    if all(lo == 0 for lo in low) and high == shape[lead:]:
        return image, low
    tensor = dialect("tensor")
    padded_shape = [*shape[:lead], *(hi - lo for lo, hi in zip(low, high, strict=True))]
    empty = tensor.EmptyOp(padded_shape, element).result
    zero = _zero_scalar(match, element, uses)
    zeros = named_structured_op("linalg.fill", [zero], [empty])
    inner = [0] * lead + [-lo for lo in low]
    placed = tensor.InsertSliceOp(image, zeros, [], [], [], inner, shape, [1] * len(shape))
    return placed.result, low


def _zero_scalar(match: _Match, element: Any, uses: DefUse) -> Any:
    """A scalar 0 of ``element``: the zero tensor's fill value when it has one."""
    from stagegraph.mlir.bindings import dialect, ir

    if match.zeros.name == "linalg.fill":
        return match.zeros.operands[0]
    return dialect("arith").ConstantOp(element, ir.FloatAttr.get(element, 0.0)).result


def _slice(value: Any, offsets: list[int], sizes: list[int], steps: list[int]) -> Any:
    """``value``'s static slice, or ``value`` itself when the slice is all of it."""
    from stagegraph.mlir.bindings import dialect, ir

    value_t = ir.RankedTensorType(value.type)
    if all(o == 0 for o in offsets) and sizes == list(value_t.shape):
        return value
    result = ir.RankedTensorType.get(sizes, value_t.element_type)
    return dialect("tensor").ExtractSliceOp(result, value, [], [], [], offsets, sizes, steps).result


def _phase_init(
    init: Any, offsets: list[int], sizes: list[int], steps: list[int], rank: int, uses: DefUse
) -> Any:
    """The init of one phase's outputs: a new fill (of the same value) or bias broadcast
    (of the same input) of the phase's shape when ``init`` is one, so it stays a producer
    the schedule fuses into the convolution's tiles; else ``init``'s strided slice."""
    from stagegraph.mlir.bindings import dialect, ir

    owner = uses.owner(init)
    element = ir.RankedTensorType(init.type).element_type
    if owner is not None and owner.name == "linalg.fill" and len(owner.operands) == 2:
        empty = dialect("tensor").EmptyOp(sizes, element).result
        return named_structured_op("linalg.fill", [owner.operands[0]], [empty])
    if owner is not None and owner.name == "linalg.broadcast" and len(owner.operands) == 2:
        added = list(ir.DenseI64ArrayAttr(owner.attributes["dimensions"]))
        if all(dim in added for dim in range(len(sizes) - rank, len(sizes))):  # spatial
            empty = dialect("tensor").EmptyOp(sizes, element).result
            return _broadcast(owner, empty)
    return _slice(init, offsets, sizes, steps)


def _broadcast(like: Any, into: Any) -> Any:
    """A ``linalg.broadcast`` of ``like``'s input (same ``dimensions``) into ``into``."""
    from stagegraph.mlir.bindings import ir

    op = ir.Operation.create(
        "linalg.broadcast",
        results=[into.type],
        operands=[like.operands[0], into],
        attributes={"dimensions": like.attributes["dimensions"]},
        regions=1,
    )
    element = ir.RankedTensorType(into.type).element_type
    block = op.regions[0].blocks.append(element, element)
    with ir.InsertionPoint(block):
        ir.Operation.create("linalg.yield", operands=[block.arguments[0]])
    return op.results[0]


def _unused(op: Any) -> bool:
    return all(not list(result.uses) for result in op.results)


def _erase_if_unused(ops: list[Any], uses: DefUse) -> None:
    """Erase ``ops`` in order while nothing reads their results (the stuffed tensor, then
    the zero tensor it was inserted into), and each one's ``tensor.empty`` once unread: the
    analysis and the schedule should not see a stuffed-size fill nobody reads."""
    for op in ops:
        if not _unused(op):
            return
        feeds = [uses.owner(v) for v in op.operands]
        op.erase()
        for fed in feeds:
            if fed is not None and fed.name == "tensor.empty" and _unused(fed):
                fed.erase()
