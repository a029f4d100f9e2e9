"""Strided transposed convolutions run as one convolution per output phase
(``x86.normalize``), checked against a direct numpy transposed convolution."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.conv.transposed import decompose_strided_transposed_convolutions

_CONV = {1: "conv_1d_ncw_fcw", 2: "conv_2d_nchw_fchw", 3: "conv_3d_ncdhw_fcdhw"}


def _shape(dims) -> str:
    return "x".join(str(d) for d in dims)


def _sizes(image, stride, kernel, dilation, pad, high):
    """Per spatial dim: the stuffed size (input at ``pad`` with ``stride``, ``high`` zeros
    after it) and the output size of the stride-1 convolution over it."""
    stuffed = [p + s * (i - 1) + 1 + h for i, s, p, h in zip(image, stride, pad, high, strict=True)]
    out = [size - d * (k - 1) for size, d, k in zip(stuffed, dilation, kernel, strict=True)]
    return stuffed, out


def _payload(n, c, f, image, stride, kernel, dilation, pad, high, init, zero="fill"):
    """@main(x, w, b): the convolution of ``x`` inserted with ``stride`` at ``pad`` into a
    zero tensor (``zero``: a fill of 0, a splat constant 0, or a fill of 1: not zero), on an
    init of zeros or the bias ``b`` (``init``: "zero"/"bias"), as PyTorch's ConvTranspose
    is imported."""
    rank = len(image)
    stuffed, out = _sizes(image, stride, kernel, dilation, pad, high)
    x, w, y = _shape([n, c, *image]), _shape([f, c, *kernel]), _shape([n, f, *out])
    z = _shape([n, c, *stuffed])
    if zero == "splat":
        zeros = f"%zeros = arith.constant dense<0.0> : tensor<{z}xf32>"
    else:
        value = "1.0" if zero == "ones" else "0.0"
        zeros = (
            f"%v = arith.constant {value} : f32\n"
            f"  %ez = tensor.empty() : tensor<{z}xf32>\n"
            f"  %zeros = linalg.fill ins(%v : f32) outs(%ez : tensor<{z}xf32>) -> tensor<{z}xf32>"
        )
    if init == "zero":
        start = (
            "%c0 = arith.constant 0.0 : f32\n"
            f"  %i = linalg.fill ins(%c0 : f32) outs(%e : tensor<{y}xf32>) -> tensor<{y}xf32>"
        )
    else:
        dims = ", ".join(str(d) for d in [0, *range(2, rank + 2)])
        start = (
            f"%i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>) "
            f"dimensions = [{dims}]"
        )
    offsets = ", ".join(str(v) for v in [0, 0, *pad])
    sizes = ", ".join(str(v) for v in [n, c, *image])
    steps = ", ".join(str(v) for v in [1, 1, *stride])
    dil = ", ".join(str(v) for v in dilation)
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  {zeros}
  %s = tensor.insert_slice %x into %zeros[{offsets}] [{sizes}] [{steps}]
    : tensor<{x}xf32> into tensor<{z}xf32>
  %e = tensor.empty() : tensor<{y}xf32>
  {start}
  %r = linalg.{_CONV[rank]}
    {{dilations = dense<[{dil}]> : vector<{rank}xi64>, strides = dense<1> : vector<{rank}xi64>}}
    ins(%s, %w : tensor<{z}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>)
    -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


def _reference(x, w, b, stride, kernel, dilation, pad, out, init) -> np.ndarray:
    """The transposed convolution computed directly: input ``i`` times tap ``k`` lands on
    output ``o = pad + stride*i - dilation*k`` (when that is an output), per spatial dim."""
    n, f = x.shape[0], w.shape[0]
    result = np.zeros((n, f, *out), dtype=np.float64)
    for taps in itertools.product(*(range(k) for k in kernel)):
        reads, writes = [], []
        for i_size, s, d, p, o_size, k in zip(
            x.shape[2:], stride, dilation, pad, out, taps, strict=True
        ):
            valid = [i for i in range(i_size) if 0 <= p + s * i - d * k < o_size]
            if not valid:
                break
            first, last = valid[0], valid[-1]
            reads.append(slice(first, last + 1))
            o = p + s * first - d * k
            writes.append(slice(o, o + s * (last - first) + 1, s))
        else:
            picked = x[(slice(None), slice(None), *reads)].astype(np.float64)
            tap = w[(slice(None), slice(None), *taps)].astype(np.float64)
            result[(slice(None), slice(None), *writes)] += np.einsum("nc...,fc->nf...", picked, tap)
    if init == "bias":
        result += b.reshape(1, f, *([1] * len(out)))
    return result.astype(np.float32)


def _phases_with_taps(image, stride, kernel, dilation, pad, out) -> int:
    """How many phase convolutions the rewrite should make, counted by brute force: phase
    (r per dim) has taps when some output of it meets an input at some tap."""
    per_dim = []
    for i_size, s, k_size, d, p, o_size in zip(
        image, stride, kernel, dilation, pad, out, strict=True
    ):
        live = 0
        for r in range(min(s, o_size)):
            hits = any(
                (o + d * k - p) % s == 0 and 0 <= (o + d * k - p) // s < i_size
                for o in range(r, o_size, s)
                for k in range(k_size)
            )
            live += hits
        per_dim.append(live)
    return math.prod(per_dim)


def _rewritten(text: str) -> tuple[int, list[str], int]:
    """Rewrite count, the linalg ops left, and how many convolutions (named or generic)
    read a tensor made by a strided ``tensor.insert_slice``."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        count = decompose_strided_transposed_convolutions(module)
        assert module.operation.verify()
        names = [op.name for op in collect(module.operation, lambda op: "linalg." in op.name)]
        stuffed_reads = 0
        readers = collect(
            module.operation,
            lambda op: op.name.startswith("linalg.conv") or op.name == "linalg.generic",
        )
        for op in readers:
            source = op.operands[0].owner
            if isinstance(source, ir.OpView) and source.operation.name == "tensor.insert_slice":
                steps = list(ir.DenseI64ArrayAttr(source.operation.attributes["static_strides"]))
                stuffed_reads += any(s != 1 for s in steps)
    return count, names, stuffed_reads


