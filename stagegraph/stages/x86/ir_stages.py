"""The x86 flow's IR stages: ``x86.normalize`` (rewrites that decide which schedule an op
takes), ``x86.schedule`` (the generic schedule for the non-matmul linalg ops, then the
packed matmul micro-kernels, both built with the transform dialect's Python API) and
``x86.lower`` (to the LLVM dialect, OpenMP where the params ask for threads). Their params
come from :mod:`stagegraph.stages.x86.params_stage`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import Field

from stagegraph.core.ports import BufferModule, Config, LLVMModule, TensorModule
from stagegraph.core.stage import stage
from stagegraph.errors import ConfigError
from stagegraph.mlir.build import ir_location
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.config import ConvGemmConfig
from stagegraph.stages.x86.matmul.params import MatmulParams
from stagegraph.stages.x86.params_stage import (
    DEDUPLICATE_ABOVE,
    OUTLINE_EVERY_GROUP_ABOVE,
    X86Params,
    matmul_ops,
)
from stagegraph.stages.x86.threads import serial_below


class ScheduleConfig(Config):
    """``propagate_failures`` (debugging): a generic op whose transform sub-sequence fails
    raises, saying why, instead of falling back to loops. ``deduplicate_above``: payloads
    whose entry has more linalg ops than this compile each repeated group of ops once
    (:mod:`stagegraph.stages.common.dedup`); smaller ones compile fast anyway and keep
    every op inline (no call or strided-argument overhead). ``roll_steps``: after
    deduplication, runs of identical steps of the entry become loops
    (:mod:`stagegraph.stages.common.roll`). ``outline_every_group_above``: entries with
    more linalg ops than this (and deduplicated) outline the groups that occur once as
    well, so that no function LLVM compiles holds the whole model (None, the default:
    never; it trades run time for compile time)."""

    propagate_failures: bool = False
    deduplicate_above: int = Field(DEDUPLICATE_ABOVE, ge=0)
    outline_every_group_above: int | None = Field(OUTLINE_EVERY_GROUP_ABOVE, ge=0)
    roll_steps: bool = Field(
        True,
        description="after deduplication, roll runs of identical steps of the entry (an "
        "unrolled recurrent network's time steps) into loops "
        "(stagegraph.stages.common.roll): LLVM then compiles one step, not hundreds",
    )


@stage("passes", name="x86.normalize")
def normalize(
    module: TensorModule,
    target: Target | None = None,
    config: ConvGemmConfig = ConvGemmConfig(),  # noqa: B008  (frozen, safe to share)
) -> TensorModule:
    """Rewrites that decide which schedule an op takes, run before the analysis so the cost
    model sees the ops the schedule will: strided transposed convolutions become one
    convolution per output phase (:mod:`stagegraph.stages.x86.conv.transposed`), stride-1
    ones a GEMM on their real input (:mod:`stagegraph.stages.x86.conv.col2im`), then
    pointwise convolutions (some phases' among them) become matmuls
    (:mod:`stagegraph.stages.x86.conv.pointwise`), and other channels-first ones the implicit
    GEMM of their patches (:mod:`stagegraph.stages.x86.conv.gemm`) where the cost model
    of :mod:`stagegraph.stages.x86.conv.choice` finds it faster on ``target`` (default: the
    host) or ``config`` says, and the 2-D ones left on the direct path channels-last, with
    no transposes between consecutive ones (:mod:`stagegraph.stages.x86.conv.chain_layout`);
    elementwise consumers that reach a matmul through reshapes move onto its result, so
    they fuse into its tiles (:mod:`stagegraph.stages.common.reshaped_epilogues`; those of
    a row-block loop first onto each block, :mod:`stagegraph.stages.common.block_epilogues`);
    3-D poolings become 2-D then 1-D ones; attention chains (QK^T, a row-wise softmax,
    PV) run by blocks of query rows whose scores stay in cache
    (:mod:`stagegraph.stages.x86.attention`). Before those, gathers through constant
    positions that only reshape become reshapes
    (:mod:`stagegraph.stages.common.constant_gathers`), per-channel constant scales and
    shifts after a convolution or matmul (eval-mode BatchNorm) fold into its weights and
    bias (:mod:`stagegraph.stages.common.fold_batchnorm`), unit dims leave the generic ops
    (:mod:`stagegraph.stages.common.unit_dims`) and a training-mode norm's statistics
    become one reduction (:mod:`stagegraph.stages.x86.generic.batch_stats`). Convolutions
    that became matmuls take their elementwise consumers onto the matmul, through reshapes
    and row-block loops
    (:mod:`stagegraph.stages.common.block_epilogues`,
    :mod:`stagegraph.stages.common.reshaped_epilogues`), so the consumers ride on its
    epilogue. Last, a matmul of one row reads its transposed weight in place, and one of a
    few rows gets its constant weight transposed at compile time
    (:mod:`stagegraph.stages.x86.matmul.weight_rows`)."""
    from stagegraph.stages.common.block_epilogues import sink_epilogues_into_blocks
    from stagegraph.stages.common.constant_gathers import fold_reshaping_gathers
    from stagegraph.stages.common.fold_batchnorm import fold_channel_affine_chains
    from stagegraph.stages.common.reshaped_epilogues import fuse_epilogues_through_reshapes
    from stagegraph.stages.common.unit_dims import fold_unit_dims
    from stagegraph.stages.x86.attention import tile_attention
    from stagegraph.stages.x86.conv.chain_layout import carry_channels_last
    from stagegraph.stages.x86.conv.col2im import stride1_transposed_to_col2im
    from stagegraph.stages.x86.conv.gemm import convolutions_to_gemm
    from stagegraph.stages.x86.conv.pointwise import pointwise_convolutions_to_matmuls
    from stagegraph.stages.x86.conv.transposed import decompose_strided_transposed_convolutions
    from stagegraph.stages.x86.generic.batch_stats import one_pass_statistics
    from stagegraph.stages.x86.matmul.weight_rows import prepare_weights
    from stagegraph.stages.x86.pool3d import separate_3d_poolings

    config = _with_tuned_paths(config, target)
    with module.ir.context, ir_location(module.ir):
        fold_reshaping_gathers(module.ir)
        fold_channel_affine_chains(module.ir)  # eval-mode BatchNorm into conv weights
        fold_unit_dims(module.ir)
        one_pass_statistics(module.ir)  # a norm's sums: one reduction, not three
        decompose_strided_transposed_convolutions(module.ir)
        stride1_transposed_to_col2im(module.ir, config, target)
        pointwise_convolutions_to_matmuls(module.ir)
        convolutions_to_gemm(module.ir, config, target)
        if config.chain_channels_last:  # the direct ones channels-last from one to the next
            carry_channels_last(module.ir)
        sink_epilogues_into_blocks(module.ir)  # a row-block loop's epilogue onto its blocks
        fuse_epilogues_through_reshapes(module.ir)  # their epilogues onto the matmuls
        tile_attention(module.ir, target, config.attention)  # scores in cache, by blocks
        separate_3d_poolings(module.ir)  # 3-D poolings as 2-D then 1-D ones: vectorized
        prepare_weights(module.ir)  # few rows: no per-call transpose of W
    return module


def _with_tuned_paths(config: ConvGemmConfig, target: Target | None) -> ConvGemmConfig:
    """``config`` with the paths of the tuning DB's best candidate (``config.tuned``, set by
    ``--cost-model tuned``) over its ``paths``; unchanged without a winner for this
    workload, graph and target (the ``tuned`` cost model then falls back as well)."""
    if config.tuned is None or target is None:
        return config
    from stagegraph.stages.x86.conv.path_params import normalize_paths
    from stagegraph.stages.x86.costmodels import TunedConfig, lookup_tuned

    source = config.tuned
    found, _ = lookup_tuned(
        TunedConfig(db=source.db, workload=source.workload, graph=source.graph), target
    )
    if found is None or not found.conv_paths:
        return config
    paths = {**config.paths, **normalize_paths(found.conv_paths)}
    return config.model_copy(update={"paths": paths})


def describe_schedule(inputs: dict[str, Any], config: Config) -> str:
    """The transform modules :func:`schedule` applies to these inputs, as MLIR text, for a
    reproducer (they are built from the facts and params; run on a copy of the module)."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.diagnostics import parse_module

    module = inputs["module"]  # the reproducer hook keeps the module as text
    applied: list[str] = []
    context = new_context()
    # The stage failed: keep the transform modules built before it did.
    with contextlib.suppress(Exception), context, ir.Location.unknown():
        copy = TensorModule(parse_module(module if isinstance(module, str) else module.text(),
                                         context, "x86.schedule input"))  # fmt: skip
        settings = config if isinstance(config, ScheduleConfig) else ScheduleConfig()
        deduplicate = len(inputs["facts"].ops) > settings.deduplicate_above
        _apply_schedules(
            copy, inputs["facts"], inputs["params"], applied, deduplicate=deduplicate,
            roll=settings.roll_steps, min_sites=_min_sites(inputs["facts"], settings),
        )  # fmt: skip
    parts = [f"// transform module {i + 1} of {len(applied)}\n{m}" for i, m in enumerate(applied)]
    return "\n".join(parts)


