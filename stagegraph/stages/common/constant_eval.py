"""Values computed from constants only, evaluated at compile time with numpy.

A frozen PyTorch import computes some tensors from constants alone: eval-mode BatchNorm's
``1 / sqrt(running_var + eps)`` is three ``linalg.generic`` ops on the running variance, a
constant. A rewrite that folds such values into a convolution's weights (see
:mod:`stagegraph.stages.common.fold_batchnorm`) needs their numbers. :class:`ConstantValues`
answers, for a value, whether it is such a tensor (:meth:`ConstantValues.leaves`: the
``arith.constant`` ops it derives from) and, once those leaves are loaded (one compiled
probe for all ``dense_resource`` blobs, which the bindings cannot read), its array
(:meth:`ConstantValues.value`).

Evaluated: ``arith.constant``, ``tensor.empty`` (as an unread init), ``tensor.expand_shape``
/ ``collapse_shape``, ``linalg.fill``, ``linalg.transpose``, ``linalg.broadcast`` and all-parallel
``linalg.generic`` ops whose inputs are read through dims or constant 0s and whose body uses
the float arithmetic below. Anything else is not a constant here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stagegraph.mlir.walk import children

_BINARY = {
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
    "arith.divf": np.divide, "arith.maximumf": np.maximum, "arith.minimumf": np.minimum,
    "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin,
}  # fmt: skip
_UNARY = {
    "arith.negf": np.negative, "math.sqrt": np.sqrt, "math.absf": np.abs,
    "math.rsqrt": lambda x: np.reciprocal(np.sqrt(x)), "math.exp": np.exp,
}  # fmt: skip
_CMPF = {
    "oeq": np.equal, "one": np.not_equal, "ogt": np.greater, "oge": np.greater_equal,
    "olt": np.less, "ole": np.less_equal, "ueq": np.equal, "une": np.not_equal,
    "ugt": np.greater, "uge": np.greater_equal, "ult": np.less, "ule": np.less_equal,
}  # fmt: skip
#: ``arith.cmpf`` predicate numbers, as the attribute stores them.
_PREDICATES = ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord",
               "ueq", "ugt", "uge", "ult", "ule", "une", "uno", "true"]  # fmt: skip
_BODY_OPS = {*_BINARY, *_UNARY, "arith.truncf", "arith.extf", "arith.constant",
             "arith.cmpf", "arith.select", "cf.assert", "linalg.yield"}  # fmt: skip


_STRUCTURAL = frozenset({"tensor.expand_shape", "tensor.collapse_shape", "linalg.fill",
                         "linalg.transpose", "linalg.broadcast", "linalg.generic"})  # fmt: skip


class NotConstantError(ValueError):
    """A value this evaluator cannot compute at compile time (internal to the rewrites)."""


def numpy_dtype(element: Any) -> Any:
    """The numpy dtype of an MLIR float type (f32 or f64); ``NotConstantError`` else."""
    from stagegraph.mlir.bindings import ir

    if isinstance(element, ir.F32Type):
        return np.float32
    if isinstance(element, ir.F64Type):
        return np.float64
    raise NotConstantError(f"element type {element}")


def _key(op: Any) -> Any:
    return getattr(op, "operation", op)


def _owner(value: Any) -> Any | None:
    from stagegraph.mlir.bindings import ir

    owner = value.owner
    return None if isinstance(owner, ir.Block) else _key(owner)


class ConstantValues:
    """Evaluates constant-derived tensors of one module (see the module doc)."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self._values: dict[Any, np.ndarray] = {}
        self._loaded: dict[Any, np.ndarray] = {}

    def leaves(self, value: Any) -> list[Any] | None:
        """The ``arith.constant`` ops ``value`` is computed from, or ``None`` if it is not
        computed from constants alone (an argument, an op this evaluator cannot take)."""
        op = _owner(value)
        if op is None:
            return None
        if op.name == "arith.constant":
            return [op]
        if op.name == "tensor.empty":
            return []
        if op.name not in _STRUCTURAL:
            return None
        if op.name == "linalg.generic" and not evaluable_generic(op):
            return None
        found: list[Any] = []
        for operand in op.operands:
            more = self.leaves(operand)
            if more is None:
                return None
            found.extend(more)
        if op.name in ("linalg.generic", "linalg.broadcast"):
            for inner in _body_ops(op) if op.name == "linalg.generic" else []:
                for operand in inner.operands:
                    outside = _owner(operand)
                    if outside is not None and not _inside(outside, op):
                        more = self.leaves(operand)
                        if more is None:
                            return None
                        found.extend(more)
        return found

    def load(self, constants: list[Any]) -> None:
        """Read ``constants`` (``arith.constant`` ops): dense ones directly, the
        ``dense_resource`` ones through one compiled probe."""
        from stagegraph.mlir.bindings import ir
        from stagegraph.stages.common.constant_gathers import evaluate_constants

        pending = []
        for op in constants:
            if op in self._loaded:
                continue
            attr = op.attributes["value"]
            if isinstance(attr, ir.DenseElementsAttr):
                shape = ir.ShapedType(attr.type).shape
                dtype = numpy_dtype(ir.ShapedType(attr.type).element_type)
                if attr.is_splat:
                    self._loaded[op] = np.full(shape, _scalar(attr.get_splat_value()), dtype)
                else:
                    self._loaded[op] = np.array(attr).astype(dtype).reshape(shape)
            elif isinstance(attr, ir.FloatAttr):
                self._loaded[op] = np.array(attr.value, dtype=numpy_dtype(attr.type))
            elif isinstance(attr, ir.IntegerAttr):
                self._loaded[op] = np.array(attr.value)
            else:
                pending.append(op)
        if pending:
            for op, array in zip(pending, evaluate_constants(self._module, pending), strict=True):
                self._loaded[op] = np.asarray(array)

    def value(self, value: Any) -> np.ndarray:
        """The array of ``value`` (its leaves loaded first, see :meth:`load`)."""
        if value in self._values:
            return self._values[value]
        op = _owner(value)
        if op is None:
            raise NotConstantError("a block argument")
        if op.name == "arith.constant":
            array = self._loaded[op]
        elif op.name == "tensor.empty":
            array = np.zeros(_shape(value), numpy_dtype(_element(value)))
        elif op.name in ("tensor.expand_shape", "tensor.collapse_shape"):
            array = self.value(op.operands[0]).reshape(_shape(value))
        elif op.name == "linalg.fill":
            array = np.full(_shape(value), self.value(op.operands[0]),
                            numpy_dtype(_element(value)))  # fmt: skip
        elif op.name == "linalg.transpose":
            array = np.transpose(self.value(op.operands[0]), _i64_array(op, "permutation"))
        elif op.name == "linalg.broadcast":
            added = np.expand_dims(self.value(op.operands[0]), _i64_array(op, "dimensions"))
            array = np.broadcast_to(added, _shape(value)).copy()
        else:
            array = self._generic(op)
        self._values[value] = array
        return array

    def _generic(self, op: Any) -> np.ndarray:
        from stagegraph.mlir.bindings import ir

        maps = [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]
        inputs = int(next(iter(op.attributes["operandSegmentSizes"])))
        out = op.operands[inputs]
        loop_shape = _shape(out)  # the output's map is the identity (checked)
        block = op.regions[0].blocks[0]
        env: dict[Any, np.ndarray] = {}
        for position, argument in enumerate(list(block.arguments)[:inputs]):
            env[argument] = _broadcast(self.value(op.operands[position]), maps[position],
                                       loop_shape)  # fmt: skip
        for inner in _body_ops(op):
            if inner.name == "linalg.yield":
                result = self._read(inner.operands[0], env)
                return np.broadcast_to(result, loop_shape).astype(
                    numpy_dtype(_element(out)), copy=True
                )
            env_value = self._compute(inner, [self._read(v, env) for v in inner.operands])
            if env_value is not None:
                env[inner.results[0]] = env_value
        raise NotConstantError("a generic without yield")

    def _read(self, value: Any, env: dict[Any, np.ndarray]) -> np.ndarray:
        if value in env:
            return env[value]
        return self.value(value)

    @staticmethod
    def _compute(op: Any, args: list[np.ndarray]) -> np.ndarray | None:
        from stagegraph.mlir.bindings import ir

        name = op.name
        if name in _BINARY:
            with np.errstate(all="ignore"):
                return _BINARY[name](args[0], args[1])
        if name in _UNARY:
            with np.errstate(all="ignore"):
                return _UNARY[name](args[0])
        if name in ("arith.truncf", "arith.extf"):
            return np.asarray(args[0]).astype(numpy_dtype(op.results[0].type))
        if name == "arith.cmpf":
            predicate = _PREDICATES[ir.IntegerAttr(op.attributes["predicate"]).value]
            if predicate not in _CMPF:
                raise NotConstantError(f"cmpf {predicate}")
            return _CMPF[predicate](args[0], args[1])
        if name == "arith.select":
            return np.where(args[0], args[1], args[2])
        if name == "cf.assert":
            if not np.all(args[0]):
                raise NotConstantError("an assertion that fails on the constants")
            return None
        raise NotConstantError(name)