# (image, stride, kernel, dilation, pad, high): per spatial dim.
_CASES = {
    "2d_s2_k3": ((5, 4), (2, 2), (3, 3), (1, 1), (2, 2), (1, 0)),
    "2d_s2_k4": ((4, 4), (2, 2), (4, 4), (1, 1), (2, 2), (0, 0)),
    "2d_asymmetric": ((4, 5), (2, 3), (3, 2), (1, 2), (1, 3), (0, 1)),
    "2d_s2_d2_half_empty": ((4, 4), (2, 2), (3, 3), (2, 2), (1, 1), (1, 1)),
    "2d_s5_d2": ((3, 4), (5, 5), (3, 3), (2, 2), (3, 3), (0, 0)),
    "2d_s3_k2_empty_phase": ((4, 3), (3, 3), (2, 2), (1, 1), (1, 1), (1, 2)),
    "2d_pad0_one_stride": ((4, 5), (2, 1), (3, 3), (1, 1), (0, 2), (2, 2)),
    "1d_s2_d2": ((7,), (2,), (3,), (2,), (3,), (0,)),
    "1d_s3_k4": ((5,), (3,), (4,), (1,), (0,), (3,)),
    "3d_s2": ((3, 2, 4), (2, 2, 2), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 0)),
    "3d_mixed": ((2, 3, 3), (1, 2, 3), (2, 3, 2), (1, 2, 1), (1, 2, 1), (0, 0, 1)),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_one_convolution_per_phase_with_taps_none_reads_the_stuffed_tensor(case):
    image, stride, kernel, dilation, pad, high = _CASES[case]
    _, out = _sizes(image, stride, kernel, dilation, pad, high)
    text = _payload(2, 3, 4, image, stride, kernel, dilation, pad, high, init="bias")
    count, names, stuffed_reads = _rewritten(text)
    assert count == 1 and stuffed_reads == 0
    convs = [name for name in names if name.startswith("linalg.conv")]
    assert len(convs) == _phases_with_taps(image, stride, kernel, dilation, pad, out)