@stage("schedule", name="x86.schedule", describe=describe_schedule)
def schedule(
    module: TensorModule,
    facts: PayloadFacts,
    params: X86Params,
    config: ScheduleConfig = ScheduleConfig(),  # noqa: B008  (frozen, safe to share)
) -> TensorModule:
    """Generic ops first (tile, fuse, vectorize), then the packed matmul micro-kernels;
    then concatenations become insertions their producers write in place
    (:mod:`stagegraph.stages.common.concat_in_place`)."""
    from stagegraph.stages.common.concat_in_place import concatenations_in_place

    _apply_schedules(
        module, facts, params, propagate_failures=config.propagate_failures,
        deduplicate=len(facts.ops) > config.deduplicate_above, roll=config.roll_steps,
        min_sites=_min_sites(facts, config),
    )  # fmt: skip
    with module.ir.context, ir_location(module.ir):
        concatenations_in_place(module.ir)  # written in place by their producers
    return module


def _min_sites(facts: PayloadFacts, config: ScheduleConfig) -> int:
    """How often a group must occur to be outlined: twice (shared), or once in an entry
    past ``outline_every_group_above`` ops, where LLVM's cost on the one function has
    turned superlinear (see :data:`.params_stage.OUTLINE_EVERY_GROUP_ABOVE`)."""
    above = config.outline_every_group_above
    return 1 if above is not None and len(facts.ops) > above else 2