def _scalar(attr: Any) -> float:
    from stagegraph.mlir.bindings import ir

    if isinstance(attr, ir.FloatAttr):
        return attr.value
    return ir.IntegerAttr(attr).value


def _shape(value: Any) -> list[int]:
    from stagegraph.mlir.bindings import ir

    return list(ir.ShapedType(value.type).shape)


def _element(value: Any) -> Any:
    from stagegraph.mlir.bindings import ir

    return ir.ShapedType(value.type).element_type


def _i64_array(op: Any, name: str) -> list[int]:
    from stagegraph.mlir.bindings import ir

    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _body_ops(op: Any) -> list[Any]:
    return children(op)


def _inside(candidate: Any, op: Any) -> bool:
    parent = candidate.parent
    while parent is not None:
        if _key(parent) == op:
            return True
        parent = parent.parent
    return False


def evaluable_generic(op: Any) -> bool:
    """All-parallel, one result written through the identity map, inputs read through dims
    or constants only, a body of the ops :class:`ConstantValues` computes."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.build import iterator_types_attr

    if len(op.results) != 1 or not isinstance(op.results[0].type, ir.RankedTensorType):
        return False
    declared = op.attributes["iterator_types"]
    if declared != iterator_types_attr(["parallel"] * len(ir.ArrayAttr(declared)), op.context):
        return False
    maps = [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]
    if maps[-1] != ir.AffineMap.get_identity(maps[-1].n_dims):
        return False
    for mapping in maps[:-1]:
        for expr in mapping.results:
            if not isinstance(expr, ir.AffineDimExpr | ir.AffineConstantExpr):
                return False
    block = op.regions[0].blocks[0]
    if list(block.arguments[len(maps) - 1].uses):
        return False  # reads its init
    return all(inner.name in _BODY_OPS for inner in _body_ops(op))


def _broadcast(array: np.ndarray, mapping: Any, loop_shape: list[int]) -> np.ndarray:
    """``array`` read through ``mapping`` (dims and constants), as an array over the loop
    space (broadcast along the loops it does not read)."""
    from stagegraph.mlir.bindings import ir

    index: list[Any] = []
    dims: list[int] = []
    for expr in mapping.results:
        if isinstance(expr, ir.AffineConstantExpr):
            index.append(ir.AffineConstantExpr(expr).value)
        else:
            index.append(slice(None))
            dims.append(ir.AffineDimExpr(expr).position)
    picked = array[tuple(index)] if index else array
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    picked = np.transpose(picked, order) if dims else picked
    shape = [loop_shape[d] if d in dims else 1 for d in range(len(loop_shape))]
    return np.broadcast_to(np.reshape(picked, shape), loop_shape)