@pytest.mark.parametrize(
    ("case", "init"),
    [
        ("2d_s2_k3", "zero"),
        ("2d_s2_k4", "bias"),
        ("2d_asymmetric", "bias"),
        ("2d_s2_d2_half_empty", "zero"),
        ("2d_s2_d2_half_empty", "bias"),
        ("2d_s5_d2", "bias"),
        ("2d_s3_k2_empty_phase", "bias"),
        ("2d_pad0_one_stride", "zero"),
        ("1d_s2_d2", "bias"),
        ("1d_s3_k4", "zero"),
        ("3d_s2", "bias"),
        ("3d_mixed", "zero"),
    ],
)
def test_phases_run_on_x86_and_match_a_direct_transposed_convolution(tmp_path, case, init):
    """Odd channel counts (3 in, 5 out); phases without taps must keep the init (zeros or
    the bias). The IR after ``x86.normalize`` shows the rewrite ran in the pipeline."""
    image, stride, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 2, 3, 5
    _, out = _sizes(image, stride, kernel, dilation, pad, high)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, *kernel), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    path = tmp_path / "tc.mlir"
    path.write_text(_payload(n, c, f, image, stride, kernel, dilation, pad, high, init))
    expected = _reference(x, w, b, stride, kernel, dilation, pad, out, init)
    np.savez(tmp_path / "tc.npz", in0=x, in1=w, in2=b, out0=expected)
    dumped = tmp_path / "ir"
    report = sg.run("x86", str(path), threads=1, dump_ir=str(dumped))
    assert report.verified is True, report
    normalized = [p for p in dumped.iterdir() if "normalize" in p.name]
    assert len(normalized) == 1, sorted(p.name for p in dumped.iterdir())
    with new_context():
        module = ir.Module.parse(normalized[0].read_text())
        convs = collect(module.operation, lambda op: op.name.startswith("linalg.conv"))
        matmuls = collect(module.operation, lambda op: "matmul" in op.name)
        phases = _phases_with_taps(image, stride, kernel, dilation, pad, out)
        assert len(convs) + len(matmuls) == phases  # one-tap phases become matmuls