def _apply_schedules(
    module: TensorModule,
    facts: PayloadFacts,
    params: X86Params,
    applied: list[str] | None = None,
    propagate_failures: bool = False,
    deduplicate: bool = False,
    roll: bool = True,
    min_sites: int = 2,
) -> None:
    """What :func:`schedule` does; each transform module applied is appended to ``applied``
    (as text: applying may change it).

    Groups of ops that repeat (the steps of an unrolled recurrent network) are first
    moved into one private function per distinct group (:mod:`stagegraph.stages.common.
    dedup`), each scheduled once in a module of its own; the entry, calling them, is
    scheduled last. Compile time then follows the distinct groups, not the op count.
    With ``roll``, runs of identical steps of the entry (calls of those functions) then
    become loops (:mod:`stagegraph.stages.common.roll`), so that what LLVM compiles
    follows the distinct steps too.
    """
    from stagegraph.mlir.walk import strip_attributes
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common import dedup

    applied = [] if applied is None else applied
    payload = module.ir
    with payload.context, ir_location(payload):
        shared = _outline_repeated(payload, facts, params, min_sites) if deduplicate else None
        if shared is None:
            _schedule_payload(payload, facts, params, applied, propagate_failures)
            return
        if not shared.distinct and not shared.put_back:
            _schedule_payload(payload, facts, params, applied, propagate_failures)
            strip_attributes(payload, ORIGIN_ATTR)
            return
        if roll and shared.distinct:
            from stagegraph.mlir.functions import entry_function
            from stagegraph.stages.common.roll import roll_repeated

            pure = {d.symbol for d in shared.distinct}  # tensor-only functions of linalg ops
            roll_repeated(entry_function(payload, facts.entry), pure)
        for distinct in shared.distinct:
            scratch = distinct.scope.module
            local = analyze(scratch, distinct.symbol)
            _schedule_payload(
                scratch, local, _local_params(params, facts, local, scratch), applied,
                propagate_failures,
            )  # fmt: skip
        local = analyze(payload, facts.entry)
        _schedule_payload(
            payload, local, _local_params(params, facts, local, payload), applied,
            propagate_failures,
        )  # fmt: skip
        dedup.install(payload, shared)
        strip_attributes(payload, ORIGIN_ATTR)


#: Set on each linalg op of the entry while repeated groups are outlined: its index in
#: the original ``PayloadFacts.ops``, by which its params are found again.
ORIGIN_ATTR = "stagegraph.origin"


