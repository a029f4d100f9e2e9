"""Facts of single IR objects: types, functions and linalg ops (classification, loop ranges,
contraction and convolution dimensions, flops), and the matmul-like layers with their
epilogues, read through the bindings."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from stagegraph.errors import UnsupportedPayloadError
from stagegraph.mlir.build import iterator_types_attr
from stagegraph.mlir.functions import function_name, visibility
from stagegraph.mlir.walk import DefUse, children
from stagegraph.stages.analysis.facts import (
    SUPPORTED_DTYPES,
    ContractionFacts,
    ConvolutionFacts,
    FunctionFacts,
    IteratorType,
    LayerFacts,
    OpClass,
    OpFacts,
    ValueFacts,
)

#: Body ops that combine a reduction's partial results associatively (a single combiner
#: is what the vectorizer turns into ``vector.multi_reduction`` and what upstream's partial-
#: reduction tiling finds a neutral element for): the one list every target's schedule uses.
REDUCTION_COMBINERS = frozenset(
    f"arith.{n}"
    for n in (
        *("addf", "mulf", "maximumf", "minimumf", "maxnumf", "minnumf", "addi", "muli"),
        *("maxsi", "minsi", "maxui", "minui", "andi", "ori", "xori"),
    )
)

#: The named linalg contractions (the one list: the x86 matmul schedule takes a subset).
CONTRACTION_OPS = frozenset(
    f"linalg.{name}"
    for name in [
        "matmul",
        "matmul_transpose_a",
        "matmul_transpose_b",
        "batch_matmul",
        "batch_matmul_transpose_a",
        "batch_matmul_transpose_b",
        "batch_reduce_matmul",
        "matvec",
        "vecmat",
        "batch_matvec",
        "batch_vecmat",
        "mmt4d",
        "batch_mmt4d",
        "contract",
        "quantized_matmul",
        "quantized_batch_matmul",
    ]
)
# Body ops that move or convert data without arithmetic (not counted as flops).
_NOT_FLOPS = frozenset(
    {"linalg.yield", "linalg.index", "arith.constant", "arith.index_cast", "arith.bitcast"}
    | {f"arith.{c}" for c in ("extf", "truncf", "extsi", "extui", "trunci", "sitofp", "uitofp")}
    | {f"arith.{c}" for c in ("fptosi", "fptoui", "index_castui")}
    | {"tensor.extract"}  # a gather: a load, not arithmetic
)


# --------------------------------------------------------------------------- types


#: Facts of the types seen so far, by printed type and strictness: an unrolled network's
#: 20,000 operands have a handful of types, and building the facts (a validated model)
#: was a quarter of the analysis. Facts are frozen, so sharing them is safe.
_VALUE_FACTS: dict[tuple[str, bool], ValueFacts] = {}


def value_facts(t: Any, where: str, strict: bool = True) -> ValueFacts:
    """Facts of a type; with ``strict``, dynamic shapes and unsupported dtypes raise.

    Raises:
        UnsupportedPayloadError: ``where`` (e.g. "payload function @main argument 0") has a
            dynamic or unranked shape or an unsupported element type.
    """
    key = (str(t), strict)
    found = _VALUE_FACTS.get(key)
    if found is None:
        found = _value_facts(t, where, strict)  # raises before anything is remembered
        if len(_VALUE_FACTS) < 4096:
            _VALUE_FACTS[key] = found
    return found


def _value_facts(t: Any, where: str, strict: bool) -> ValueFacts:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.types import element_name

    kind: Literal["tensor", "memref", "scalar", "other"] = "scalar"
    shape: tuple[int, ...] = ()
    element = t
    if isinstance(t, ir.ShapedType | ir.UnrankedTensorType | ir.UnrankedMemRefType):
        if isinstance(t, ir.MemRefType | ir.UnrankedMemRefType):
            kind = "memref"
        elif isinstance(t, ir.RankedTensorType | ir.UnrankedTensorType):
            kind = "tensor"
        else:
            kind = "other"  # vectors
        if not isinstance(t, ir.ShapedType) or not t.has_rank:
            if strict:
                raise UnsupportedPayloadError(
                    f"{where} has unranked type {t}; stagegraph needs static shapes"
                )
            return ValueFacts(kind=kind, dtype=str(t.element_type), type=str(t))
        shape = tuple(-1 if ir.ShapedType.is_dynamic_size(s) else s for s in t.shape)
        if strict and -1 in shape:
            raise UnsupportedPayloadError(
                f"{where} has dynamic shape {t}; stagegraph needs static shapes"
            )
        element = t.element_type
    elif not isinstance(t, ir.IntegerType | ir.FloatType | ir.IndexType):
        kind = "other"
    dtype = element_name(element)
    if strict and dtype not in SUPPORTED_DTYPES:
        raise UnsupportedPayloadError(
            f"{where} has unsupported element type {element} in {t}; stagegraph supports "
            + ", ".join(sorted(SUPPORTED_DTYPES))
        )
    return ValueFacts(kind=kind, shape=shape, dtype=dtype or str(element), type=str(t))


# --------------------------------------------------------------------------- functions


def function_facts(fn: Any, strict: bool) -> FunctionFacts:
    fn_type = fn.attributes["function_type"].value
    where = f"payload function @{function_name(fn)}"
    return FunctionFacts(
        name=function_name(fn),
        visibility=visibility(fn),
        has_body=len(fn.regions[0].blocks) > 0,
        arguments=tuple(
            value_facts(t, f"{where} argument {i}", strict) for i, t in enumerate(fn_type.inputs)
        ),
        results=tuple(
            value_facts(t, f"{where} result {i}", strict) for i, t in enumerate(fn_type.results)
        ),
    )


# --------------------------------------------------------------------------- linalg ops


def linalg_ops(fn: Any) -> list[Any]:
    """Linalg ops (not their region terminators) of a function, in program order."""
    from stagegraph.mlir.walk import collect

    return collect(fn, is_linalg_op)


def is_linalg_op(op: Any) -> bool:
    """A linalg operation proper (not a region terminator or index op)."""
    return op.name.startswith("linalg.") and op.name not in ("linalg.yield", "linalg.index")


def _operands(op: Any) -> tuple[list[Any], list[Any]]:
    """Inputs and inits (outputs) of a destination-style op: the segment sizes when the op
    has them, else one init per result (``linalg.transpose``, ``linalg.map``, ...)."""
    operands = list(op.operands)
    if "operandSegmentSizes" in op.attributes:
        n_out = int(list(op.attributes["operandSegmentSizes"])[-1])
    else:
        n_out = min(len(op.results) or 1, len(operands))
    return operands[: len(operands) - n_out], operands[len(operands) - n_out :]


def _maps(op: Any) -> list[Any]:
    from stagegraph.mlir.bindings import ir, linalg_native

    attr = linalg_native.get_indexing_maps(op)
    return [] if attr is None else [ir.AffineMapAttr(a).value for a in attr]


def _dim_positions(amap: Any) -> list[int | None]:
    """For each result of an affine map, its loop position if it is a bare ``d_i``."""
    from stagegraph.mlir.bindings import ir

    return [e.position if isinstance(e, ir.AffineDimExpr) else None for e in amap.results]


def _loop_ranges(op: Any, maps: list[Any], operands: list[Any], where: str) -> tuple[int, ...]:
    """Static size of every loop: the operand dimension that a bare ``d_i`` indexes."""
    from stagegraph.mlir.bindings import ir

    if not maps:
        return ()
    ranges: list[int | None] = [None] * maps[0].n_dims
    for amap, value in zip(maps, operands, strict=False):
        if not isinstance(value.type, ir.ShapedType):
            continue
        for axis, pos in enumerate(_dim_positions(amap)):
            if pos is not None and ranges[pos] is None:
                ranges[pos] = value.type.shape[axis]
    if None in ranges:
        raise UnsupportedPayloadError(f"{where}: cannot infer the static range of every loop")
    return tuple(r for r in ranges if r is not None)


def _iterator_types(op: Any, maps: list[Any], n_outputs: int) -> tuple[IteratorType, ...]:
    """From the ``iterator_types`` attribute, else (named ops): a loop is parallel iff the
    outputs index it."""

    if not maps:
        return ()
    in_outputs = {p for amap in maps[len(maps) - n_outputs :] for p in _dim_positions(amap)}
    implied = tuple("parallel" if d in in_outputs else "reduction" for d in range(maps[0].n_dims))
    if "iterator_types" not in op.attributes:
        return implied
    # The declared kinds are almost always the implied ones: compare the whole attribute (no
    # element is read, see declared_iterator_types) and read it element-wise only if not.
    if op.attributes["iterator_types"] == iterator_types_attr(implied, op.context):
        return implied
    return declared_iterator_types(op)


def declared_iterator_types(op: Any) -> tuple[IteratorType, ...]:
    """The ``iterator_types`` attribute of a ``linalg.generic``, read through the bindings.

    Reading an element of the attribute makes the bindings import the ``linalg`` dialect's
    Python module to find its attribute class (a tenth of a second of OpDSL definitions), so
    the analysis calls this only when comparing the whole attribute is not enough."""
    from stagegraph.mlir.bindings import ir, linalg_enums

    parallel = ir.AttrBuilder.get("linalg.IteratorTypeEnum")(
        linalg_enums.IteratorType.parallel, op.context
    )
    return tuple(
        "parallel" if attr == parallel else "reduction" for attr in op.attributes["iterator_types"]
    )


def _body(op: Any) -> list[Any]:
    if not op.regions or not op.regions[0].blocks:
        return []
    return children(op)


def _producer(value: Any, def_use: DefUse | None) -> str:
    from stagegraph.mlir.bindings import ir

    if isinstance(value, ir.BlockArgument):
        return f"%arg{value.arg_number}"
    owner = def_use.owner(value) if def_use is not None else None
    return (owner if owner is not None else value.owner.operation).name


def _contraction(op: Any, maps: list[Any], ranges: tuple[int, ...]) -> ContractionFacts | None:
    """batch/m/n/k of a contraction, from the maps of A, B and the accumulator."""
    from stagegraph.mlir.bindings import linalg_native

    if len(maps) < 3:
        return None
    dims = linalg_native.infer_contraction_dimensions_from_maps([maps[0], maps[1], maps[-1]])
    if dims is None or not list(dims.k):
        return None
    groups = {g: tuple(getattr(dims, g)) for g in ("batch", "m", "n", "k")}

    def size(group: str) -> int:
        return math.prod(ranges[d] for d in groups[group])

    a_last, b_last = _dim_positions(maps[0])[-1:], _dim_positions(maps[1])[-1:]
    return ContractionFacts(
        batch=size("batch"),
        m=size("m"),
        n=size("n"),
        k=size("k"),
        batch_dims=groups["batch"],
        m_dims=groups["m"],
        n_dims=groups["n"],
        k_dims=groups["k"],
        transpose_a=bool(groups["m"]) and bool(a_last) and a_last[0] in groups["m"],
        transpose_b=bool(groups["n"]) and bool(b_last) and b_last[0] in groups["k"],
    )


def _convolution(op: Any) -> ConvolutionFacts | None:
    from stagegraph.mlir.bindings import linalg_native

    dims = linalg_native.infer_convolution_dimensions(op)
    if dims is None:
        return None
    return ConvolutionFacts(**{f: tuple(getattr(dims, f)) for f in ConvolutionFacts.model_fields})


def _ignores_an_input(op: Any, n_inputs: int) -> bool:
    """True when the body never reads some input (a pooling op's window-shape operand)."""
    block = op.regions[0].blocks[0] if op.regions and op.regions[0].blocks else None
    if block is None:
        return False
    return any(
        not list(block.arguments[i].uses) for i in range(min(n_inputs, len(block.arguments)))
    )


def _is_contraction(op: Any) -> bool:
    """A named matmul-like op, or any op (``linalg.generic``) that the contraction interface
    recognises: two inputs, projected-permutation maps, a reduction loop, a mul-add body."""
    from stagegraph.mlir.bindings import linalg_native

    return op.name in CONTRACTION_OPS or bool(linalg_native.isa_contraction_op(op))


def classify(
    op: Any,
    iterators: Sequence[IteratorType],
    contraction: ContractionFacts | None,
    n_inputs: int,
    has_maps: bool = True,
) -> OpClass:
    """The class of a linalg op, from its name, interfaces, maps and body."""
    from stagegraph.mlir.bindings import linalg_native

    name = op.name
    if _is_contraction(op):
        # A contraction with neither m nor n (a dot product) is a plain reduction.
        if contraction is None or contraction.m_dims or contraction.n_dims:
            return "matmul"
        return "reduction"
    if name.startswith("linalg.pooling_"):
        return "pooling"
    if name.startswith(("linalg.conv_", "linalg.depthwise_conv_")):
        return "convolution"
    if linalg_native.isa_convolution_op(op):
        return "pooling" if _ignores_an_input(op, n_inputs) else "convolution"
    if name == "linalg.softmax" or "reduction" in iterators:
        return "reduction"
    if has_maps:  # all loops parallel, or none at all (an op on 0-d tensors)
        return "elementwise"
    return "other"


def _flops(op_class: OpClass, ranges: tuple[int, ...] | None, body_ops: Iterable[str]) -> int:
    """Per point of the iteration space: 2 for contractions and convolutions, else one per
    arithmetic body op (copies, fills and transposes count 0). Unknown space: 0."""
    if ranges is None:
        return 0
    points = math.prod(ranges)
    if op_class in ("matmul", "convolution"):
        return 2 * points
    return points * sum(1 for name in body_ops if name not in _NOT_FLOPS)


def op_facts(op: Any, index: int, where: str, def_use: DefUse | None = None) -> OpFacts:
    """Facts of one linalg op (``where`` names its function, for errors; ``def_use`` of that
    function, when the caller has it, names producers without building op classes)."""
    inputs, outputs = _operands(op)
    where = f"{where} op {op.name} (#{index})"
    in_facts = tuple(value_facts(v.type, f"{where} input {i}") for i, v in enumerate(inputs))
    out_facts = tuple(value_facts(v.type, f"{where} output {i}") for i, v in enumerate(outputs))
    maps = _maps(op)
    ranges = _loop_ranges(op, maps, inputs + outputs, where)
    iterators = _iterator_types(op, maps, len(outputs))
    body = [o.name for o in _body(op)]
    contraction = _contraction(op, maps, ranges) if _is_contraction(op) else None
    op_class = classify(op, iterators, contraction, len(inputs), has_maps=bool(maps))
    conv = _convolution(op) if op_class in ("convolution", "pooling") else None
    return OpFacts(
        index=index,
        name=op.name,
        op_class=op_class,
        inputs=in_facts,
        outputs=out_facts,
        producers=tuple(_producer(v, def_use) for v in inputs + outputs),
        indexing_maps=tuple(str(m) for m in maps),
        iterator_types=iterators,
        loop_ranges=ranges,
        body_ops=tuple(n for n in body if n != "linalg.yield"),
        operand_dims=tuple(tuple(-1 if d is None else d for d in _dim_positions(m)) for m in maps),
        flops=_flops(op_class, ranges if maps else None, body),
        contraction=contraction if op_class == "matmul" else None,
        convolution=conv,
        window_reads=any(not m.is_projected_permutation for m in maps[: len(inputs)]),
    )


def producer_ops(op: Any, position: dict[Any, int]) -> tuple[int, ...]:
    """Per operand of ``op`` (inputs, then outputs): the index of the op whose result it is
    (``position``: each analysed op's index; ``ir.Operation`` hashes by identity, so a
    20 000-op recurrent payload looks each one up in constant time), or -1 (an argument, a
    constant, a reshape, ...)."""
    from stagegraph.mlir.bindings import ir

    inputs, outputs = _operands(op)
    found = []
    for value in inputs + outputs:
        if isinstance(value, ir.BlockArgument):
            found.append(-1)
            continue
        found.append(position.get(value.owner.operation, -1))
    return tuple(found)


# --------------------------------------------------------------------------- layers


def layers_of(ops: list[Any], facts: list[OpFacts], def_use: DefUse) -> list[LayerFacts]:
    """Each matmul-like op with its single-use chain of same-shape elementwise consumers
    (``def_use``: of the function holding ``ops``)."""
    position = {op: i for i, op in enumerate(ops)}  # ir.Operation hashes by identity
    layers = []
    for op, fact in zip(ops, facts, strict=True):
        if fact.op_class != "matmul" or fact.contraction is None or not op.results:
            continue
        epilogue: list[int] = []
        cast = None
        start = def_use.owner(op.operands[len(op.operands) - 1])
        only = start is not None and len(start.results) == 1 and def_use.users(
            start.results[0]) == [op]  # fmt: skip
        init = position.get(start) if only else None
        current = op
        while len(current.results) == 1:
            users = def_use.users(current.results[0])
            # (one user, perhaps reading it in several inputs: a merged elementwise chain)
            if not users or any(other != users[0] for other in users):
                break
            user = users[0]
            index = position.get(user)
            if index is None or facts[index].op_class != "elementwise":
                break
            if facts[index].outputs[:1] != fact.outputs[:1]:
                same_shape = [v.shape for v in facts[index].outputs[:1]] == [
                    v.shape for v in fact.outputs[:1]]  # fmt: skip
                cast = index if same_shape else None
                break
            epilogue.append(index)
            current = user
        c = fact.contraction
        layers.append(
            LayerFacts(
                contraction=fact.index,
                epilogue=tuple(epilogue),
                cast=cast,
                init=init,
                epilogue_ops=tuple(
                    name for i in epilogue for name in facts[i].body_ops if name not in _NOT_FLOPS
                ),
                batch=c.batch,
                m=c.m,
                n=c.n,
                k=c.k,
            )
        )
    return layers