def test_the_reference_is_a_transposed_convolution():
    """The numpy reference agrees with the stride-1 convolution of the stuffed input."""
    image, stride, kernel, dilation, pad, high = _CASES["2d_asymmetric"]
    stuffed_shape, out = _sizes(image, stride, kernel, dilation, pad, high)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, *image))
    w = rng.standard_normal((3, 2, *kernel))
    stuffed = np.zeros((1, 2, *stuffed_shape))
    stuffed[:, :, pad[0] :: stride[0], pad[1] :: stride[1]][:, :, : image[0], : image[1]] = x
    direct = np.zeros((1, 3, *out))
    for a, bb in itertools.product(range(kernel[0]), range(kernel[1])):
        window = stuffed[
            :,
            :,
            a * dilation[0] : a * dilation[0] + out[0],
            bb * dilation[1] : bb * dilation[1] + out[1],
        ]
        direct += np.einsum("nchw,fc->nfhw", window, w[:, :, a, bb])
    reference = _reference(x, w, None, stride, kernel, dilation, pad, out, "zero")
    np.testing.assert_allclose(reference, direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("zero", ["splat", "fill"])
def test_a_splat_zero_constant_is_a_zero_tensor_too(zero):
    text = _payload(1, 2, 3, (4, 4), (2, 2), (3, 3), (1, 1), (2, 2), (0, 0), "zero", zero)
    assert _rewritten(text)[0] == 1


def test_left_alone_when_the_inserted_into_tensor_is_not_zero():
    text = _payload(1, 2, 3, (4, 4), (2, 2), (3, 3), (1, 1), (2, 2), (0, 0), "zero", "ones")
    count, _, stuffed_reads = _rewritten(text)
    assert count == 0 and stuffed_reads == 1


def test_left_alone_when_the_stuffed_tensor_has_another_reader():
    text = _payload(1, 2, 3, (4, 4), (2, 2), (3, 3), (1, 1), (2, 2), (0, 0), "zero")
    stuffed = "tensor<1x2x9x9xf32>"
    text = text.replace(
        "  return %r : tensor<1x3x7x7xf32>\n}",
        f"  return %r, %s : tensor<1x3x7x7xf32>, {stuffed}\n}}",
    ).replace("-> tensor<1x3x7x7xf32> {", f"-> (tensor<1x3x7x7xf32>, {stuffed}) {{")
    count, _, stuffed_reads = _rewritten(text)
    assert count == 0 and stuffed_reads == 1


def test_left_alone_at_unit_strides():
    """Stride 1 (a plain padded convolution): no inserted zeros to skip."""
    text = _payload(1, 2, 3, (4, 4), (1, 1), (3, 3), (1, 1), (2, 2), (0, 0), "bias")
    count, names, _ = _rewritten(text)
    assert count == 0 and names.count("linalg.conv_2d_nchw_fchw") == 1


def _grouped_payload(n, g, c, f, image, stride, kernel, dilation, pad, high, init):
    """@main(x, w, b): the grouped 2-D form (``linalg.conv_2d_ngchw_gfchw``): the stuffed
    tensor's channels split into ``g`` groups by a ``tensor.expand_shape``, as PyTorch's
    grouped ConvTranspose2d is imported; ``w`` is ``g x f x c x kh x kw``, ``b`` ``g*f``."""
    stuffed, out = _sizes(image, stride, kernel, dilation, pad, high)
    x, z = _shape([n, g * c, *image]), _shape([n, g * c, *stuffed])
    zg, w = _shape([n, g, c, *stuffed]), _shape([g, f, c, *kernel])
    y, yg = _shape([n, g * f, *out]), _shape([n, g, f, *out])
    if init == "zero":
        start = f"%i = linalg.fill ins(%v : f32) outs(%eg : tensor<{yg}xf32>) -> tensor<{yg}xf32>"
    else:
        start = (
            f"%bg = tensor.expand_shape %b [[0, 1]] output_shape [{g}, {f}]"
            f" : tensor<{g * f}xf32> into tensor<{g}x{f}xf32>\n"
            f"  %i = linalg.broadcast ins(%bg : tensor<{g}x{f}xf32>)"
            f" outs(%eg : tensor<{yg}xf32>) dimensions = [0, 3, 4]"
        )
    offsets = ", ".join(str(v) for v in [0, 0, *pad])
    sizes = ", ".join(str(v) for v in [n, g * c, *image])
    steps = ", ".join(str(v) for v in [1, 1, *stride])
    dil = ", ".join(str(v) for v in dilation)
    return f"""
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{g * f}xf32>)
    -> tensor<{y}xf32> {{
  %v = arith.constant 0.0 : f32
  %ez = tensor.empty() : tensor<{z}xf32>
  %zeros = linalg.fill ins(%v : f32) outs(%ez : tensor<{z}xf32>) -> tensor<{z}xf32>
  %s = tensor.insert_slice %x into %zeros[{offsets}] [{sizes}] [{steps}]
    : tensor<{x}xf32> into tensor<{z}xf32>
  %sg = tensor.expand_shape %s [[0], [1, 2], [3], [4]]
    output_shape [{n}, {g}, {c}, {stuffed[0]}, {stuffed[1]}] : tensor<{z}xf32> into tensor<{zg}xf32>
  %e = tensor.empty() : tensor<{y}xf32>
  %eg = tensor.expand_shape %e [[0], [1, 2], [3], [4]]
    output_shape [{n}, {g}, {f}, {out[0]}, {out[1]}] : tensor<{y}xf32> into tensor<{yg}xf32>
  {start}
  %r = linalg.conv_2d_ngchw_gfchw
    {{dilations = dense<[{dil}]> : vector<2xi64>, strides = dense<1> : vector<2xi64>}}
    ins(%sg, %w : tensor<{zg}xf32>, tensor<{w}xf32>) outs(%i : tensor<{yg}xf32>)
    -> tensor<{yg}xf32>
  %c = tensor.collapse_shape %r [[0], [1, 2], [3], [4]] : tensor<{yg}xf32> into tensor<{y}xf32>
  return %c : tensor<{y}xf32>
}}
"""


@pytest.mark.parametrize(
    ("case", "init"),
    [("2d_asymmetric", "zero"), ("2d_s2_d2_half_empty", "bias"), ("2d_s3_k2_empty_phase", "bias")],
)
def test_grouped_phases_match_per_group_transposed_convolutions(tmp_path, case, init):
    """Grouped: the phases read the original input with its channels split the same way;
    checked against one direct transposed convolution per group."""
    image, stride, kernel, dilation, pad, high = _CASES[case]
    n, g, c, f = 2, 3, 2, 3
    _, out = _sizes(image, stride, kernel, dilation, pad, high)
    text = _grouped_payload(n, g, c, f, image, stride, kernel, dilation, pad, high, init)
    count, names, _ = _rewritten(text)
    phases = _phases_with_taps(image, stride, kernel, dilation, pad, out)
    assert count == 1 and names.count("linalg.conv_2d_ngchw_gfchw") == phases
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, g * c, *image), dtype=np.float32)
    w = rng.standard_normal((g, f, c, *kernel), dtype=np.float32)
    b = rng.standard_normal(g * f, dtype=np.float32)
    expected = np.concatenate(
        [
            _reference(
                x[:, i * c : (i + 1) * c], w[i], b[i * f : (i + 1) * f],
                stride, kernel, dilation, pad, out, init,
            )
            for i in range(g)
        ],
        axis=1,
    )  # fmt: skip
    path = tmp_path / "tcg.mlir"
    path.write_text(text)
    np.savez(tmp_path / "tcg.npz", in0=x, in1=w, in2=b, out0=expected)
    report = sg.run("x86", str(path), threads=1)
    assert report.verified is True, report


