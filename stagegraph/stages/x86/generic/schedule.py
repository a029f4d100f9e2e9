"""The generic (non-matmul) x86 schedule: tile, fuse, vectorize elementwise ops, reductions,
pooling and convolutions, and lower the vector ops so no ``alloca`` stays in a loop.

Ops are addressed by attributes, never by printed IR: :func:`annotate_generic_ops` labels
every linalg op of the entry function that this schedule may transform with
``stagegraph.generic_op = <index in PayloadFacts.ops>`` and every elementwise producer that
can be fused into a consumer's tile loop with ``stagegraph.fuse_into = <root index>``.
Matmul-class ops, the elementwise epilogues of matmul layers, ops feeding matmul-class ops
and functions marked ``stagegraph.wrapper`` are never labelled, so never touched.

:func:`build_generic_schedule` builds the transform module from the facts and params (one
failure-suppressing sub-sequence per op, consumers first: an op the schedule cannot handle
is left as it was, for the fallback ``convert-linalg-to-loops``).
:func:`apply_generic_schedule` labels the payload, applies the schedule and removes the
labels. After it, run :data:`PIPELINE` (bufferize, leftovers to loops, LLVM).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from stagegraph.mlir.functions import entry_function
from stagegraph.stages.analysis import OpFacts, PayloadFacts, analyze
from stagegraph.stages.common import lowering
from stagegraph.stages.x86.conv.direct3d_plan import direct3d_target
from stagegraph.stages.x86.generic.conv_accumulators import hoist_accumulators
from stagegraph.stages.x86.generic.labels import (
    FUSE_ATTR,
    OP_ATTR,
    annotate_generic_ops,
    strip_annotations,
)
from stagegraph.stages.x86.generic.params import (
    GenericParams,
    reduction_tile_sizes,
    tile_sizes_for,
)
from stagegraph.stages.x86.generic.plan import (  # noqa: F401  (DECOMPOSABLE re-exported)
    DECOMPOSABLE,
    VECTORIZABLE_1D,
    convolution_plan,
    has_bool_operands,
    partial_tiles,
    pools_along_width,
    reduction_like,
    schedulable,
    vectorize_enabled,
)
from stagegraph.stages.x86.generic.transpose_tiles import line_tiles, square_tiles

PARAMS_ATTR = "stagegraph.generic_params"
# Whether a failing sub-sequence raises (recorded on the schedule, so a rebuild keeps it).
PROPAGATE_ATTR = "stagegraph.generic_propagate_failures"
#: Per-op params (by op signature) recorded beside :data:`PARAMS_ATTR`.
PER_OP_ATTR = "stagegraph.generic_params_per_op"

# Cleanup between the schedule and bufferization (folds one-trip loops, dead slices).
CLEANUP = "canonicalize,cse"
# Tile loops stay ``scf.forall`` on tensors (fusion needs its shared outputs); once
# bufferized they become ``scf.for`` (``convert-scf-to-cf`` knows no forall).
FORALL_TO_FOR = "scf-forall-to-for"
# Vector transfers on tensors cannot be unrolled by the schedule (the transfer-to-scf
# patterns only lower memref transfers): once bufferized, every transfer is fully unrolled
# to rank 1 (no temporary buffer, so no alloca in any loop), leftover multi-reductions
# lowered.
VECTOR_LOWERING = (
    "func.func(lower-vector-multi-reduction),"
    "convert-vector-to-scf{full-unroll=true target-rank=1},canonicalize,cse"
)
# After the schedule: the shared pipelines, leftovers (ops the schedule left) to loops;
# then ``lowering.LOWER_TO_LLVM``.
PIPELINE = (
    f"{CLEANUP},{lowering.BUFFERIZE},{FORALL_TO_FOR},{VECTOR_LOWERING},{lowering.LINALG_TO_LOOPS}"
)

# ----------------------------------------------------------------------------- schedule


class OpSequenceBuilder:
    """Emits the transform ops of one op's sub-sequence (a failure-suppressing sequence
    that matches the op by its label, then tiles, fuses and vectorizes it)."""

    def __init__(
        self,
        params: GenericParams,
        propagate_failures: bool = False,
        fused_roots: Collection[int] | None = None,
    ) -> None:
        from stagegraph.mlir.bindings import dialect, ir, structured, transform
        from stagegraph.stages.common.transform_build import any_op, apply_patterns

        self.params = params
        self.fused_roots = fused_roots
        self.propagate_failures = propagate_failures
        self.ir, self.structured, self.transform = ir, structured, transform
        self.tv = dialect("transform.vector")
        self.any = any_op()
        self.apply_patterns = apply_patterns
        self.i64 = ir.IntegerType.get_signless(64)

    def match(self, root: Any, attr: str, index: int) -> Any:
        attrs = {attr: self.ir.IntegerAttr.get(self.i64, index)}
        return self.structured.MatchOp(self.any, root, op_attrs=attrs).result

    def suppressed(self, root: Any) -> tuple[Any, Any]:
        """A nested ``transform.sequence failures(suppress)`` on ``root``."""
        mode = self.transform.FailurePropagationMode
        seq = self.transform.SequenceOp(
            mode.Propagate if self.propagate_failures else mode.Suppress, [], root
        )
        return seq, seq.bodyTarget

    def lower_vectors(
        self, target: Any, inner_reduction: bool = True, shuffles: bool = False
    ) -> None:
        """Lower the vector ops under ``target`` to 1-D transfers and arithmetic;
        ``shuffles``: 16x16 f32 transposes as shuffles (:func:`square_tiles`), others
        element by element."""
        tv, transform = self.tv, self.transform

        def patterns(*makers: Any, canonicalize: bool = True) -> None:
            canonicalization = [transform.ApplyCanonicalizationPatternsOp] if canonicalize else []
            self.apply_patterns(target, *makers, *canonicalization)

        strategy = (
            tv.VectorMultiReductionLowering.InnerReduction
            if inner_reduction
            else tv.VectorMultiReductionLowering.InnerParallel
        )
        # Masked (partial) tiles: masks become masked transfers and create_mask ops first.
        patterns(tv.ApplyLowerMaskedTransfersPatternsOp, tv.ApplyLowerMasksPatternsOp)
        patterns(
            tv.ApplyCastAwayVectorLeadingOneDimPatternsOp,
            tv.ApplyTransferPermutationPatternsOp,
            tv.ApplyFoldArithExtensionPatternsOp,
        )
        patterns(
            lambda: tv.ApplyLowerContractionPatternsOp(
                lowering_strategy=tv.VectorContractLowering.OuterProduct
            ),
            tv.ApplyLowerOuterProductPatternsOp,
            lambda: tv.ApplyReorderMultiReductionPatternsOp(lowering_strategy=strategy),
            lambda: tv.ApplyMultiReductionFlatteningPatternsOp(lowering_strategy=strategy),
            lambda: tv.ApplyMultiReductionUnrollingPatternsOp(lowering_strategy=strategy),
            lambda: tv.ApplyLowerTransposePatternsOp(
                lowering_strategy=tv.VectorTransposeLowering.Shuffle16x16
                if shuffles
                else tv.VectorTransposeLowering.EltWise
            ),
        )
        patterns(
            tv.ApplyLowerShapeCastPatternsOp, tv.ApplyLowerBroadcastPatternsOp, canonicalize=False
        )

    def drop_unit_dims(self, target: Any) -> None:
        """Drop the unit dims of the vector ops under ``target`` (shape casts instead), so a
        one-channel convolution's ``vector<Wx1>`` values become ``vector<W>``."""
        self.apply_patterns(
            target,
            self.tv.ApplyDropUnitDimWithShapeCastPatternsOp,
            self.tv.ApplyDropInnerMostUnitDimsFromXferOpsPatternsOp,
            self.transform.ApplyCanonicalizationPatternsOp,
        )

    # -- per class ---------------------------------------------------------------------

    def elementwise(self, root: Any, op: OpFacts, fuse: bool) -> None:
        sizes, shuffles = square_tiles(op, line_tiles(op, tile_sizes_for(op, self.params)),
                                       self.params.lanes)  # fmt: skip
        self._parallel_root(root, op, sizes, [], fuse, shuffles=shuffles)

    def reduction(self, root: Any, op: OpFacts, fuse: bool) -> None:
        outer, inner = reduction_tile_sizes(op, self.params)
        fuse = fuse and not any(inner)  # producers would be computed for a whole row
        self._parallel_root(root, op, outer, inner, fuse)

    def _parallel_root(
        self,
        root: Any,
        op: OpFacts,
        outer: list[int],
        inner: list[int],
        fuse: bool,
        shuffles: bool = False,
    ) -> None:
        transform, ir = self.transform, self.ir
        if not vectorize_enabled(op, self.params):
            return  # tiling alone only adds loop overhead: leave the op to the fallback
        # A root no producer is labelled for gets no fusion step: its dead-code sweep
        # covers the whole function, which for every op would be quadratic.
        fuse = fuse and (self.fused_roots is None or op.index in self.fused_roots)
        seq, body_root = self.suppressed(root)
        with ir.InsertionPoint(seq.body):
            targets = self.match(body_root, OP_ATTR, op.index)
            each = transform.ForeachOp([], [targets])
            with ir.InsertionPoint(each.body):
                target = each.body.arguments[0]
                if op.op_class == "matmul":  # a matvec: vectorize as multiply + reduction
                    target = self.structured.GeneralizeOp(target).result
                if "parallel" not in op.iterator_types:
                    self._full_reduction(target, op, inner)
                else:
                    self._tile_fuse_vectorize(
                        body_root, target, op, outer, inner, fuse, shuffles=shuffles
                    )
                transform.YieldOp([])
            transform.YieldOp([])

    def _tile_fuse_vectorize(
        self,
        body_root: Any,
        target: Any,
        op: OpFacts,
        outer: list[int],
        inner: list[int],
        fuse: bool,
        shuffles: bool = False,
    ) -> None:
        structured, transform = self.structured, self.transform
        tile = [s if s != r else 0 for s, r in zip(outer, op.loop_ranges, strict=True)]
        if not any(tile):  # one tile: keep a one-trip loop to scope the patterns
            first = op.iterator_types.index("parallel")
            tile[first] = op.loop_ranges[first]
        inner = inner or [0] * len(op.loop_ranges)
        # Partial edge tiles are vectorized with masks at the full tile's shape (the fused
        # producers may have other shapes, so nothing is fused then).
        partial = partial_tiles(op.loop_ranges, tile, inner)
        vector = [i or t or r for i, t, r in zip(inner, tile, op.loop_ranges, strict=True)]
        fuse = fuse and not partial
        tiled = structured.TileUsingForallOp(self.any, self.any, target, tile_sizes=tile)
        forall = tiled.results[1]
        computes = [tiled.results[0]]
        if op.op_class == "matmul" or (op.op_class == "elementwise" and op.window_reads):
            # A matvec tile reads its vector operand along a unit dim: fold the unit dims
            # so the read is contiguous (else it is unrolled into one load per element).
            # A window read (an implicit GEMM's patch copy) does not vectorize at all
            # until they are folded: a unit-stride window's tiles become row copies
            # (ResNet-18's 64-channel 3x3 layer: 1.07x, docs/measurements.md, "Patch
            # copies as row copies"); a strided one stays a loop.
            fuse = False
            self.apply_patterns(
                forall,
                structured.ApplyFoldUnitExtentDimsViaSlicesPatternsOp,
                transform.ApplyCanonicalizationPatternsOp,
            )
            computes = [structured.MatchOp(self.any, forall, ops=["linalg.generic"]).result]
            extents = [t or r for t, r in zip(tile, op.loop_ranges, strict=True)]
            kept = [extent != 1 for extent in extents]
            inner = [size for size, keep in zip(inner, kept, strict=True) if keep]
            vector = [size for size, keep in zip(vector, kept, strict=True) if keep]
        if fuse:
            producers = self.match(body_root, FUSE_ATTR, op.index)
            fused = structured.FuseIntoContainingOp(self.any, self.any, producers, forall)
            forall = fused.results[1]
            computes.append(fused.results[0])
            # The originals of fused producers are dead now: erase them so their
            # own sub-sequences find nothing to do.
            function = transform.GetParentOp(
                self.any, forall, op_name="func.func", isolated_from_above=True
            ).result
            transform.ApplyDeadCodeEliminationOp(function)
        if any(inner):
            chunked = structured.TileUsingForOp(computes[0], sizes=inner)
            computes[0] = chunked.results[0]
        if partial:
            structured.VectorizeOp(computes[0], vector)
            computes = []
        for handle in computes:
            structured.VectorizeOp(handle)
        innermost = op.iterator_types[-1] == "reduction"
        self.lower_vectors(forall, inner_reduction=innermost, shuffles=shuffles)

    def _full_reduction(self, target: Any, op: OpFacts, inner: list[int]) -> None:
        """A reduction to a scalar: a serial loop over chunks (one trip if it fits)."""
        sizes = list(inner)
        if not any(sizes):
            sizes[0] = op.loop_ranges[0]
        tiled = self.structured.TileUsingForOp(target, sizes=sizes)
        if partial_tiles(op.loop_ranges, sizes):
            vector = [s or r for s, r in zip(sizes, op.loop_ranges, strict=True)]
            self.structured.VectorizeOp(tiled.results[0], vector)
        else:
            self.structured.VectorizeOp(tiled.results[0])
        self.lower_vectors(tiled.results[1], inner_reduction=True)

    def convolution(self, root: Any, op: OpFacts) -> None:
        plan = convolution_plan(op, self.params)
        if plan is None or not vectorize_enabled(op, self.params):
            return
        sizes, decompose = plan
        structured, transform, ir = self.structured, self.transform, self.ir
        seq, body_root = self.suppressed(root)
        with ir.InsertionPoint(seq.body):
            targets = self.match(body_root, OP_ATTR, op.index)
            each = transform.ForeachOp([], [targets])
            with ir.InsertionPoint(each.body):
                compute, scope = self._tile_convolution(each.body.arguments[0], op, sizes)
                init = self._fuse_convolution_init(body_root, op, sizes, scope)
                if decompose:
                    compute = structured.DecomposeOp(compute).result
                structured.VectorizeOp(compute)
                if init is not None:
                    structured.VectorizeOp(init)
                if scope is not None:
                    if self.params.conv_drop_unit_dims or pools_along_width(op, self.params):
                        self.drop_unit_dims(scope)
                    self.lower_vectors(scope)
                    conv = op.convolution
                    if self.params.conv_hoist_accumulators and op.op_class == "convolution":
                        hoist_accumulators(scope, len(conv.filter_loop) + len(conv.input_channel))
                transform.YieldOp([])
            transform.YieldOp([])

    def _fuse_convolution_init(
        self, body_root: Any, op: OpFacts, sizes: list[int], scope: Any
    ) -> Any | None:
        """Fuse the producer of the convolution's init (labelled by
        :func:`annotate_generic_ops`) into its output-tile loop; returns the fused op's
        handle, or None where there is none or the tiles are partial."""
        parallel = [s if k == "parallel" else 0 for s, k in zip(sizes, op.iterator_types,
                                                                strict=True)]  # fmt: skip
        if self.fused_roots is None or op.index not in self.fused_roots or not any(parallel):
            return None
        if partial_tiles(op.loop_ranges, parallel):
            return None
        producers = self.match(body_root, FUSE_ATTR, op.index)
        fused = self.structured.FuseIntoContainingOp(self.any, self.any, producers, scope)
        # The original producer is dead now: erase it, so its own sub-sequence finds
        # nothing to schedule (left, it would still run as a pass of its own).
        function = self.transform.GetParentOp(
            self.any, fused.results[1], op_name="func.func", isolated_from_above=True
        ).result
        self.transform.ApplyDeadCodeEliminationOp(function)
        return fused.results[0]

    def _tile_convolution(self, target: Any, op: OpFacts, sizes: list[int]) -> tuple[Any, Any]:
        """(tiled op, outermost loop or None): the output tiles (batch, channels, image) as
        one ``scf.forall`` -- on several threads each thread takes whole output tiles --
        and the window and input channels as serial loops inside it, in the same order
        a serial nest would run them."""
        structured = self.structured
        kinds = op.iterator_types
        parallel = [s if k == "parallel" else 0 for s, k in zip(sizes, kinds, strict=True)]
        reduction = [s if k == "reduction" else 0 for s, k in zip(sizes, kinds, strict=True)]
        compute, scope = target, None
        if any(parallel):
            tiled = structured.TileUsingForallOp(self.any, self.any, compute, tile_sizes=parallel)
            compute, scope = tiled.results[0], tiled.results[1]
        if any(reduction):
            tiled = structured.TileUsingForOp(compute, sizes=reduction)
            compute = tiled.results[0]
            scope = scope if scope is not None else tiled.results[1]
        return compute, scope


