"""Passes a payload no longer makes: channels-last filter transposes folded at compile time,
transposes merged into their elementwise neighbours, convolution inits made in the output
tiles (``x86.generic.transpose_fusion``, labels/schedule) and concatenations written in
place by their producers (``stages.common.concat_in_place``). Values are checked against
numpy, structure through the bindings, pass counts on payloads with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.app.memory_passes import payload_memory_passes
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect

ID3 = "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"
PAR3 = '["parallel", "parallel", "parallel"]'


def _dense(values: np.ndarray, type_: str) -> str:
    text = np.array2string(values, separator=", ", floatmode="unique", threshold=10**7)
    return f"dense<{text}> : {type_}".replace("\n", "")


def test_a_constant_transpose_becomes_the_transposed_constant() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.x86.generic.transpose_fusion import fold_constant_transposes

    weight = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    text = (
        "func.func @main() -> tensor<4x2x3xf32> {\n"
        f"  %w = arith.constant {_dense(weight, 'tensor<2x3x4xf32>')}\n"
        "  %e = tensor.empty() : tensor<4x2x3xf32>\n"
        "  %t = linalg.transpose ins(%w : tensor<2x3x4xf32>) outs(%e : tensor<4x2x3xf32>) "
        "permutation = [2, 0, 1]\n  return %t : tensor<4x2x3xf32>\n}\n"
    )
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        assert fold_constant_transposes(entry_function(module)) == 1
    assert not collect(module, "linalg.transpose")
    (constant,) = collect(module, "arith.constant")
    np.testing.assert_array_equal(np.array(constant.attributes["value"]),
                                  np.transpose(weight, [2, 0, 1]))  # fmt: skip


def _conv_payload(relu_after: bool = True) -> str:
    """An NCHW convolution with a bias broadcast into its init and a ReLU, as torch-mlir
    imports ``Conv2d`` + ``ReLU`` (channels a multiple of a vector group)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    out = "tensor<1x16x38x38xf32>"
    lines = [
        f"func.func @main(%x: tensor<1x8x40x40xf32>) -> {out} {{",
        "  %zero = arith.constant 0.0 : f32",
        f"  %w = arith.constant {_dense(w, 'tensor<16x8x3x3xf32>')}",
        f"  %b = arith.constant {_dense(b, 'tensor<16xf32>')}",
        f"  %e = tensor.empty() : {out}",
        "  %init = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d1)>, "
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = "
        '["parallel", "parallel", "parallel", "parallel"]} '
        f"ins(%b : tensor<16xf32>) outs(%e : {out}) {{",
        "  ^bb0(%in: f32, %o: f32):\n    linalg.yield %in : f32",
        f"  }} -> {out}",
        "  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, "
        "strides = dense<1> : vector<2xi64>} ins(%x, %w : tensor<1x8x40x40xf32>, "
        f"tensor<16x8x3x3xf32>) outs(%init : {out}) -> {out}",
    ]
    result = "%c"
    if relu_after:
        lines += [
            "  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> "
            "(d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], "
            'iterator_types = ["parallel", "parallel", "parallel", "parallel"]} '
            f"ins(%c : {out}) outs(%e : {out}) {{",
            "  ^bb0(%in: f32, %o: f32):\n    %m = arith.maximumf %in, %zero : f32",
            f"    linalg.yield %m : f32\n  }} -> {out}",
        ]
        result = "%r"
    lines += [f"  return {result} : {out}", "}"]
    return "\n".join(lines), w, b


def _conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    windows = np.lib.stride_tricks.sliding_window_view(x[0], (3, 3), axis=(1, 2))
    y = np.einsum("chwij,fcij->fhw", windows, w)[None] + b[None, :, None, None]
    return np.maximum(y, 0)


def test_a_channels_last_convolution_makes_three_passes_and_verifies(tmp_path) -> None:
    """Input to channels-last (1), the convolution with its bias init made in its output
    tiles (1), the ReLU reading its channels-last result and writing NCHW (1). Before
    these rewrites the filter transpose, the bias broadcast with its transpose and the
    transpose back made 6."""
    text, w, b = _conv_payload()
    path = tmp_path / "conv.mlir"
    path.write_text(text)
    x = np.random.default_rng(1).standard_normal((1, 8, 40, 40)).astype(np.float32)
    np.savez(tmp_path / "conv.npz", in0=x, out0=_conv_reference(x, w, b).astype(np.float32))
    assert payload_memory_passes(str(path)).total == 3
    result = sg.run("x86", str(path), threads=1)
    assert result.verified is True, result.message


def _concat_payload() -> str:
    """Two elementwise branches and the input, concatenated along the channels."""
    part, whole = "tensor<32x28x28xf32>", "tensor<1x96x28x28xf32>"
    arg = "tensor<1x32x28x28xf32>"

    def branch(name: str, op: str) -> list[str]:
        return [
            f"  {name} = linalg.generic {{indexing_maps = [{ID3}, {ID3}], iterator_types = "
            f"{PAR3}}} ins(%x3 : {part}) outs(%e : {part}) {{",
            f"  ^bb0(%in: f32, %o: f32):\n    %v = {op} : f32\n    linalg.yield %v : f32",
            f"  }} -> {part}",
            f"  {name}4 = tensor.expand_shape {name} [[0, 1], [2], [3]] output_shape "
            f"[1, 32, 28, 28] : {part} into {arg}",
        ]

    return "\n".join([
        f"func.func @main(%x: {arg}) -> {whole} {{",
        "  %zero = arith.constant 0.0 : f32",
        f"  %x3 = tensor.collapse_shape %x [[0, 1], [2], [3]] : {arg} into {part}",
        f"  %e = tensor.empty() : {part}",
        *branch("%a", "arith.maximumf %in, %zero"),
        *branch("%n", "arith.negf %in"),
        f"  %c = tensor.concat dim(1) %a4, %n4, %x : ({arg}, {arg}, {arg}) -> {whole}",
        f"  return %c : {whole}",
        "}",
    ])  # fmt: skip