def _generic_payload(n, c, f, image, stride, kernel, dilation, pad, high, out_stride=1):
    """@main(x, w, b): the 2-D convolution as a ``linalg.generic`` (grouped 3-D ones are
    imported so), its accumulation written ``out + product``; ``out_stride`` > 1 makes it
    a strided convolution, which the rewrite does not take."""
    stuffed, out = _sizes(image, stride, kernel, dilation, pad, high)
    if out_stride != 1:
        out = [(size - d * (k - 1) - 1) // out_stride + 1
               for size, d, k in zip(stuffed, dilation, kernel, strict=True)]  # fmt: skip
    x, z = _shape([n, c, *image]), _shape([n, c, *stuffed])
    w, y = _shape([f, c, *kernel]), _shape([n, f, *out])
    rows = f"d2 * {out_stride}" if out_stride != 1 else "d2"
    offsets = ", ".join(str(v) for v in [0, 0, *pad])
    sizes = ", ".join(str(v) for v in [n, c, *image])
    steps = ", ".join(str(v) for v in [1, 1, *stride])
    return f"""
#image = affine_map<(d0, d1, d2, d3, d4, d5, d6)
    -> (d0, d4, {rows} + d5 * {dilation[0]}, d3 + d6 * {dilation[1]})>
#kernel = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d1, d4, d5, d6)>
#out = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d3)>
func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{f}xf32>)
    -> tensor<{y}xf32> {{
  %v = arith.constant 0.0 : f32
  %ez = tensor.empty() : tensor<{z}xf32>
  %zeros = linalg.fill ins(%v : f32) outs(%ez : tensor<{z}xf32>) -> tensor<{z}xf32>
  %s = tensor.insert_slice %x into %zeros[{offsets}] [{sizes}] [{steps}]
    : tensor<{x}xf32> into tensor<{z}xf32>
  %e = tensor.empty() : tensor<{y}xf32>
  %i = linalg.broadcast ins(%b : tensor<{f}xf32>) outs(%e : tensor<{y}xf32>) dimensions = [0, 2, 3]
  %r = linalg.generic {{indexing_maps = [#image, #kernel, #out], iterator_types = ["parallel",
      "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}}
      ins(%s, %w : tensor<{z}xf32>, tensor<{w}xf32>) outs(%i : tensor<{y}xf32>) {{
  ^bb0(%a: f32, %k: f32, %acc: f32):
    %m = arith.mulf %k, %a : f32
    %t = arith.addf %acc, %m : f32
    linalg.yield %t : f32
  }} -> tensor<{y}xf32>
  return %r : tensor<{y}xf32>
}}
"""


