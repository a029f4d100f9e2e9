"""Payload analysis: the facts about a linalg-on-tensors module that cost models use.

:func:`analyze` walks the entry function through the MLIR bindings (ops, attributes,
affine maps, types; never the printed IR) and returns :class:`PayloadFacts`: the function
signatures, every linalg op with its loop ranges, iterator types and a classification
(``matmul``, ``convolution``, ``pooling``, ``elementwise``, ``reduction``, ``other``), the
matmul-like *layers* with the elementwise epilogue that could be fused into them, and a flop
and byte summary. :func:`parse_payload` parses a payload and turns a failure caused by an
unregistered dialect (e.g. ``tm_tensor.scan``) into an :class:`UnregisteredOpError`.
"""

from __future__ import annotations

from typing import Any

from stagegraph.core.ports import Config, TensorModule
from stagegraph.core.stage import stage
from stagegraph.errors import UnsupportedPayloadError
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.functions import function_name, payload_functions, select_entry
from stagegraph.mlir.walk import DefUse
from stagegraph.stages.analysis.decisions import stamped_decisions
from stagegraph.stages.analysis.facts import (
    CLASS_PRIORITY,
    SUPPORTED_DTYPES,
    ContractionFacts,
    ConvolutionFacts,
    FunctionFacts,
    IteratorType,
    LayerFacts,
    OpClass,
    OpFacts,
    PayloadFacts,
    ValueFacts,
)
from stagegraph.stages.analysis.ops import (
    CONTRACTION_OPS,
    REDUCTION_COMBINERS,
    classify,
    declared_iterator_types,
    function_facts,
    is_linalg_op,
    layers_of,
    linalg_ops,
    op_facts,
    producer_ops,
    value_facts,
)

__all__ = [
    "CLASS_PRIORITY",
    "CONTRACTION_OPS",
    "REDUCTION_COMBINERS",
    "SUPPORTED_DTYPES",
    "AnalyzeConfig",
    "ContractionFacts",
    "ConvolutionFacts",
    "FunctionFacts",
    "IteratorType",
    "LayerFacts",
    "OpClass",
    "OpFacts",
    "PayloadFacts",
    "ValueFacts",
    "analyze",
    "analyze_stage",
    "classify",
    "declared_iterator_types",
    "function_facts",
    "is_linalg_op",
    "linalg_ops",
    "op_facts",
    "parse_payload",
    "select_entry",
    "value_facts",
]


# --------------------------------------------------------------------------- entry points


def analyze(module: Any, entry: str | None = None) -> PayloadFacts:
    """Facts of ``module`` (an ``ir.Module`` or a :class:`stagegraph.core.ports.Module`).

    Raises:
        UnsupportedPayloadError: no entry function, dynamic shapes or unsupported element
            types in the entry function or its linalg ops.
    """
    module = getattr(module, "ir", module)  # accept the port wrapper too
    with module.context:
        functions = payload_functions(module)
        fn = select_entry(functions, entry)
        name = function_name(fn)
        if not fn.regions[0].blocks:
            raise UnsupportedPayloadError(f"payload function @{name} is a declaration, no body")
        fn_facts = tuple(function_facts(f, strict=f == fn) for f in functions)
        ops = linalg_ops(fn)
        def_use = DefUse(fn)
        position = {op: i for i, op in enumerate(ops)}
        facts = [op_facts(op, i, f"payload function @{name}", def_use).model_copy(
                     update={"producer_ops": producer_ops(op, position)})
                 for i, op in enumerate(ops)]  # fmt: skip
        layers = layers_of(ops, facts, def_use)
        decisions = stamped_decisions(fn)
    entry_facts = fn_facts[functions.index(fn)]
    classes = frozenset(f.op_class for f in facts)
    values = entry_facts.arguments + entry_facts.results
    return PayloadFacts(
        entry=name,
        functions=fn_facts,
        ops=tuple(facts),
        layers=tuple(layers),
        classes=classes,
        primary_class=next((c for c in CLASS_PRIORITY if c in classes), None),
        flops=sum(f.flops for f in facts),
        bytes=sum(v.nbytes for v in values),
        dtypes=frozenset(v.dtype for f in facts for v in f.inputs + f.outputs)
        | frozenset(v.dtype for v in values),
        decisions=decisions,
    )


# --------------------------------------------------------------------------- stage


class AnalyzeConfig(Config):
    """``entry``: the function to analyse (default: the single public one, else ``@main``)."""

    entry: str | None = None


@stage("analysis", name="analyze")
def analyze_stage(module: TensorModule, config: AnalyzeConfig) -> PayloadFacts:
    """Facts of the payload for cost models (see :func:`analyze`)."""
    return analyze(module.ir, config.entry)