def _outline_repeated(
    payload: Any, facts: PayloadFacts, params: X86Params, min_sites: int = 2
) -> Any:
    """Label the entry's linalg ops with their facts index, then outline repeated groups
    (a group's matmul params are part of its key: differently tuned sites stay apart)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.analysis import linalg_ops
    from stagegraph.stages.common import dedup

    fn = entry_function(payload, facts.entry)
    ops = linalg_ops(fn)
    if [op.name for op in ops] != [f.name for f in facts.ops]:
        return dedup.Deduplicated()  # facts of another module: no outlining
    i64 = ir.IntegerType.get_signless(64)
    by_op = {}
    for op, fact in zip(ops, facts.ops, strict=True):
        op.attributes[ORIGIN_ATTR] = ir.IntegerAttr.get(i64, fact.index)
        by_op[op] = fact
    order = {op.index: i for i, op in enumerate(matmul_ops(facts))}
    matmul_params = params.matmul if len(params.matmul) == len(order) else ()

    def seed(op: Any) -> bool:
        return op in by_op and op.name != "linalg.fill"

    def heavy(op: Any) -> bool:
        return by_op[op].op_class in ("matmul", "convolution")

    def extra_key(group: Any) -> Any:
        chosen = [order[by_op[op].index] for op in group if by_op[op].index in order]
        if not matmul_params:
            return tuple(chosen)  # no params to compare: only the same sites share
        return tuple(matmul_params[i].model_dump_json() for i in chosen)

    found = dedup.groups(fn, seed, heavy)
    return dedup.outline_repeated(payload, fn, found, extra_key, min_sites)


def _local_params(
    params: X86Params, facts: PayloadFacts, local: PayloadFacts, payload: Any
) -> X86Params:
    """``params`` for a function made of some of the ops ``facts`` describes: each of its
    matmuls takes the params of the op it was (read from ``ORIGIN_ATTR``)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.analysis import linalg_ops

    order = {op.index: i for i, op in enumerate(matmul_ops(facts))}
    ops = linalg_ops(entry_function(payload, local.entry))
    chosen = []
    for op in matmul_ops(local):
        attrs = ops[op.index].attributes
        origin = attrs[ORIGIN_ATTR] if ORIGIN_ATTR in attrs else None  # noqa: SIM401 (no .get)
        index = ir.IntegerAttr(origin).value if origin is not None else None
        if index not in order or len(params.matmul) != len(order):
            raise ConfigError(
                f"no matmul params for op {op.index} of @{local.entry}: params must come "
                "from this payload's facts"
            )
        chosen.append(params.matmul[order[index]])
    return params.model_copy(update={"matmul": tuple(chosen)})


def _schedule_payload(
    payload: Any,
    facts: PayloadFacts,
    params: X86Params,
    applied: list[str],
    propagate_failures: bool,
) -> None:
    """The generic schedule, then the matmul schedule, on ``facts.entry`` of ``payload``."""
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )
    from stagegraph.stages.x86.matmul import canonical as canonical
    from stagegraph.stages.x86.matmul.broadcast_reads import scalarize_broadcast_reads
    from stagegraph.stages.x86.matmul.constant_pack import prepack_constant_weights
    from stagegraph.stages.x86.matmul.init_epilogue import init_as_epilogue
    from stagegraph.stages.x86.matmul.operands import fold_transposed_operands
    from stagegraph.stages.x86.matmul.patch_operands import mark_patch_operands
    from stagegraph.stages.x86.matmul.schedule import schedule_matmuls

    candidates = canonical.label_contractions(payload, facts)
    # The patch gathers B's packing absorbs, by their matmul's params (matmul/patch_operands)
    matmuls = matmul_ops(facts)
    by_op = {}
    if len(matmuls) == len(params.matmul):
        by_op = {op.index: p for op, p in zip(matmuls, params.matmul, strict=True)}
    mark_patch_operands(payload, by_op)
    generic = build_generic_schedule(
        facts, params.generic, per_op=params.op_params, propagate_failures=propagate_failures
    )
    applied.append(generic.operation.get_asm(assume_verified=True))
    apply_generic_schedule(payload, generic, facts)
    canonical.canonicalize_contractions(payload, candidates)
    fold_transposed_operands(payload)
    canonical.widen_inputs(payload)
    order = {op.index for op in matmul_ops(facts)}
    init_as_epilogue(payload, order)  # C's initial values added in place, after the products
    # A matmul the cost model made no params for stays on the generic path: correct,
    # lowered to loops.
    labelled = [(i, s) for i, s in enumerate(canonical.find_matmuls(payload)) if s.source in order]
    if labelled:
        site_params = _site_params(params, facts, [s for _, s in labelled])
        labelled = prepack_constant_weights(payload, labelled, site_params)
        schedule_matmuls(payload, labelled, site_params, applied)
        scalarize_broadcast_reads(payload)
    canonical.strip_labels(payload)