@pytest.mark.parametrize("case", ["2d_asymmetric", "2d_s2_d2_half_empty", "2d_s5_d2"])
def test_generic_convolution_phases_match_a_direct_transposed_convolution(tmp_path, case):
    """A ``linalg.generic`` convolution splits into generic phases (same loops and body,
    the image read at the phase's dilation)."""
    image, stride, kernel, dilation, pad, high = _CASES[case]
    n, c, f = 2, 3, 4
    _, out = _sizes(image, stride, kernel, dilation, pad, high)
    text = _generic_payload(n, c, f, image, stride, kernel, dilation, pad, high)
    count, names, stuffed_reads = _rewritten(text)
    phases = _phases_with_taps(image, stride, kernel, dilation, pad, out)
    assert count == 1 and stuffed_reads == 0 and names.count("linalg.generic") == phases
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, c, *image), dtype=np.float32)
    w = rng.standard_normal((f, c, *kernel), dtype=np.float32)
    b = rng.standard_normal(f, dtype=np.float32)
    path = tmp_path / "tcgen.mlir"
    path.write_text(text)
    expected = _reference(x, w, b, stride, kernel, dilation, pad, out, "bias")
    np.savez(tmp_path / "tcgen.npz", in0=x, in1=w, in2=b, out0=expected)
    report = sg.run("x86", str(path), threads=1)
    assert report.verified is True, report


def test_left_alone_when_the_generic_convolution_is_strided():
    image, stride, kernel, dilation, pad, high = _CASES["2d_s2_k3"]
    text = _generic_payload(1, 2, 3, image, stride, kernel, dilation, pad, high, out_stride=2)
    count, names, stuffed_reads = _rewritten(text)
    assert count == 0 and stuffed_reads == 1 and names.count("linalg.generic") == 1


def test_phase_arithmetic_matches_the_stuffed_convolution_in_one_dim():
    """The per-dim phase plan (which taps, which input window) reproduces the stride-1
    convolution of the stuffed input, over many sizes, strides, dilations and paddings
    (including paddings that push whole taps off the input)."""
    from stagegraph.stages.x86.conv.transposed import _dim_phases

    rng = np.random.default_rng(5)
    for _ in range(400):
        size, s, kernel, d = (int(v) for v in rng.integers(1, [7, 6, 6, 4]))
        pad, high = (int(v) for v in rng.integers(0, [2 * s + d * kernel, 2 * s + 3]))
        stuffed = pad + s * (size - 1) + 1 + high
        out = stuffed - d * (kernel - 1)
        if out < 1:
            continue
        x, w = rng.standard_normal(size), rng.standard_normal(kernel)
        zero_stuffed = np.zeros(stuffed)
        zero_stuffed[pad : pad + s * (size - 1) + 1 : s] = x
        direct = np.array(
            [sum(zero_stuffed[o + d * k] * w[k] for k in range(kernel)) for o in range(out)]
        )
        phased = np.zeros(out)
        for phase in _dim_phases(size, pad, s, kernel, d, out):
            for q, m in itertools.product(range(phase.count), range(phase.taps)):
                i = phase.start + phase.dilation * m + q
                if 0 <= i < size:
                    phased[phase.r + s * q] += x[i] * w[phase.first + phase.step * m]
        np.testing.assert_allclose(
            phased, direct, atol=1e-12, err_msg=str((size, s, kernel, d, pad))
        )


def test_left_alone_with_a_dynamic_batch():
    text = """
func.func @main(%x: tensor<?x2x4x4xf32>, %w: tensor<3x2x3x3xf32>) -> tensor<?x3x7x7xf32> {
  %v = arith.constant 0.0 : f32
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x2x4x4xf32>
  %ez = tensor.empty(%n) : tensor<?x2x9x9xf32>
  %zeros = linalg.fill ins(%v : f32) outs(%ez : tensor<?x2x9x9xf32>) -> tensor<?x2x9x9xf32>
  %s = tensor.insert_slice %x into %zeros[0, 0, 2, 2] [%n, 2, 4, 4] [1, 1, 2, 2]
    : tensor<?x2x4x4xf32> into tensor<?x2x9x9xf32>
  %e = tensor.empty(%n) : tensor<?x3x7x7xf32>
  %i = linalg.fill ins(%v : f32) outs(%e : tensor<?x3x7x7xf32>) -> tensor<?x3x7x7xf32>
  %r = linalg.conv_2d_nchw_fchw
    {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
    ins(%s, %w : tensor<?x2x9x9xf32>, tensor<3x2x3x3xf32>) outs(%i : tensor<?x3x7x7xf32>)
    -> tensor<?x3x7x7xf32>
  return %r : tensor<?x3x7x7xf32>
}
"""
    count, _, stuffed_reads = _rewritten(text)
    assert count == 0 and stuffed_reads == 1
