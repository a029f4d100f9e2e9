"""The x86 flow's params stage (``x86.heuristic``) and what it produces.

The params stage turns payload facts and the target into :class:`X86Params` (one
:class:`MatmulParams` per ``linalg.matmul`` of the entry, in walk order, plus the generic
schedule's knobs and the payload's thread count). The swappable cost models of
:mod:`stagegraph.stages.x86.costmodels` produce the same type; the stages that consume it
are in :mod:`stagegraph.stages.x86.ir_stages`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stagegraph.core.ports import Params
from stagegraph.core.stage import stage
from stagegraph.core.tunable import ANY_OP, TuningSite, declare_space
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.common.costmodel import CostModelConfig, apply_overrides
from stagegraph.stages.target import Target
from stagegraph.stages.x86.conv.path_params import (
    ConvPathParams,
    chosen_paths,
    moves_paths,
    normalize_paths,
    path_sites,
)
from stagegraph.stages.x86.generic.params import GenericParams, heuristic_generic_params
from stagegraph.stages.x86.matmul.heuristic import heuristic_matmul_params
from stagegraph.stages.x86.matmul.params import MatmulParams
from stagegraph.stages.x86.matmul.sites import packs_b_from_memory, reads_constant_b
from stagegraph.stages.x86.threads import payload_threads, serial_below, thread_domain, thread_rules


class X86Params(Params):
    """Everything the x86 schedule needs for one payload."""

    matmul: tuple[MatmulParams, ...] = ()
    generic: GenericParams = Field(default_factory=GenericParams)
    threads: int = Field(
        1, ge=1, le=1024,
        description="threads the payload's parallel loops run on (the OpenMP regions' "
        "num_threads; a tunable: see stagegraph.stages.x86.threads)",
    )  # fmt: skip
    granted_threads: int = Field(
        1024, ge=1, le=1024,
        description="cores the run was granted (--threads, else the target's): the most "
        "threads a tuner may choose",
    )  # fmt: skip
    op_params: dict[str, GenericParams] = Field(
        default_factory=dict,
        description="generic params of single ops, by OpFacts.signature (tuned layers); "
        "every other non-matmul op takes `generic`",
    )
    conv_paths: dict[str, ConvPathParams] = Field(
        default_factory=dict,
        description="each convolution's direct or GEMM path, by its conv_key: what "
        "x86.normalize decided (a tunable: see stagegraph.stages.x86.conv.path_params)",
    )

    def tuning_sites(self, facts: PayloadFacts, per_op: bool = False) -> list[TuningSite]:
        """Where a tuner varies these params: each matmul's own params; the generic params
        of the other ops, shared (``per_op`` False) or one entry of ``op_params`` per
        distinct op signature; the path of each convolution ``x86.normalize`` decided
        (``conv<i>.gemm``); last, the payload's thread count (``payload.threads``)."""
        matmuls = matmul_ops(facts)
        paths = path_sites(facts)
        sites = [
            TuningSite(f"matmul{i}", ("matmul", i), MatmulParams, (op,))
            for i, op in enumerate(matmuls)
        ]
        # Last, the payload's thread count: one site over the whole payload (no op).
        payload = TuningSite("payload", (), X86Params)
        taken = {op.index for op in matmuls}
        others = [op for op in facts.ops if op.index not in taken and op.op_class != "other"]
        if not per_op:
            if others:
                sites.append(
                    TuningSite("generic", ("generic",), GenericParams, tuple(others),
                               kind_of=generic_op_kind)
                )  # fmt: skip
            return [*sites, *paths, payload]
        groups: dict[str, list[Any]] = {}
        for op in others:
            groups.setdefault(op.signature(), []).append(op)
        for signature, ops in groups.items():
            default = self.op_params.get(signature, self.generic).model_dump(mode="json")
            sites.append(
                TuningSite(f"op{ops[0].index}", ("op_params", signature), GenericParams,
                           tuple(ops), default=default, kind_of=generic_op_kind)
            )  # fmt: skip
        return [*sites, *paths, payload]

    @classmethod
    def override_keys(cls) -> set[str]:
        """``--param`` keys: a matmul field applies to every matmul, a generic field to all
        other ops."""
        return set(MatmulParams.model_fields) | set(GenericParams.model_fields)

    def with_overrides(self, overrides: dict[str, Any]) -> X86Params:
        mm = {k: v for k, v in overrides.items() if k in MatmulParams.model_fields}
        gen = {k: v for k, v in overrides.items() if k in GenericParams.model_fields}
        if mm and not self.matmul:  # no matmul to apply them to: still a typo is an error
            apply_overrides(MatmulParams(), mm)
        return X86Params(
            matmul=tuple(apply_overrides(p, mm) for p in self.matmul),
            generic=apply_overrides(self.generic, gen),
            op_params={s: apply_overrides(p, gen) for s, p in self.op_params.items()},
            threads=overrides.get("threads", self.threads),
            granted_threads=max(self.granted_threads, overrides.get("threads", 1)),
            conv_paths=self.conv_paths,
        )

    def upstream_configs(self) -> dict[str, dict[str, Any]]:
        """Config of the stages before the analysis that these params decide, by stage
        factory: the convolutions' paths are ``x86.normalize``'s ``paths``."""
        if not self.conv_paths:
            return {}
        return {"x86.normalize": {"paths": normalize_paths(self.conv_paths)}}

    def moves_upstream(self, baseline: X86Params) -> bool:
        """Do these params take another convolution path than ``baseline``? Then the ops
        they were made for differ from the baseline's, and the rest of the params must come
        from the cost model for the new ops (see :mod:`.conv.path_params`)."""
        return moves_paths(self.conv_paths, baseline.conv_paths)

    def payload_threads(self) -> int:
        """Threads the lowered payload runs on: its own count, the decision (a matmul's
        ``threads`` only shapes its blocks; it never raises the payload's)."""
        return self.threads