def build_generic_schedule(
    facts: PayloadFacts,
    params: GenericParams,
    *,
    per_op: Mapping[str, GenericParams] | None = None,
    propagate_failures: bool = False,
    fused_roots: Collection[int] | None = None,
) -> Any:
    """A transform module (``@__transform_main``) for the non-matmul ops of ``facts``.

    ``per_op`` gives some ops their own params, by :meth:`OpFacts.signature` (a tuned
    layer); the others take ``params``.

    An op whose sub-sequence fails is left to the fallback (loops), unless
    ``propagate_failures`` (debugging: the failure then says why). ``fused_roots``: the
    ops that :func:`annotate_generic_ops` found producers to fuse into (the values of its
    result); only these get a fusion step (default: every op may). Built in the current
    MLIR context (enter the payload's context first).
    """
    from stagegraph.mlir.bindings import ir, transform
    from stagegraph.stages.common.transform import new_schedule

    builder = OpSequenceBuilder(params, propagate_failures, fused_roots)
    module, main = new_schedule()
    # The params, for apply_generic_schedule to rebuild the schedule after its rewrites.
    module.operation.attributes[PARAMS_ATTR] = ir.StringAttr.get(params.model_dump_json())
    per_op = dict(per_op or {})
    if per_op:
        recorded = json.dumps({sig: p.model_dump(mode="json") for sig, p in per_op.items()})
        module.operation.attributes[PER_OP_ATTR] = ir.StringAttr.get(recorded)
    if propagate_failures:
        module.operation.attributes[PROPAGATE_ATTR] = ir.UnitAttr.get()
    with ir.InsertionPoint(main.body):
        root = main.bodyTarget
        for op in reversed(facts.ops):
            if not schedulable(op, facts):
                continue
            builder.params = per_op.get(op.signature(), params)
            if op.op_class == "elementwise":
                builder.elementwise(root, op, builder.params.fuse_elementwise)
            elif reduction_like(op):
                builder.reduction(root, op, builder.params.fuse_elementwise)
            else:
                builder.convolution(root, op)
        transform.YieldOp([])
    return module


