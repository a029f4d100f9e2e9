"""Finding the matmuls the x86 schedule takes, and bringing them to the one form it handles.

Before scheduling, the payload's matmul-like ops (:mod:`stagegraph.stages.x86.matmul.sites`)
are labelled (:func:`label_contractions`) while the payload still matches its facts, then
rewritten into 2-D ``linalg.matmul`` ops (:func:`canonicalize_contractions`); inputs
narrower than the accumulator get widening copies the packing absorbs
(:func:`widen_inputs`); :func:`find_matmuls` then describes each matmul as a
:class:`MatmulSite` for the parameter heuristic and the schedule
(:mod:`stagegraph.stages.x86.matmul.schedule`). :func:`strip_labels` removes every label.
"""

from __future__ import annotations

from collections.abc import Sequence

from stagegraph.core.ports import Facts
from stagegraph.mlir.bindings import dialect, ir, linalg_native, structured, tensor, transform
from stagegraph.mlir.build import named_structured_op
from stagegraph.mlir.constants import is_zero
from stagegraph.mlir.functions import entry_function
from stagegraph.mlir.walk import collect, defining_op, strip_attributes
from stagegraph.stages.analysis import OpFacts, declared_iterator_types, linalg_ops
from stagegraph.stages.common.transform import apply_schedule_module, new_schedule
from stagegraph.stages.common.transform_build import (
    any_op,
    apply_patterns,
    match_name,
    producer_of,
)
from stagegraph.stages.x86.matmul.sites import canonicalizable

_ttensor = dialect("transform.tensor")

# Set by find_matmuls on every site (its position): the schedule addresses sites by it.
SITE_ATTR = "stagegraph.matmul_site"
# Set by canonicalize_contractions on the linalg.matmul made from a matmul-like op: the
# index (in PayloadFacts.ops) of the op it came from.
SOURCE_ATTR = "stagegraph.matmul_source"
# Set by widen_inputs on each widening copy: 2 * (the matmul's SOURCE_ATTR) + operand.
WIDEN_ATTR = "stagegraph.widen"
#: Marks an implicit GEMM's patch gather (conv/patch_gather.py, matmul/patch_operands.py).
PATCH_ATTR = "stagegraph.conv_patches"
WIDEN_LANES = 64  # elements per vector step of a widening copy the packing does not absorb
_LABEL_ATTR = "stagegraph.matmul_like"  # ops to canonicalize, during canonicalize_contractions


class MatmulSite(Facts):
    """One ``linalg.matmul`` of a payload, in walk order, with what can be fused around it.

    ``transpose_a``: A is stored ``[k, m]``; ``transpose_b``: B is stored ``[n, k]`` (the
    matmul's ``indexing_maps``). ``source``: the index in ``PayloadFacts.ops`` of the
    matmul-like op this matmul was made from by :func:`canonicalize_contractions`, if any.
    """

    function: str
    m: int
    n: int
    k: int
    dtype: str = "f32"
    has_fill: bool = False
    consumers: int = 0  # elementwise linalg.generic ops chained on the result, fused into blocks
    transpose_a: bool = False
    transpose_b: bool = False
    source: int | None = None
    widened: tuple[bool, bool] = (False, False)  # A / B come from widen_inputs' copies
    # B's "widening" is an implicit GEMM's patch gather (patch_operands): fused into every
    # packing step, whole panels split from the partial one
    patch_b: bool = False
    # B is the unpack of a constant packed at compile time (constant_pack): no B packing runs
    prepacked_b: bool = False


def find_matmuls(payload: ir.Module) -> list[MatmulSite]:
    """Walk the payload's functions and describe every ``linalg.matmul`` (walk order) whose
    operands are plain or transposed matrices; label each with ``SITE_ATTR``."""
    sites: list[MatmulSite] = []
    i64 = ir.IntegerType.get_signless(64, payload.context)
    for fn in payload.body.operations:
        if fn.operation.name != "func.func":
            continue
        name = ir.StringAttr(fn.attributes["sym_name"]).value
        for op in collect(fn.operation):
            if op.name != "linalg.matmul":
                continue
            layout = _matmul_layout(op)
            if layout is None:
                continue
            transpose_a, transpose_b = layout
            a, b = (ir.RankedTensorType(op.operands[i].type) for i in (0, 1))
            m, k = (a.shape[1], a.shape[0]) if transpose_a else (a.shape[0], a.shape[1])
            n = b.shape[0] if transpose_b else b.shape[1]
            has_fill = _zero_fill(op.operands[2])
            source = None
            if SOURCE_ATTR in op.attributes:
                source = ir.IntegerAttr(op.attributes[SOURCE_ATTR]).value
            op.attributes[SITE_ATTR] = ir.IntegerAttr.get(i64, len(sites))
            sites.append(
                MatmulSite(
                    function=name,
                    m=m,
                    n=n,
                    k=k,
                    dtype=str(a.element_type),
                    has_fill=has_fill,
                    consumers=_elementwise_chain(op),
                    transpose_a=transpose_a,
                    transpose_b=transpose_b,
                    source=source,
                    widened=(_widening_copy(op.operands[0]), _widening_copy(op.operands[1])),
                    patch_b=PATCH_ATTR in defining_op(op.operands[1]).attributes,
                )
            )
    return sites


