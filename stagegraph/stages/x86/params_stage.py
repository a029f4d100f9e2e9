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
from stagegraph.core.tunable import TuningSite
from stagegraph.stages.analysis import PayloadFacts
from stagegraph.stages.common.costmodel import CostModelConfig, apply_overrides
from stagegraph.stages.target import Target
from stagegraph.stages.x86.generic.params import GenericParams, heuristic_generic_params
from stagegraph.stages.x86.matmul.heuristic import heuristic_matmul_params
from stagegraph.stages.x86.matmul.params import MatmulParams


class X86Params(Params):
    """Everything the x86 schedule needs for one payload."""

    matmul: tuple[MatmulParams, ...] = ()
    generic: GenericParams = Field(default_factory=GenericParams)
    threads: int = Field(
        1, ge=1, le=1024,
        description="threads the payload's parallel loops run on (at least every matmul's)",
    )  # fmt: skip
    op_params: dict[str, GenericParams] = Field(
        default_factory=dict,
        description="generic params of single ops, by OpFacts.signature (tuned layers); "
        "every other non-matmul op takes `generic`",
    )

    def tuning_sites(self, facts: PayloadFacts, per_op: bool = False) -> list[TuningSite]:
        """Where a tuner varies these params: each matmul's own params; the generic params
        of the other ops, shared (``per_op`` False) or one entry of ``op_params`` per
        distinct op signature."""
        matmuls = matmul_ops(facts)
        sites = [
            TuningSite(f"matmul{i}", ("matmul", i), MatmulParams, (op,))
            for i, op in enumerate(matmuls)
        ]
        taken = {op.index for op in matmuls}
        others = [op for op in facts.ops if op.index not in taken and op.op_class != "other"]
        if not per_op:
            if others:
                sites.append(
                    TuningSite("generic", ("generic",), GenericParams, tuple(others),
                               kind_of=generic_op_kind)
                )  # fmt: skip
            return sites
        groups: dict[str, list[Any]] = {}
        for op in others:
            groups.setdefault(op.signature(), []).append(op)
        for signature, ops in groups.items():
            default = self.op_params.get(signature, self.generic).model_dump(mode="json")
            sites.append(
                TuningSite(f"op{ops[0].index}", ("op_params", signature), GenericParams,
                           tuple(ops), default=default, kind_of=generic_op_kind)
            )  # fmt: skip
        return sites

    @classmethod
    def override_keys(cls) -> set[str]:
        """``--param`` keys: a matmul field applies to every matmul, a generic field to all
        other ops."""
        return set(MatmulParams.model_fields) | set(GenericParams.model_fields)

    def with_overrides(self, overrides: dict[str, Any]) -> X86Params:
        mm = {k: v for k, v in overrides.items() if k in MatmulParams.model_fields}
        gen = {k: v for k, v in overrides.items() if k in GenericParams.model_fields}
        return X86Params(
            matmul=tuple(apply_overrides(p, mm) for p in self.matmul),
            generic=apply_overrides(self.generic, gen),
            op_params={s: apply_overrides(p, gen) for s, p in self.op_params.items()},
            threads=overrides.get("threads", self.threads),
        )

    def payload_threads(self) -> int:
        """Threads the lowered payload runs on: its own count, or more if a matmul's params
        (a tuned site, an older record) ask for more."""
        return max([self.threads, *(p.threads for p in self.matmul)])


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


# Below this much matmul work per thread (about 40 us of one core's FMAs), forking and
# joining OpenMP threads (and waiting for a busy core) costs more than it saves.
MIN_FLOPS_PER_THREAD = 4 << 20


def _threads_for(flops: int, cores: int) -> int:
    """Threads for a contraction of ``flops`` when the config does not say."""
    return max(1, min(cores, flops // MIN_FLOPS_PER_THREAD))


#: What forking and joining one parallel loop costs, in flops of one core's work (a few
#: microseconds; far more when another process holds a core the join waits for).
FORK_JOIN_FLOPS = MIN_FLOPS_PER_THREAD // 16


def serial_below(threads: int) -> int:
    """Work (lane operations) below which a loop runs serially on ``threads`` threads: what
    it would save, ``work * (1 - 1 / threads)``, is less than a fork and a join."""
    return threads * FORK_JOIN_FLOPS // (threads - 1)


def _payload_threads(facts: PayloadFacts, cores: int) -> int:
    """Threads for the payload: what its largest matmul or convolution is worth, if the
    work the contractions worth splitting save outweighs a fork and a join for every op
    whose loop stays parallel; else one.

    Once a payload is threaded, ``x86.lower`` keeps its loops too small to gain serial
    (:mod:`stagegraph.stages.common.serial_loops`), so an unrolled recurrent network's
    hundreds of small steps cost no forks: its input projections (large matmuls) take the
    threads and its steps run as before. Each step that is big enough to stay parallel
    (work or output elements above :func:`serial_below`) counts one fork and one join, so
    hundreds of mid-sized steps still keep a payload on one thread (before loops were
    serialized, a GRU ran 10 ms on one thread and 38 ms on two)."""
    ops = [*matmul_ops(facts), *(op for op in facts.ops if op.op_class == "convolution")]
    threads = _threads_for(max((op.flops for op in ops), default=0), cores)
    if threads <= 1:
        return 1
    splittable = sum(op.flops for op in ops if _threads_for(op.flops, cores) > 1)
    saved = splittable - splittable // threads
    parallel = serial_below(threads)
    forks = sum(
        1
        for op in facts.ops
        if max(op.flops, *(v.numel for v in op.outputs if v.kind == "tensor"), 0) >= parallel
    )
    return threads if saved > max(1, forks) * FORK_JOIN_FLOPS else 1


@stage("params", name="x86.heuristic")
def heuristic(facts: PayloadFacts, target: Target, config: CostModelConfig) -> X86Params:
    """Tiles from the vector width, register file and cache sizes; threads from the target
    (fewer when the matmul work is small, see ``MIN_FLOPS_PER_THREAD``)."""
    ops = matmul_ops(facts)
    # --threads grants cores; the payload uses as many as its work is worth (an unrolled
    # RNN threaded ran 3.5x slower than on one core).
    threads = _payload_threads(facts, config.threads or target.cores)
    sites = []
    for op in ops:
        c = op.contraction
        dtype = compute_dtype(op)
        # Batch elements run in parallel already: then blocks need not be split for threads.
        # A step too small to split keeps whole blocks (its loop runs serially anyway).
        site = threads if op.flops >= serial_below(max(2, threads)) else 1
        by_batch = c.batch >= 4 * site or c.batch % site == 0
        chosen = heuristic_matmul_params(c.m, c.n, c.k, dtype, target, 1 if by_batch else site)
        sites.append(chosen.model_copy(update={"threads": site}))
    params = X86Params(
        matmul=tuple(sites), generic=heuristic_generic_params(facts, target), threads=threads
    )
    return apply_overrides(params, config.overrides)