def apply_generic_schedule(module: Any, schedule: Any, facts: PayloadFacts | None = None) -> None:
    """Rewrite the entry function so more of it vectorizes (:func:`prepare.prepare`), label
    it, apply ``schedule`` in place, drop the labels.

    ``facts`` must describe ``module`` as it is now (default: analysed here). When the
    rewrites change the entry, the facts are re-analysed; the schedule is rebuilt with the
    params recorded in ``schedule`` (other ops, e.g. matmuls, are never rewritten, so their
    labels stay valid), with fusion steps only for the roots that got producers.
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.transform import apply_schedule_module
    from stagegraph.stages.x86.generic.prepare import prepare

    module = getattr(module, "ir", module)
    facts = facts or analyze(module)
    with module.context, ir.Location.unknown():
        attrs = schedule.operation.attributes
        params = None
        if PARAMS_ATTR in attrs:
            params = GenericParams.model_validate_json(ir.StringAttr(attrs[PARAMS_ATTR]).value)
        per_op = {}
        if PER_OP_ATTR in attrs:
            recorded = json.loads(ir.StringAttr(attrs[PER_OP_ATTR]).value)
            per_op = {sig: GenericParams.model_validate(p) for sig, p in recorded.items()}
        fn = entry_function(module, facts.entry)
        if params is not None and prepare(
            module,
            fn,
            params.fuse_elementwise,
            params.conv_channels_last,
            params.lanes if params.conv_grouped_width else 0,
            params.lanes if params.fuse_elementwise else 0,
            direct3d_target(params),
            params.conv_chain_channels_last,
        ):
            facts = analyze(module, facts.entry)
        fused = annotate_generic_ops(module, facts)
        if params is not None:
            # Rebuilt: with the facts after the rewrites, and a fusion step only where
            # a producer was labelled.
            schedule = build_generic_schedule(
                facts,
                params,
                per_op=per_op,
                propagate_failures=PROPAGATE_ATTR in attrs,
                fused_roots=set(fused.values()),
            )
        apply_schedule_module(module, schedule)
        strip_annotations(module)


def lower_generic(module: Any, params: GenericParams | None = None) -> PayloadFacts:
    """The whole generic flow on a tensor-level ``module`` (an ``ir.Module`` or port), in
    place, down to the LLVM dialect: schedule, :data:`PIPELINE`, ``LOWER_TO_LLVM``.

    ``params`` defaults to :func:`heuristic_generic_params` for the host. Returns the facts
    the schedule was built from.
    """
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.passes import record_public_signatures, run_pipeline
    from stagegraph.stages.common.rewrites import copies_to_linalg, write_results_in_place
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.generic.params import heuristic_generic_params

    port = module if isinstance(module, Module) else Module["tensor"](module)
    with port.ir.context, ir.Location.unknown():
        facts = analyze(port.ir)
        params = params or heuristic_generic_params(facts, detect_target())
        apply_generic_schedule(port.ir, build_generic_schedule(facts, params), facts)
        record_public_signatures(port)
        run_pipeline(port, PIPELINE)
        write_results_in_place(port.ir)  # as the bufferize stage does
        if copies_to_linalg(port.ir):
            run_pipeline(port, lowering.LINALG_TO_LOOPS)
        run_pipeline(port, lowering.LOWER_TO_LLVM)
    return facts