def test_concatenated_branches_write_their_slices_in_place(tmp_path) -> None:
    """Each branch writes its slice of the concatenation (1 pass each); only the input,
    a function argument, is copied (1). Copying every operand would make 5."""
    path = tmp_path / "cat.mlir"
    path.write_text(_concat_payload())
    x = np.random.default_rng(2).standard_normal((1, 32, 28, 28)).astype(np.float32)
    np.savez(tmp_path / "cat.npz", in0=x,
             out0=np.concatenate([np.maximum(x, 0), -x, x], axis=1))  # fmt: skip
    assert payload_memory_passes(str(path)).total == 3
    result = sg.run("x86", str(path), threads=1)
    assert result.verified is True, result.message


def test_a_concatenation_becomes_insertions_of_the_producers_results() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.concat_in_place import concatenations_in_place

    module = parse_payload(_concat_payload())
    with module.context, ir.Location.unknown():
        assert concatenations_in_place(module) == 1
    assert module.operation.verify()
    assert not collect(module, "tensor.concat")
    inserts = collect(module, "tensor.insert_slice")
    assert len(inserts) == 3
    # the branches are inserted without their unit-dim expansion (rank-reducing inserts)
    ranks = [ir.RankedTensorType(i.operands[0].type).rank for i in inserts]
    assert ranks == [3, 3, 4]


@pytest.mark.parametrize("relu_after", [True, False])
def test_convolution_values_with_and_without_an_epilogue(tmp_path, relu_after: bool) -> None:
    text, w, b = _conv_payload(relu_after)
    path = tmp_path / "conv.mlir"
    path.write_text(text)
    x = np.random.default_rng(3).standard_normal((1, 8, 40, 40)).astype(np.float32)
    expected = _conv_reference(x, w, b)
    if not relu_after:
        windows = np.lib.stride_tricks.sliding_window_view(x[0], (3, 3), axis=(1, 2))
        expected = np.einsum("chwij,fcij->fhw", windows, w)[None] + b[None, :, None, None]
    np.savez(tmp_path / "conv.npz", in0=x, out0=expected.astype(np.float32))
    result = sg.run("x86", str(path), threads=1)
    assert result.verified is True, result.message


def _relu_pad_pool_payload() -> str:
    """A ReLU, padded by one, then a 3x3 max pooling (stride 1), NCHW, as torch-mlir
    imports ``ReLU`` + ``MaxPool2d(3, 1, 1)``."""
    x, p, y = "tensor<1x16x40x40xf32>", "tensor<1x16x42x42xf32>", "tensor<1x16x40x40xf32>"
    id4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>"
    return "\n".join([
        f"func.func @main(%x: {x}) -> {y} {{",
        "  %zero = arith.constant 0.0 : f32",
        "  %ninf = arith.constant 0xFF800000 : f32",
        f"  %e = tensor.empty() : {x}",
        f"  %r = linalg.generic {{indexing_maps = [{id4}, {id4}], iterator_types = "
        '["parallel", "parallel", "parallel", "parallel"]} '
        f"ins(%x : {x}) outs(%e : {x}) {{",
        "  ^bb0(%in: f32, %o: f32):\n    %m = arith.maximumf %in, %zero : f32",
        f"    linalg.yield %m : f32\n  }} -> {x}",
        "  %p = tensor.pad %r low[0, 0, 1, 1] high[0, 0, 1, 1] {",
        "  ^bb0(%a: index, %b: index, %c: index, %d: index):",
        f"    tensor.yield %ninf : f32\n  }} : {x} to {p}",
        "  %w = tensor.empty() : tensor<3x3xf32>",
        f"  %o = tensor.empty() : {y}",
        f"  %f = linalg.fill ins(%ninf : f32) outs(%o : {y}) -> {y}",
        "  %pool = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, "
        f"strides = dense<1> : vector<2xi64>}} ins(%p, %w : {p}, tensor<3x3xf32>) "
        f"outs(%f : {y}) -> {y}",
        f"  return %pool : {y}",
        "}",
    ])  # fmt: skip


def test_a_padded_pooling_input_is_written_in_place(tmp_path) -> None:
    """The pad's fill (1), the ReLU writing into the padded buffer (1) and the pooling with
    its init made in its tiles (1). A pad copied after its producer, and a pooling init
    filled on its own, made 5."""
    path = tmp_path / "pool.mlir"
    path.write_text(_relu_pad_pool_payload())
    x = np.random.default_rng(4).standard_normal((1, 16, 40, 40)).astype(np.float32)
    padded = np.pad(np.maximum(x, 0), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    np.savez(tmp_path / "pool.npz", in0=x, out0=windows.max(axis=(-2, -1)).astype(np.float32))
    assert payload_memory_passes(str(path)).total == 3
    result = sg.run("x86", str(path), threads=1)
    assert result.verified is True, result.message
