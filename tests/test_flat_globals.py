"""Constant globals flattened to one-dimensional LLVM arrays: same bytes, same results."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.bindings import ir, llvm, new_context
from stagegraph.mlir.resources import flat_bytes, has_blob, resource_values
from stagegraph.mlir.walk import children


def _resource(values: np.ndarray, name: str = "w") -> object:
    element = {
        np.float32: ir.F32Type.get(),
        np.float64: ir.F64Type.get(),
        np.int64: ir.IntegerType.get_signless(64),
        np.int8: ir.IntegerType.get_signless(8),
    }[values.dtype.type]
    tensor = ir.RankedTensorType.get(list(values.shape), element)
    return ir.DenseResourceElementsAttr.get_from_buffer(values, name, tensor)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int8])
def test_resource_values_reads_every_element_in_row_major_order(dtype: type) -> None:
    values = (np.arange(8 * 128 * 5) * 3 - 7).astype(dtype).reshape(8, 128, 5)
    with new_context(), ir.Location.unknown():
        read = resource_values(_resource(values))
    assert read is not None and read.dtype == dtype
    np.testing.assert_array_equal(read, values.reshape(-1))


def test_a_resource_without_its_blob_is_refused_not_read() -> None:
    # The C API getters dereference a missing blob: reading one would crash the process.
    text = """func.func @f() -> tensor<64x32xf32> {
      %c = arith.constant dense_resource<__elided__> : tensor<64x32xf32>
      return %c : tensor<64x32xf32>
    }"""
    with new_context():
        module = ir.Module.parse(text)
        constant = children(children(module.operation)[0])[0]
        attr = constant.attributes["value"]
        assert not has_blob(attr, 64 * 32 * 4)
        assert resource_values(attr) is None
        assert flat_bytes(attr, "flat") is None


def test_flat_bytes_keep_the_bytes_and_change_only_the_type() -> None:
    values = np.linspace(-1, 1, 32 * 48, dtype=np.float32).reshape(2, 16, 48)
    raw = values.reshape(-1).view(np.int8)
    with new_context(), ir.Location.unknown():
        flat = flat_bytes(_resource(values), "flat")
        assert ir.ShapedType(flat.type).shape == [values.nbytes]
        assert ir.ShapedType(flat.type).element_type == ir.IntegerType.get_signless(8)
        np.testing.assert_array_equal(resource_values(flat), raw)
        flat_dense = ir.DenseElementsAttr(flat_bytes(ir.DenseElementsAttr.get(values), "x"))
        np.testing.assert_array_equal(np.array(flat_dense), raw)
        assert flat_bytes(_resource(values.astype(np.float64)), "d") is not None
        # no C API getter (f16), a splat: left as they are
        assert flat_bytes(ir.DenseElementsAttr.get(values.astype(np.float16)), "h") is None
        assert flat_bytes(ir.DenseElementsAttr.get_splat(
            ir.RankedTensorType.get([2, 3], ir.F32Type.get()), ir.FloatAttr.get_f32(1.0)),
            "splat") is None  # fmt: skip


def _lowered_constant_function(attr: object) -> object:
    """A module whose ``@weights`` returns the constant ``attr``, lowered to LLVM."""
    from stagegraph.mlir.bindings import arith, func, passmanager
    from stagegraph.runtime.memref import record_signature
    from stagegraph.stages.common import lowering

    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("weights", ir.FunctionType.get([], [attr.type]))
        with ir.InsertionPoint(fn.add_entry_block()):
            func.ReturnOp([arith.ConstantOp(attr.type, attr).result])
    record_signature(module, "weights")
    pipeline = f"builtin.module({lowering.BUFFERIZE},{lowering.LOWER_TO_LLVM})"
    passmanager.PassManager.parse(pipeline).run(module.operation)
    return module


def _globals(module: object) -> list[object]:
    return [op for op in children(module.operation) if op.name == "llvm.mlir.global"]


@pytest.mark.parametrize("kind", ["resource", "dense"])
def test_flattened_global_gives_the_same_results(kind: str) -> None:
    from stagegraph.runtime.jit import jit
    from stagegraph.stages.common.flat_globals import flatten_constant_globals

    values = np.random.default_rng(0).standard_normal((4, 32, 5, 3)).astype(np.float32)
    with new_context(), ir.Location.unknown():
        attr = _resource(values) if kind == "resource" else ir.DenseElementsAttr.get(values)
        module = _lowered_constant_function(attr)
        (weight,) = _globals(module)
        before = llvm.ArrayType(ir.TypeAttr(weight.attributes["global_type"]).value)
        assert before.num_elements == 4 and isinstance(before.element_type, llvm.ArrayType)
        assert flatten_constant_globals(module) == 1
        module.operation.verify()
        after = llvm.ArrayType(ir.TypeAttr(weight.attributes["global_type"]).value)
        assert after.num_elements == values.nbytes
        assert after.element_type == ir.IntegerType.get_signless(8)
        assert ir.IntegerAttr(weight.attributes["alignment"]).value >= 4
        assert flatten_constant_globals(module) == 0  # one-dimensional already
        (result,) = jit(module, opt_level=0).call("weights", [])
    np.testing.assert_array_equal(result, values)


def test_small_resources_are_left_alone() -> None:
    # Below MIN_BYTES the blob test could not tell a missing blob from a present one.
    from stagegraph.mlir.resources import MIN_BYTES

    values = np.ones((4, MIN_BYTES // 32), np.float32)  # half of MIN_BYTES
    with new_context(), ir.Location.unknown():
        assert resource_values(_resource(values)) is None
        assert resource_values(_resource(np.ones((4, MIN_BYTES // 16), np.float32))) is not None


def test_globals_that_cannot_be_read_stay_nested() -> None:
    from stagegraph.stages.common.flat_globals import flatten_constant_globals

    with new_context(), ir.Location.unknown():
        splat = ir.DenseElementsAttr.get_splat(
            ir.RankedTensorType.get([3, 4], ir.F32Type.get()), ir.FloatAttr.get_f32(2.0)
        )
        module = _lowered_constant_function(splat)
        kept = [ir.TypeAttr(g.attributes["global_type"]).value for g in _globals(module)]
        assert flatten_constant_globals(module) == 0
        assert [ir.TypeAttr(g.attributes["global_type"]).value for g in _globals(module)] == kept


def test_x86_weights_are_flat_only_while_a_file_is_written() -> None:
    """The JIT gets large weights as buffers (stagegraph.mlir.jit_weights) and needs no flat
    globals: lowering leaves them nested; an object file's emission flattens every one it
    can read while it writes, and puts them back after."""
    from stagegraph.app.session import Session, SessionRequest
    from stagegraph.stages.common.flat_globals import flat_globals_while
    from tests.conftest import kernelbench_or_skip

    payload = next(kernelbench_or_skip("level2").glob("l2_009_*.mlir"))
    with Session(SessionRequest(graph="x86", workload=str(payload), threads=1)) as session:
        module = session.compile(until="lower").module.ir

    def nested() -> list[str]:
        found = []
        for weight in (g for g in _globals(module) if "value" in g.attributes):
            global_type = ir.TypeAttr(weight.attributes["global_type"]).value
            if isinstance(llvm.ArrayType(global_type).element_type, llvm.ArrayType):
                found.append(ir.StringAttr(weight.attributes["sym_name"]).value)
        return found

    before = nested()
    assert before
    with flat_globals_while(module) as changed:
        assert changed == len(before) and nested() == []
    assert nested() == before
