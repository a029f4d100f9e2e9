"""Large constant globals reach the JIT as buffers (no LLVM copies), and files keep them."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.bindings import ir, llvm, new_context
from stagegraph.mlir.jit_weights import MIN_DETACHED_BYTES, weights_outside
from tests.test_flat_globals import _globals, _lowered_constant_function, _resource

#: A 4x64x32x3 f32 weight: 96 KiB, past MIN_DETACHED_BYTES, nested four deep.
SHAPE = (4, 64, 32, 3)


def _weights() -> np.ndarray:
    values = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    assert values.nbytes >= MIN_DETACHED_BYTES
    return values


def _attributes(op: object) -> dict[str, str]:
    return {name: str(op.attributes[name]) for name in op.attributes}


@pytest.mark.parametrize("kind", ["resource", "dense"])
def test_a_large_global_is_a_declaration_only_while_the_engine_is_built(kind: str) -> None:
    values = _weights()
    with new_context(), ir.Location.unknown():
        attr = _resource(values) if kind == "resource" else ir.DenseElementsAttr.get(values)
        module = _lowered_constant_function(attr)
        (weight,) = _globals(module)
        before = _attributes(weight)
        with weights_outside(module) as buffers:
            assert "value" not in weight.attributes  # an external declaration now
            assert str(weight.attributes["linkage"]) == "#llvm.linkage<external>"
            module.operation.verify()
            (name,) = buffers
            assert name == ir.StringAttr(weight.attributes["sym_name"]).value
            assert buffers[name].ctypes.data % 64 == 0
            np.testing.assert_array_equal(buffers[name].view(np.float32), values.reshape(-1))
        assert _attributes(weight) == before  # initializer, linkage and flags are back


@pytest.mark.parametrize("kind", ["resource", "dense"])
def test_the_jit_reads_its_weights_from_the_buffers(kind: str) -> None:
    from stagegraph.runtime.jit import jit

    values = _weights()
    with new_context(), ir.Location.unknown():
        attr = _resource(values) if kind == "resource" else ir.DenseElementsAttr.get(values)
        module = _lowered_constant_function(attr)
        binary = jit(module, opt_level=2)
        assert len(binary.weights) == 1  # handed over, not compiled in
        (result,) = binary.call("weights", [])
    np.testing.assert_array_equal(result, values)


def test_small_globals_stay_llvm_constants() -> None:
    from stagegraph.runtime.jit import jit

    values = np.arange(2 * 16 * 3, dtype=np.float32).reshape(2, 16, 3)  # 384 bytes
    with new_context(), ir.Location.unknown():
        module = _lowered_constant_function(ir.DenseElementsAttr.get(values))
        binary = jit(module, opt_level=0)
        assert binary.weights == {}
        (result,) = binary.call("weights", [])
    np.testing.assert_array_equal(result, values)


def test_a_shared_library_carries_its_weights_and_the_module_is_left_nested(tmp_path) -> None:
    """Files need the initializers: export flattens the globals while it writes (one LLVM
    constant per global) and puts them back after."""
    from stagegraph.stages.common.emit import exported_library
    from stagegraph.stages.common.export import export_module

    values = _weights()
    with new_context(), ir.Location.unknown():
        module = _lowered_constant_function(_resource(values))
        (weight,) = _globals(module)
        before = _attributes(weight)
        exported = export_module(module, symbol="weights_lib", entry="weights",
                                 library_path=tmp_path / "libweights.so")  # fmt: skip
        assert _attributes(weight) == before
        nested = llvm.ArrayType(ir.TypeAttr(weight.attributes["global_type"]).value)
        assert isinstance(nested.element_type, llvm.ArrayType)
    library = exported.files["library"]
    assert library.stat().st_size > values.nbytes  # the weights are in the file
    binary = exported_library(exported, library)
    (result,) = binary.call("weights", [])
    np.testing.assert_array_equal(result, values)
