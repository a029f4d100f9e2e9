"""Build linalg ops (``linalg.fill``, ``linalg.matmul``, ``linalg.generic``) from core bindings.

The ``linalg`` dialect module of the Python bindings defines every named op through OpDSL on
import, which costs more than a tenth of a second; a workload that only needs a fill and a
matmul (and a command that only analyses it, such as ``tune --explain``) should not pay for
that. A named structured op is an ``operandSegmentSizes`` attribute and a body that the
dialect's C++ region builder knows how to fill, so it can be created generically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def named_structured_op(
    name: str,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    attributes: Mapping[str, Any] | None = None,
) -> Any:
    """A named linalg op ``name`` (say ``"linalg.matmul"``) reading ``inputs`` and
    accumulating into ``outputs``, with its body filled as its OpDSL definition says; returns
    its single result (on tensors) or the op (on buffers). ``attributes`` are the op's own
    (a convolution's ``strides``/``dilations``: set at creation, asking a result for its
    owner would import the ``linalg`` module). Needs an insertion point and a location, as
    every op builder does."""
    from stagegraph.mlir.bindings import ir, linalg_native

    result_types = [v.type for v in outputs if isinstance(v.type, ir.RankedTensorType)]
    segments = ir.DenseI32ArrayAttr.get([len(inputs), len(outputs)])
    op = ir.Operation.create(
        name,
        results=result_types,
        operands=[*inputs, *outputs],
        attributes={**(attributes or {}), "operandSegmentSizes": segments},
        regions=1,
    )
    linalg_native.fill_builtin_region(op)
    return op.results[0] if len(op.results) == 1 else op


def iterator_types_attr(kinds: Sequence[str], context: Any = None) -> Any:
    """The ``iterator_types`` attribute of a ``linalg.generic`` with these loop kinds
    (``"parallel"``/``"reduction"``).

    Built from its syntax, as the bindings' own ``IteratorTypeEnum`` builder does, but as one
    builtin array: building each element as a Python object makes the bindings import the
    ``linalg`` module to find its attribute class."""
    from stagegraph.mlir.bindings import ir

    kinds_text = ", ".join(f"#linalg.iterator_type<{kind}>" for kind in kinds)
    return ir.Attribute.parse(f"[{kinds_text}]", context=context)


def generic(
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    maps: Sequence[Any],
    kinds: Sequence[str],
    body: Callable[..., Any],
) -> Any:
    """A ``linalg.generic`` over ``inputs`` into ``outputs`` (``ir.AffineMap`` per operand,
    loop kinds as in :func:`iterator_types_attr`), whose body is ``body(*scalars)`` (one
    block argument per operand, returning the yielded value or values); returns its single
    result (on tensors) or the op."""
    from stagegraph.mlir.bindings import ir

    result_types = [v.type for v in outputs if isinstance(v.type, ir.RankedTensorType)]
    op = ir.Operation.create(
        "linalg.generic",
        results=result_types,
        operands=[*inputs, *outputs],
        attributes={
            "indexing_maps": ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            "iterator_types": iterator_types_attr(kinds),
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(inputs), len(outputs)]),
        },
        regions=1,
    )
    scalars = [ir.ShapedType(v.type).element_type for v in [*inputs, *outputs]]
    block = op.regions[0].blocks.append(*scalars)
    with ir.InsertionPoint(block):
        yielded = body(*block.arguments)
        values = list(yielded) if isinstance(yielded, (list, tuple)) else [yielded]
        ir.Operation.create("linalg.yield", operands=[_value(v) for v in values])
    return op.results[0] if len(op.results) == 1 else op


def _value(value: Any) -> Any:
    """An ``ir.Value`` from a value or a single-result op (what dialect builders return)."""
    from stagegraph.mlir.bindings import ir

    return value if isinstance(value, ir.Value) else value.result


def reassociation_attr(groups: Sequence[Sequence[int]]) -> Any:
    """The ``reassociation`` attribute of a ``tensor.collapse_shape``/``expand_shape``: which
    dims of the wider shape each dim of the narrower one joins (``[[0, 1], [2]]``)."""
    from stagegraph.mlir.bindings import ir

    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get(
        [ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in group]) for group in groups]
    )


def non_unit_groups(shape: list[int]) -> list[list[int]] | None:
    """Reassociation of ``shape`` onto its non-unit dims (each unit dim joins the group of
    the next non-unit one, trailing ones the last group); None when every dim is 1."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for d, size in enumerate(shape):
        pending.append(d)
        if size != 1:
            groups.append(pending)
            pending = []
    if not groups:
        return None
    groups[-1].extend(pending)
    return groups


def collapse_shape(value: Any, groups: Sequence[Sequence[int]], shape: Sequence[int]) -> Any:
    """``tensor.collapse_shape`` of ``value`` merging each group of dims (``groups``) into
    one, giving ``shape``."""
    from stagegraph.mlir.bindings import dialect, ir

    element = ir.RankedTensorType(value.type).element_type
    result = ir.RankedTensorType.get(list(shape), element)
    return dialect("tensor").CollapseShapeOp(result, value, reassociation_attr(groups)).result


def expand_shape(value: Any, groups: Sequence[Sequence[int]], shape: Sequence[int]) -> Any:
    """``tensor.expand_shape`` of ``value`` splitting each of its dims into a group of
    ``groups``, giving the static ``shape``."""
    from stagegraph.mlir.bindings import dialect, ir

    element = ir.RankedTensorType(value.type).element_type
    result = ir.RankedTensorType.get(list(shape), element)
    groups_attr = reassociation_attr(groups)
    return dialect("tensor").ExpandShapeOp(result, value, groups_attr, [], list(shape)).result


def transposed(value: Any, permutation: Sequence[int]) -> Any:
    """``linalg.transpose`` of the tensor ``value`` into a new empty tensor: result dim ``i``
    is ``value``'s dim ``permutation[i]``."""
    from stagegraph.mlir.bindings import dialect, ir

    source = ir.RankedTensorType(value.type)
    shape = [source.shape[p] for p in permutation]
    empty = dialect("tensor").EmptyOp(shape, source.element_type).result
    attributes = {"permutation": ir.DenseI64ArrayAttr.get(list(permutation))}
    return named_structured_op("linalg.transpose", [value], [empty], attributes)


def ir_location(payload: Any) -> Any:
    """An unknown location in ``payload``'s context: what rewrites that build ops outside any
    builder need entered (``with payload.context, ir_location(payload)``)."""
    from stagegraph.mlir.bindings import ir

    return ir.Location.unknown(payload.context)


def clone_mapped(op: Any, mapping: dict[Any, Any]) -> Any:
    """A clone of ``op`` at the current insertion point whose operands found in
    ``mapping`` are replaced by their values there; ``mapping`` then maps ``op``'s results to
    the clone's, so cloning a body op by op rewires each op to the clones before it (a
    region body moved into another loop, a generic's body rebuilt over new arguments)."""
    copy = op.clone()
    for k, operand in enumerate(copy.operands):
        if operand in mapping:
            copy.operands[k] = mapping[operand]
    for old, new in zip(op.results, copy.results, strict=True):
        mapping[old] = new
    return copy