def _positions(amap: ir.AffineMap) -> list[int | None]:
    return [e.position if isinstance(e, ir.AffineDimExpr) else None for e in amap.results]


def _matmul_layout(op: ir.Operation) -> tuple[bool, bool] | None:
    """(transpose_a, transpose_b) of a 2-D ``linalg.matmul`` on ranked tensors whose maps are
    ``C[m, n] += A[m, k] * B[k, n]`` up to a transposition of A and/or B, else None
    (broadcasts, memrefs, other loop orders)."""
    if len(op.operands) != 3 or len(op.results) != 1:
        return None
    if not all(isinstance(v.type, ir.RankedTensorType) for v in op.operands):
        return None
    maps = [ir.AffineMapAttr(a).value for a in linalg_native.get_indexing_maps(op)]
    if len(maps) != 3 or any(m.n_dims != 3 for m in maps):
        return None
    a, b, c = (_positions(m) for m in maps)
    if c != [0, 1] or a not in ([0, 2], [2, 0]) or b not in ([2, 1], [1, 2]):
        return None
    return a == [2, 0], b == [1, 2]


def widen_inputs(payload: ir.Module) -> int:
    """Give every canonicalized matmul whose inputs are narrower than its accumulator (e.g.
    bf16 -> f32) a ``linalg.copy`` that widens each such input, so that it is scheduled as
    a matmul of the accumulator's type (``x86.compute_dtype``). The widening is exact and is
    fused into the packing of A and B (no widened copy of a whole matrix is stored); the
    FMA micro-kernel then runs at the f32 rate instead of a mixed-type contraction that
    lowers to shuffles and scalar reductions. Returns the number of inputs widened."""
    mixed = collect(payload, lambda op: op.name == "linalg.matmul" and SOURCE_ATTR in op.attributes)
    i64 = ir.IntegerType.get_signless(64, payload.context)
    widened = 0
    for op in mixed:
        wide = ir.RankedTensorType(op.operands[2].type).element_type
        source = ir.IntegerAttr(op.attributes[SOURCE_ATTR]).value
        operands = list(op.operands)
        with ir.InsertionPoint(op), op.location:
            for i in (0, 1):
                narrow = ir.RankedTensorType(operands[i].type)
                if narrow.element_type == wide:
                    continue
                empty = tensor.EmptyOp(narrow.shape, wide).result
                operands[i] = named_structured_op("linalg.copy", [operands[i]], [empty])
                operands[i].owner.attributes[WIDEN_ATTR] = ir.IntegerAttr.get(i64, 2 * source + i)
                widened += 1
            if operands == list(op.operands):
                continue
            # A new op: the body's block arguments have the operands' element types.
            attributes = {}
            if "indexing_maps" in op.attributes:
                attributes["indexing_maps"] = op.attributes["indexing_maps"]
            made = named_structured_op("linalg.matmul", operands[:2], [operands[2]], attributes)
        for name in (SOURCE_ATTR, SITE_ATTR):
            if name in op.attributes:
                made.owner.attributes[name] = op.attributes[name]
        op.result.replace_all_uses_with(made)
        op.erase()
    return widened


def _widening_copy(value: ir.Value) -> bool:
    return WIDEN_ATTR in defining_op(value).attributes


class Candidate(Facts):
    """A matmul-like op labelled for :func:`canonicalize_contractions`."""

    op: OpFacts
    has_fill: bool = False


def label_contractions(payload: ir.Module, facts) -> list[Candidate]:
    """Label the entry's matmul-like ops (:func:`matmul_like_ops`) for
    :func:`canonicalize_contractions`: a ``linalg.matmul`` already in canonical form gets
    ``SOURCE_ATTR`` directly; the others are returned. Run it while the payload is still the
    one ``facts`` describe (before the generic schedule, which leaves these ops alone).
    """
    ops = linalg_ops(entry_function(payload, facts.entry))
    if [op.name for op in ops] != [f.name for f in facts.ops]:
        raise ValueError("payload linalg ops differ from the facts; re-run the analysis")
    i64 = ir.IntegerType.get_signless(64, payload.context)
    todo = []
    for op, f in zip(ops, facts.ops, strict=True):
        if not canonicalizable(f):
            continue
        if f.name == "linalg.matmul" and _matmul_layout(op) is not None:
            op.attributes[SOURCE_ATTR] = ir.IntegerAttr.get(i64, f.index)
            continue
        op.attributes[_LABEL_ATTR] = ir.IntegerAttr.get(i64, f.index)
        todo.append(Candidate(op=f, has_fill=defining_op(op.operands[2]).name == "linalg.fill"))
    return todo