def _site_params(params: X86Params, facts: PayloadFacts, sites: list[Any]) -> list[MatmulParams]:
    """The params of each site: by the op it was made from (an op the canonicalization could
    not rewrite has params but no site), else by position."""
    order = {op.index: i for i, op in enumerate(matmul_ops(facts))}
    if len(order) == len(params.matmul) and all(s.source in order for s in sites):
        return [params.matmul[order[s.source]] for s in sites]
    if len(sites) != len(params.matmul):
        raise ConfigError(
            f"the payload has {len(sites)} linalg.matmul ops but the params describe "
            f"{len(params.matmul)}; params must come from this payload's facts"
        )
    return list(params.matmul)


X86_FINISH = "func.func(lower-vector-multi-reduction),convert-linalg-to-loops"

#: f32 vectors of a copy's row moved at once (``generic.vector_copies.vectorize_copies``).
COPY_ROW_VECTORS = 8


class LowerConfig(Config):
    """``vector_math``: call glibc's libmvec for vector math ops the target's ISA covers
    (else LLVM scalarizes them into one libm call per lane); ``approximate_math``: f32 tanh,
    exp, erf, log and log1p as polynomials in arith first
    (:mod:`stagegraph.stages.common.math_approx`)."""

    vector_math: bool = True
    approximate_math: bool = True


@stage("passes", name="x86.lower")
def lower(
    module: BufferModule, params: X86Params, target: Target, config: LowerConfig
) -> LLVMModule:
    """Copies bufferization left vectorized by rows (``vectorize_copies``), leftover vector
    reductions and linalg ops to loops, then to LLVM; parallel block loops become
    dynamically scheduled OpenMP loops when the params ask for more than one thread."""
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.dedup import forbid_inlining
    from stagegraph.stages.common.fill_maps import constant_maps_to_fills
    from stagegraph.stages.common.math_approx import (
        approximate_erf,
        approximate_exp,
        approximate_log,
        approximate_tanh,
    )
    from stagegraph.stages.common.passes import run_lowering, run_pipeline
    from stagegraph.stages.common.rewrites import (
        copies_to_linalg,
        define_bf16_builtins,
        expand_bf16_truncation,
        reassociate_reductions,
    )
    from stagegraph.stages.common.serial_loops import serialize_small_parallel_loops
    from stagegraph.stages.common.softplus_tanh import fold_softplus_tanh
    from stagegraph.stages.common.uniform_exp import compute_uniform_exps_once
    from stagegraph.stages.x86.generic.vector_copies import vectorize_copies
    from stagegraph.stages.x86.matmul.prefetch_rows import prefetch_rows
    from stagegraph.stages.x86.matmul.stream_prefetch import prefetch_streams
    from stagegraph.stages.x86.vector_math import call_vector_math

    prefetch_rows(module.ir)
    prefetch_streams(module.ir)
    constant_maps_to_fills(module.ir)  # a tensor.pad's padding: one flat, vectorized fill
    if copies_to_linalg(module.ir):
        lanes = max(1, target.vector_bits // 32)  # f32 lanes: the rows' unit of measure
        vectorize_copies(module.ir, COPY_ROW_VECTORS * lanes, lanes)
    compute_uniform_exps_once(module.ir)  # ELU/SELU on positive vectors: no exp polynomial
    if config.approximate_math:
        fold_softplus_tanh(module.ir)  # Mish's gate: one exp and a division
        approximate_tanh(module.ir)
        approximate_exp(module.ir)
        approximate_erf(module.ir)
        approximate_log(module.ir)
    if config.vector_math:
        call_vector_math(module.ir, target)
    run_pipeline(module, X86_FINISH)
    reassociate_reductions(module.ir)
    lowering.require_lowerable(module.ir, "this stage's linalg-to-loops step (x86.lower)")
    if not target.has("avx512bf16"):  # else LLVM would call compiler-rt's __truncsfbf2
        expand_bf16_truncation(module.ir)
        define_bf16_builtins(module.ir)
    threads = params.payload_threads()
    if threads > 1:
        # A loop whose work saves less than a fork and a join stays serial.
        serialize_small_parallel_loops(module.ir, serial_below(threads), threads)
    if threads <= 1:
        run_lowering(module, lowering.LOWER_TO_LLVM)
    else:
        # Threads take the parallel loop's blocks in shrinking chunks (lowering.schedule_guided).
        run_lowering(module, lowering.to_openmp(threads))
        lowering.schedule_guided(module.ir)
        run_pipeline(module, lowering.OPENMP_TO_LLVM)
    forbid_inlining(module.ir)
    lowering.require_llvm_level(module.ir, "this lowering stage")
    lowering.pin_codegen_target(module.ir, target)
    return module