def generic_op_kind(op: Any) -> str:
    """The kind a non-matmul op's search space is declared for: its class, except that a
    matmul-class op the matmul schedule does not take (a matvec) is scheduled as a
    reduction."""
    return "reduction" if op.op_class == "matmul" else op.op_class


def matmul_ops(facts: PayloadFacts) -> list[Any]:
    """The entry's matmul-like ops in walk order: what the matmul schedule handles (each as
    one ``linalg.matmul`` per batch element, see
    :func:`stagegraph.stages.x86.matmul.canonical.canonicalize_contractions`)."""
    from stagegraph.stages.x86.matmul.sites import matmul_like_ops

    return matmul_like_ops(facts)


def compute_dtype(op: Any) -> str:
    """The element type a matmul's micro-kernel computes in: its accumulator's (narrower
    inputs such as bf16 -> f32 are widened first, see
    :func:`stagegraph.stages.x86.matmul.canonical.widen_inputs`)."""
    return op.outputs[0].dtype


#: Entries with more linalg ops than this have their repeated groups of ops outlined into
#: functions before scheduling (``x86.schedule``'s ``deduplicate_above``, this its
#: default): their weights then arrive as function arguments, no longer constants.
DEDUPLICATE_ABOVE = 300

#: Entries with more linalg ops than this (deduplicated) outline every group of ops, those
#: that occur once too (``x86.schedule``'s ``outline_every_group_above``, this its default;
#: None: never). Off by default: it cuts DenseNet-121's compile from 92 to 39 CPU seconds
#: (LLVM's cost on one function grows faster than its size: the inline entry's ``emit``
#: is 41 s, every group outlined 15 s), but the outlined model runs 1.4x slower (each
#: group returns a fresh tensor where inline code writes in place; ResNet-18: 1.06x).
OUTLINE_EVERY_GROUP_ABOVE: int | None = None


@stage("params", name="x86.heuristic")
def heuristic(facts: PayloadFacts, target: Target, config: CostModelConfig) -> X86Params:
    """Tiles from the vector width, register file and cache sizes; threads from the target
    (fewer when the contractions' work is small: :func:`.threads.payload_threads`)."""
    ops = matmul_ops(facts)
    # --threads grants cores; the payload uses as many as its work is worth (an unrolled
    # RNN threaded ran 3.5x slower than on one core).
    cores = config.threads or target.cores
    threads = payload_threads(
        facts, [*ops, *(op for op in facts.ops if op.op_class == "convolution")], cores
    )
    sites = []
    for op in ops:
        c = op.contraction
        dtype = compute_dtype(op)
        # Batch elements run in parallel already: then blocks need not be split for threads.
        # A step too small to split keeps whole blocks (its loop runs serially anyway).
        site = threads if op.flops >= serial_below(max(2, threads)) else 1
        by_batch = c.batch >= 4 * site or c.batch % site == 0
        # A constant B is packed at compile time (unless outlined with a repeated group).
        inline = len(facts.ops) <= DEDUPLICATE_ABOVE
        constant_b = c.batch == 1 and inline and reads_constant_b(op, facts)
        chosen = heuristic_matmul_params(
            c.m, c.n, c.k, dtype, target, 1 if by_batch else site, constant_b=constant_b,
            l2_b_slice=c.batch == 1 and packs_b_from_memory(op),
        )  # fmt: skip
        sites.append(chosen.model_copy(update={"threads": site}))
    params = X86Params(
        matmul=tuple(sites),
        generic=heuristic_generic_params(facts, target),
        threads=threads,
        granted_threads=cores,
        conv_paths=chosen_paths(facts),
    )
    return apply_overrides(params, config.overrides)


declare_space(
    X86Params,
    ANY_OP,
    {"threads": thread_domain},
    thread_rules,
    applies_to=lambda target: target.arch in ("x86_64", "AMD64"),
    name="threads",
)