def canonicalize_contractions(payload: ir.Module, candidates: Sequence[Candidate]) -> None:
    """Rewrite the labelled matmul-like ops into ``linalg.matmul`` in place.

    Batch loops become an ``scf.forall`` with one matmul per batch element (the zero fill
    fused in), loops are reordered to (m, n, k), unit dims dropped, and the op specialized to
    ``linalg.matmul`` (a transposed operand becomes its ``indexing_maps``). Each matmul made
    carries ``SOURCE_ATTR`` (its op's facts index); an op that cannot be rewritten stays a
    correct, unscheduled op.
    """
    if candidates:
        module, seq = new_schedule()
        with ir.InsertionPoint(seq.body):
            for candidate in candidates:
                _canonicalize_one(seq.bodyTarget, candidate.op, candidate.has_fill)
            transform.YieldOp([])
        apply_schedule_module(payload, module)
    strip_attributes(payload, _LABEL_ATTR)


def strip_labels(payload: ir.Module) -> None:
    """Drop the attributes this module's functions put on payload ops."""
    strip_attributes(payload, SITE_ATTR, SOURCE_ATTR, _LABEL_ATTR, WIDEN_ATTR)


def _canonicalize_one(root: ir.Value, f: OpFacts, has_fill: bool) -> None:
    """One failure-suppressing sub-sequence: batch loops to an scf.forall of unit-batch ops,
    unit dims dropped, (m, n, k) loop order, specialized to linalg.matmul, labelled."""
    c = f.contraction
    assert c is not None
    seq = transform.SequenceOp(transform.FailurePropagationMode.Suppress, [], root)
    with ir.InsertionPoint(seq.body):
        body_root = seq.bodyTarget
        i64 = ir.IntegerType.get_signless(64)
        op = structured.MatchOp(
            any_op(), body_root, op_attrs={_LABEL_ATTR: ir.IntegerAttr.get(i64, f.index)}
        ).result
        func = transform.GetParentOp(any_op(), op, op_name="func.func").result
        fill = producer_of(op, 2) if has_fill else None
        order = [*c.batch_dims, *c.m_dims, *c.n_dims, *c.k_dims]
        if f.name != "linalg.generic":
            op = structured.GeneralizeOp(op).result
        if order != list(range(len(order))):
            op = structured.InterchangeOp(op, iterator_interchange=order).result
        scope = func
        nb = len(c.batch_dims)
        if nb:
            tiled = structured.TileUsingForallOp(op, tile_sizes=[1] * nb + [0, 0, 0])
            scope = tiled.forall_op
            if fill is not None:
                fused = structured.FuseIntoContainingOp(fill, scope)
                scope = fused.new_containing_op
                structured.GeneralizeOp(fused.fused_op)
            apply_patterns(
                scope,
                structured.ApplyFoldUnitExtentDimsViaSlicesPatternsOp,
                _ttensor.ApplyMergeConsecutiveInsertExtractSlicePatternsOp,
                transform.ApplyCanonicalizationPatternsOp,
            )
            generics = match_name(scope, "linalg.generic")
            each = transform.ForeachOp([], [generics])
            with ir.InsertionPoint(each.body):
                structured.SpecializeOp(any_op(), each.body.arguments[0])
                transform.YieldOp([])
            made = match_name(scope, "linalg.matmul")
        else:
            made = structured.SpecializeOp(any_op(), op).result
        value = transform.ParamConstantOp(
            transform.AnyParamType.get(), ir.IntegerAttr.get(i64, f.index)
        ).param
        transform.AnnotateOp(made, SOURCE_ATTR, param=value)
        transform.YieldOp([])


def _zero_fill(value: ir.Value) -> bool:
    """Whether ``value`` is a ``linalg.fill`` of zero: the one fill the schedule fuses into
    packed C (a pack of any other fill keeps its zero padding, so it does not fold into a
    fill of the packed tiles; such a fill is C's initial value, like any other)."""
    fill = defining_op(value)
    return fill.name == "linalg.fill" and is_zero(fill.operands[0])


def _elementwise_chain(op: ir.Operation) -> int:
    """Number of all-parallel generics of the same shape consuming ``op`` in turn, each the
    only user of the one before."""
    count = 0
    shape = ir.RankedTensorType(op.results[0].type).shape
    while len(op.results) == 1:
        uses = list(op.results[0].uses)
        # One user, which may read the result in several inputs (merged elementwise
        # chains: each bias add of a Mish's x, exp(x) and x > 20 reads C).
        if not uses or len({use.owner.operation for use in uses}) != 1:
            break
        user = uses[0].owner.operation
        if user.name != "linalg.generic" or len(user.results) != 1:
            break
        if any(it != "parallel" for it in declared_iterator_types(user)):
            break
        if ir.RankedTensorType(user.results[0].type).shape != shape:
            break
        if any(_is_i1_tensor(v.type) for v in user.operands):
            break  # vectors of i1 are bit-packed, memrefs of i1 are bytes: leave it unfused
        # The matmul result must be an input (not the init) of the consumer.
        n_inputs = len(user.operands) - 1
        if any(use.operand_number >= n_inputs for use in uses):
            break
        count += 1
        op = user
    return count


def _is_i1_tensor(value_type: ir.Type) -> bool:
    if not isinstance(value_type, ir.ShapedType):
        return False
    element = ir.ShapedType(value_type).element_type
    return isinstance(element, ir.IntegerType) and ir.IntegerType(element).width == 1
