"""The direct-vs-GEMM choice of each convolution as a tunable part of the x86 params.

``x86.normalize`` decides each convolution's path by the cost model of
:mod:`stagegraph.stages.x86.conv.choice` before the analysis, so the params stage sees the
ops the schedule will run, and stamps the decision on the op
(:data:`~stagegraph.stages.x86.conv.choice.PATH_ATTRIBUTE`); the analysis passes the
stamps on as ``PayloadFacts.decisions``. The params stage copies them into
``X86Params.conv_paths`` (by :func:`~stagegraph.stages.x86.conv.choice.conv_key`), so the
params record the path each convolution took, and a tuner varies them like any other
site: one :class:`ConvPathParams` site per convolution (op kind ``conv_path``), whose
default is the cost model's choice (a convolution the GEMM cannot take, see
:func:`~stagegraph.stages.x86.conv.gemm.gemm_worth`, is not decided, so it has no site).
A candidate's paths go back to ``x86.normalize`` as
its ``paths`` config (:func:`normalize_paths`), which is why the choice stays a rewrite
before the analysis and not a schedule option: the other path makes other ops (a GEMM's
patch copy and matmul, which have tile params of their own).

Changing a convolution's path changes the ops the rest of the params describe (one
matmul more or fewer), so tile params measured on one set of paths mean nothing on
another. The declaration below therefore makes the path sites *exclusive*
(:class:`~stagegraph.core.tunable.SpaceDeclaration` ``exclusive``): a candidate that moves
a path keeps every other site at the baseline's values, and it is compiled with the
graph's own cost model for everything but the paths (``X86Params.moves_upstream``, read
by :func:`stagegraph.app.graph_options.with_candidate_params`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from stagegraph.core.tunable import Choice, TuningSite, declare_space
from stagegraph.stages.x86.conv.choice import PATH_ATTRIBUTE

#: The op kind of the path sites' declaration.
CONV_PATH_KIND = "conv_path"


class ConvPathParams(BaseModel):
    """One convolution's path: ``winograd`` (F(m, 3), only where
    :func:`~stagegraph.stages.x86.conv.winograd_cost.winograd_worth` admits the shape: elsewhere
    the flag is ignored), else ``gemm`` (the implicit GEMM) or not (the direct kernel)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm: bool = False
    winograd: bool = False


class ConvPathOp(BaseModel):
    """The op a path site governs: the convolution's key, the path taken, the cost
    model's estimates and what decided (the fields of the stamp)."""

    model_config = ConfigDict(frozen=True)

    key: str
    path: str
    direct_cycles: int = 0
    gemm_cycles: int = 0
    decided_by: str = "cost model"
    winograd_cycles: int = 0  # 0: not a Winograd shape
    op_class: str = CONV_PATH_KIND

    def signature(self) -> str:
        """The convolution's key: what the tuned path is found again by."""
        return f"{CONV_PATH_KIND} {self.key}"


def stamped_paths(facts: Any) -> list[ConvPathOp]:
    """The path decisions ``x86.normalize`` stamped, one per convolution key in walk order
    (identical convolutions share a key, so one site and one ``paths`` entry)."""
    found: dict[str, ConvPathOp] = {}
    for decision in getattr(facts, "decisions", ()):
        if decision.attribute != PATH_ATTRIBUTE or decision.key in found:
            continue
        fields = decision.fields
        found[decision.key] = ConvPathOp(
            key=decision.key,
            path=str(fields.get("path", "direct")),
            direct_cycles=int(fields.get("direct_cycles", 0)),
            gemm_cycles=int(fields.get("gemm_cycles", 0)),
            decided_by=str(fields.get("decided_by", "cost model")),
            winograd_cycles=int(fields.get("winograd_cycles", 0)),
        )
    return list(found.values())


def chosen_paths(facts: Any) -> dict[str, ConvPathParams]:
    """``X86Params.conv_paths`` for ``facts``: the path each convolution took."""
    return {
        op.key: ConvPathParams(gemm=op.path == "gemm", winograd=op.path == "winograd")
        for op in stamped_paths(facts)
    }


def cost_model_paths(facts: Any) -> dict[str, ConvPathParams]:
    """The path the cost model estimated faster for each stamped convolution, whatever
    ``paths`` decided (the stamp keeps both estimates)."""
    found = {}
    for op in stamped_paths(facts):
        gemm = op.gemm_cycles < op.direct_cycles
        best = min(op.gemm_cycles, op.direct_cycles)
        winograd = 0 < op.winograd_cycles < best
        found[op.key] = ConvPathParams(gemm=gemm and not winograd, winograd=winograd)
    return found


def path_sites(facts: Any) -> list[TuningSite]:
    """One site per decided convolution, ``conv<i>`` at ``("conv_paths", key)``."""
    return [
        TuningSite(f"conv{i}", ("conv_paths", op.key), ConvPathParams, (op,),
                   default={"gemm": op.path == "gemm", "winograd": op.path == "winograd"})
        for i, op in enumerate(stamped_paths(facts))
    ]  # fmt: skip


def normalize_paths(conv_paths: dict[str, Any]) -> dict[str, str]:
    """``X86Params.conv_paths`` as ``ConvGemmConfig.paths`` (``key -> direct|gemm|winograd``;
    a ``winograd`` the shape does not take falls back to the cost model's other paths)."""
    out = {}
    for key, value in conv_paths.items():
        if not isinstance(value, ConvPathParams):
            value = ConvPathParams(**value)
        out[key] = "winograd" if value.winograd else "gemm" if value.gemm else "direct"
    return out


def moves_paths(conv_paths: dict[str, Any], baseline: dict[str, Any]) -> bool:
    """Do ``conv_paths`` take another path than the ``baseline``'s anywhere?"""
    mine = normalize_paths(conv_paths)
    base = normalize_paths(baseline)
    return any(mine[k] != base.get(k, mine[k]) for k in mine)


declare_space(
    ConvPathParams,
    CONV_PATH_KIND,
    {"gemm": Choice((0, 1)), "winograd": Choice((0, 1))},
    applies_to=lambda target: getattr(target, "arch", "") in ("x86_64", "AMD64"),
    exclusive=True,
)
