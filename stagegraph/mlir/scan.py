"""``tm_tensor.scan`` (torch-mlir's cumulative sums/products) rewritten into upstream ops.

The bindings do not register the ``tm_tensor`` dialect, and its custom assembly does not
parse even with unregistered dialects allowed. The ``torch-mlir-opt`` tool shipped in the
torch-mlir wheel does register it: it reprints the payload in the generic form, which parses
as unregistered ops; each scan is then read through the bindings (operands, ``dimension``,
``inclusive``, its combiner region) and replaced by an ``scf.for`` over the scanned
dimension that carries the output and the accumulator (the input without that dimension):

    inclusive: acc = in[0]; out[0] = acc; for k in 1..n: acc = f(in[k], acc); out[k] = acc
    exclusive: acc = init;  for k in 0..n: out[k] = acc; acc = f(in[k], acc)

``f`` is a ``linalg.generic`` over the accumulator's shape, in place on it (``outs``), into
which the scan's region is moved (block argument 0 is the input element, 1 the accumulated
value, as in TMTensor's loop lowering). The scan's results are the output and the final accumulator.

Stepping the last dimension of a tensor reads a strided column per step (a gather, copied
element by element, nothing vectorized): such a scan whose combiner is one associative op
is built as vector code instead, each row scanned in contiguous chunks
(:mod:`stagegraph.mlir.scan_vector`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

SCAN, YIELD = "tm_tensor.scan", "tm_tensor.yield"
REWRITTEN = frozenset({SCAN, YIELD})
#: Off inside :func:`stepping_scans`: every scan takes the stepping form.
_VECTOR_SCANS: ContextVar[bool] = ContextVar("vector_scans", default=True)


@contextmanager
def stepping_scans() -> Iterator[None]:
    """Parse scans into the stepping form only (upstream linalg and scf, no vector ops): the
    payload handed to another compiler (IREE crashed on the vector form's ``scf.forall``
    of ``vector.transfer`` ops on tensors)."""
    token = _VECTOR_SCANS.set(False)
    try:
        yield
    finally:
        _VECTOR_SCANS.reset(token)


def torch_mlir_opt() -> Path | None:
    """The ``torch-mlir-opt`` tool of the torch-mlir wheel (None when not there)."""
    from stagegraph.mlir import bindings

    if bindings.ROOT != "torch_mlir":
        return None
    tool = Path(bindings.ir.__file__).parent / "_mlir_libs" / "torch-mlir-opt"
    return tool if tool.is_file() else None


def generic_form(text: str) -> str | None:
    """``text`` reprinted in the generic op form by torch-mlir-opt (None: it failed)."""
    tool = torch_mlir_opt()
    if tool is None:
        return None
    done = subprocess.run(
        [str(tool), "--mlir-print-op-generic", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout if done.returncode == 0 else None


def _walk(op: Any) -> list[Any]:
    found = []
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                found.append(child.operation)
                found.extend(_walk(child.operation))
    return found


def rewrite_scans(module: Any) -> int:
    """Replace every ``tm_tensor.scan`` of ``module``; returns how many there were."""
    from stagegraph.mlir.bindings import ir

    scans = [op for op in _walk(module.operation) if op.name == SCAN]
    with module.context, ir.Location.unknown():
        for op in scans:
            _rewrite(op)
    return len(scans)


def _static(values: list[int]) -> Any:
    from stagegraph.mlir.bindings import ir

    return ir.DenseI64ArrayAttr.get(values)


def _rewrite(op: Any) -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.scan_vector import try_vector_scan

    source, out_init, acc_init = list(op.operands)
    dim = ir.IntegerAttr(op.attributes["dimension"]).value
    if not (_VECTOR_SCANS.get() and try_vector_scan(op, source, acc_init, dim)):
        out, acc = _scan_loop(op, source, out_init, acc_init, dim)
        op.results[0].replace_all_uses_with(out)
        op.results[1].replace_all_uses_with(acc)
    op.erase()


def _scan_loop(op: Any, source: Any, out_init: Any, acc_init: Any, dim: int) -> tuple[Any, Any]:
    """The ``scf.for`` scanning ``source`` along ``dim`` with ``op``'s combiner moved into
    its step, inserted before ``op``; returns its (output, final accumulator)."""
    from stagegraph.mlir.bindings import arith, ir, linalg, scf, tensor

    inclusive = ir.BoolAttr(op.attributes["inclusive"]).value
    in_type = ir.RankedTensorType(source.type)
    out_type = ir.RankedTensorType(out_init.type)
    acc_type = ir.RankedTensorType(acc_init.type)
    shape, rank, n = list(in_type.shape), in_type.rank, in_type.shape[dim]
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    offsets = [dynamic if d == dim else 0 for d in range(rank)]
    sizes = [1 if d == dim else s for d, s in enumerate(shape)]
    slice_in_type = ir.RankedTensorType.get(list(acc_type.shape), in_type.element_type)
    if out_type.element_type != acc_type.element_type:
        raise ValueError("scan with output and accumulator element types differing")
    index = ir.IndexType.get()

    def extract(tensor_value: Any, position: Any, kind: Any) -> Any:
        return tensor.ExtractSliceOp(kind, tensor_value, [position], [], [], _static(offsets),
                                     _static(sizes), _static([1] * rank)).result  # fmt: skip

    def insert(value: Any, into: Any, position: Any) -> Any:
        return tensor.InsertSliceOp(value, into, [position], [], [], _static(offsets),
                                    _static(sizes), _static([1] * rank)).result  # fmt: skip

    def constant(value: int) -> Any:
        return arith.ConstantOp(index, ir.IntegerAttr.get(index, value)).result

    region_block = op.regions[0].blocks[0]
    identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(acc_type.rank))
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")

    ip = ir.InsertionPoint(op)
    with ip:
        zero, one, count = constant(0), constant(1), constant(n)
        if inclusive:
            acc0 = extract(source, zero, slice_in_type)
            if slice_in_type != acc_type:
                raise ValueError("inclusive scan with input and accumulator types differing")
            out0 = insert(acc0, out_init, zero)
            start = one
        else:
            acc0, out0, start = acc_init, out_init, zero
        loop = scf.ForOp(start, count, one, [out0, acc0])
    with ir.InsertionPoint(loop.body):
        k = loop.induction_variable
        out_k, acc_k = loop.inner_iter_args
        if not inclusive:
            out_k = insert(acc_k, out_k, k)
        element = extract(source, k, slice_in_type)
        # In place on the accumulator (outs), so bufferization keeps one buffer for it.
        generic = linalg.GenericOp(
            [acc_type], [element], [acc_k],
            ir.ArrayAttr.get([identity] * 2),
            ir.ArrayAttr.get([parallel] * acc_type.rank),
        )  # fmt: skip
        body = generic.regions[0].blocks.append(in_type.element_type, acc_type.element_type)
        region_args = list(region_block.arguments)
        region_args[0].replace_all_uses_with(body.arguments[0])
        region_args[1].replace_all_uses_with(body.arguments[1])
        for inner in list(region_block.operations):
            if inner.operation.name == YIELD:
                with ir.InsertionPoint(body):
                    linalg.YieldOp(list(inner.operation.operands))
                inner.operation.erase()
            else:
                body.append(inner.operation)
        acc_next = generic.result
        out_next = insert(acc_next, out_k, k) if inclusive else out_k
        scf.YieldOp([out_next, acc_next])
    return loop.results[0], loop.results[1]
