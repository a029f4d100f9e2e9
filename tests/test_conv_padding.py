"""A padded NCHW convolution that goes channels-last transposes its input before padding it
(``generic/transpose_fusion.transposes_before_padding``): the transpose reads the unpadded
image and writes it in place into the filled, padded channels-last buffer; no NCHW pad is
made and transposed."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.diagnostics import parse_payload
from tests.test_generic_schedule import _conv3d_reference, _jit, _op_names


def _padded_conv(
    n: int, c: int, f: int, hw: tuple[int, int], kernel: tuple[int, int],
    pad: tuple[int, int], dilations: tuple[int, int],
) -> tuple[str, tuple]:  # fmt: skip
    """A zero-padded ``conv_2d_nchw_fchw`` payload (the form PyTorch's padding imports as)
    and its (input, filter) shapes."""
    padded = (hw[0] + 2 * pad[0], hw[1] + 2 * pad[1])
    out = [p - d * (k - 1) for p, d, k in zip(padded, dilations, kernel, strict=True)]
    x, w = (n, c, *hw), (f, c, *kernel)
    tx, tp, tw, to = (
        f"tensor<{'x'.join(map(str, s))}xf32>" for s in (x, (n, c, *padded), w, (n, f, *out))
    )
    text = f"""
func.func @main(%x: {tx}, %w: {tw}) -> {to} {{
  %z = arith.constant 0.0 : f32
  %p = tensor.pad %x low[0, 0, {pad[0]}, {pad[1]}] high[0, 0, {pad[0]}, {pad[1]}] {{
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %z : f32
  }} : {tx} to {tp}
  %e = tensor.empty() : {to}
  %f = linalg.fill ins(%z : f32) outs(%e : {to}) -> {to}
  %r = linalg.conv_2d_nchw_fchw {{dilations = dense<{list(dilations)}> : vector<2xi64>,
      strides = dense<1> : vector<2xi64>}} ins(%p, %w : {tp}, {tw}) outs(%f : {to}) -> {to}
  return %r : {to}
}}
"""
    return text, (x, w)


def test_the_image_is_transposed_then_inserted_into_the_padded_buffer() -> None:
    """No ``tensor.pad`` is left; the image's transpose reads the function's argument and
    its result is inserted into a filled tensor of the padded channels-last shape."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.generic.prepare import prepare

    text, _ = _padded_conv(2, 16, 16, (8, 12), (3, 5), (1, 2), (1, 1))
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        prepare(module, entry_function(module, "main"))
        assert module.operation.verify()
    assert "tensor.pad" not in _op_names(module)
    image_transposes = [
        op for op in collect(module, "linalg.transpose")
        if isinstance(op.operands[0], ir.BlockArgument) and op.operands[0].arg_number == 0
    ]  # fmt: skip
    assert len(image_transposes) == 1
    (use,) = [u.owner for u in image_transposes[0].results[0].uses]
    assert use.name == "tensor.insert_slice"
    assert ir.RankedTensorType(use.results[0].type).shape == [2, 8 + 2, 12 + 4, 16]
    assert use.operands[1].owner.name == "linalg.fill"


def test_padded_dilated_convolution_matches_the_definition() -> None:
    """Values: the padded, dilated convolution against numpy (padding and dilation as in
    KernelBench's l1_080, at a small size)."""
    text, (x_shape, w_shape) = _padded_conv(2, 16, 32, (8, 16), (5, 9), (2, 4), (2, 3))
    rng = np.random.default_rng(11)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (4, 4)))
    expected = _conv3d_reference(padded[:, :, None], w[:, :, None], (1, 1, 1), (1, 2, 3))
    (out,) = _jit(text).call("main", [x, w])
    np.testing.assert_allclose(out, expected[:, :, 0], rtol=1e-4, atol=1e-4)
