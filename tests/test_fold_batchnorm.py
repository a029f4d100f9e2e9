"""Eval-mode BatchNorm folded into the convolution's weights and bias
(``stages.common.fold_batchnorm``, run by ``x86.normalize``): the IR after the fold, the
values against numpy and eager PyTorch, and training-mode BatchNorm left alone."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect

C_IN, C_OUT, H = 3, 4, 6
X_T, W_T = f"tensor<1x{C_IN}x{H}x{H}xf32>", f"tensor<{C_OUT}x{C_IN}x3x3xf32>"
Y_T, V_T, B_T = (
    f"tensor<1x{C_OUT}x{H - 2}x{H - 2}xf32>",
    f"tensor<{C_OUT}xf32>",
    (f"tensor<{C_OUT}x1x1xf32>"),
)
MAP4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>"
CHANNEL = "affine_map<(d0, d1, d2, d3) -> (d1, 0, 0)>"
ONE_D = "affine_map<(d0) -> (d0)>"


def _dense(values: np.ndarray, type_: str) -> str:
    return (
        f"dense<{np.array2string(values, separator=', ', floatmode='unique', threshold=10**6)}>"
        f" : {type_}".replace("\n", "")
    )


def _parameters() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "weight": rng.standard_normal((C_OUT, C_IN, 3, 3)).astype(np.float32),
        "mean": rng.standard_normal(C_OUT).astype(np.float32),
        "var": (rng.random(C_OUT) + 0.5).astype(np.float32),
        "gamma": rng.standard_normal(C_OUT).astype(np.float32),
        "beta": rng.standard_normal(C_OUT).astype(np.float32),
    }


def _step(name: str, source: str, side: str, op: str) -> list[str]:
    """A per-channel step as torch-mlir imports one: ``source op side[c]``."""
    return [
        f"  {name} = linalg.generic {{indexing_maps = [{MAP4}, {CHANNEL}, {MAP4}], "
        'iterator_types = ["parallel", "parallel", "parallel", "parallel"]} '
        f"ins({source}, {side} : {Y_T}, {B_T}) outs(%e : {Y_T}) {{",
        "  ^bb0(%in: f32, %s: f32, %o: f32):",
        f"    %r = arith.{op} %in, %s : f32",
        "    linalg.yield %r : f32",
        f"  }} -> {Y_T}",
    ]


def _payload(p: dict[str, np.ndarray], relu: bool = True) -> str:
    """Conv, then eval BatchNorm as torch-mlir writes it (``1/sqrt(var + eps)`` computed
    from the constant running variance), then ReLU."""
    lines = [
        f"func.func @main(%x: {X_T}) -> {Y_T} {{",
        "  %zero = arith.constant 0.0 : f32",
        "  %one = arith.constant 1.0 : f32",
        "  %eps = arith.constant 1.0e-05 : f64",
        f"  %w = arith.constant {_dense(p['weight'], W_T)}",
        *(f"  %{k} = arith.constant {_dense(p[k], V_T)}" for k in ("mean", "var", "gamma", "beta")),
        f"  %e = tensor.empty() : {Y_T}",
        f"  %f = linalg.fill ins(%zero : f32) outs(%e : {Y_T}) -> {Y_T}",
        "  %conv = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, "
        f"strides = dense<1> : vector<2xi64>}} ins(%x, %w : {X_T}, {W_T}) outs(%f : {Y_T})"
        f" -> {Y_T}",
        f"  %e1 = tensor.empty() : {V_T}",
        f"  %ve = linalg.generic {{indexing_maps = [{ONE_D}, {ONE_D}], "
        f'iterator_types = ["parallel"]}} ins(%var : {V_T}) outs(%e1 : {V_T}) {{',
        "  ^bb0(%in: f32, %o: f32):",
        "    %t = arith.truncf %eps : f64 to f32",
        "    %a = arith.addf %in, %t : f32",
        "    %q = math.sqrt %a : f32",
        "    %nz = arith.cmpf one, %q, %zero : f32",
        '    cf.assert %nz, "zero"',
        "    %inv = arith.divf %one, %q : f32",
        "    linalg.yield %inv : f32",
        f"  }} -> {V_T}",
        *(
            f"  %{k}3 = tensor.expand_shape %{k} [[0, 1, 2]] output_shape [{C_OUT}, 1, 1] : "
            f"{V_T} into {B_T}"
            for k in ("mean", "ve", "gamma", "beta")
        ),
        *_step("%s1", "%conv", "%mean3", "subf"),
        *_step("%s2", "%s1", "%ve3", "mulf"),
        *_step("%s3", "%s2", "%gamma3", "mulf"),
        *_step("%s4", "%s3", "%beta3", "addf"),
    ]
    last = "%s4"
    if relu:
        lines += [
            f"  %y = linalg.generic {{indexing_maps = [{MAP4}, {MAP4}], iterator_types = "
            '["parallel", "parallel", "parallel", "parallel"]} '
            f"ins(%s4 : {Y_T}) outs(%e : {Y_T}) {{",
            "  ^bb0(%in: f32, %o: f32):",
            "    %r = arith.maximumf %in, %zero : f32",
            "    linalg.yield %r : f32",
            f"  }} -> {Y_T}",
        ]
        last = "%y"
    return "\n".join([*lines, f"  return {last} : {Y_T}", "}"])


def _reference(x: np.ndarray, p: dict[str, np.ndarray], relu: bool = True) -> np.ndarray:
    windows = np.lib.stride_tricks.sliding_window_view(x[0], (3, 3), axis=(1, 2))
    conv = np.einsum("chwij,fcij->fhw", windows, p["weight"])[None]
    scale = (p["gamma"] / np.sqrt(p["var"] + 1e-5))[None, :, None, None]
    y = (conv - p["mean"][None, :, None, None]) * scale + p["beta"][None, :, None, None]
    return np.maximum(y, 0) if relu else y


def test_the_chain_folds_into_the_weights_and_a_bias_init() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.fold_batchnorm import fold_channel_affine_chains

    p = _parameters()
    module = parse_payload(_payload(p))
    with module.context, ir.Location.unknown():
        assert fold_channel_affine_chains(module) == 1
    assert module.operation.verify()
    # No per-channel step remains: only the bias broadcast and the ReLU are generics.
    names = {op.name for g in collect(module, "linalg.generic") for op in collect(g)}
    assert not names & {"arith.subf", "arith.mulf", "arith.divf", "math.sqrt", "cf.assert"}
    assert len(collect(module, "linalg.generic")) == 2
    (conv,) = collect(module, "linalg.conv_2d_nchw_fchw")
    weight = np.array(conv.operands[1].owner.attributes["value"])
    scale = p["gamma"] / np.sqrt(p["var"] + np.float32(1e-5))
    np.testing.assert_allclose(weight, p["weight"] * scale[:, None, None, None], rtol=1e-5)
    (bias,) = [c for c in collect(module, "arith.constant")
               if isinstance(c.results[0].type, ir.RankedTensorType)
               and ir.RankedTensorType(c.results[0].type).shape == [C_OUT]]  # fmt: skip
    np.testing.assert_allclose(np.array(bias.attributes["value"]),
                               p["beta"] - p["mean"] * scale, rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("relu", [True, False])
def test_x86_runs_the_folded_conv_right(tmp_path, relu: bool) -> None:
    p = _parameters()
    x = np.random.default_rng(1).standard_normal((1, C_IN, H, H)).astype(np.float32)
    (tmp_path / "p.mlir").write_text(_payload(p, relu))
    np.savez(tmp_path / "p.npz", in0=x, out0=_reference(x, p, relu).astype(np.float32))
    result = sg.run("x86", str(tmp_path / "p.mlir"), threads=1)
    assert result.verified is True, result.message


def test_a_chain_on_values_computed_at_run_time_is_left_alone() -> None:
    """Training-mode BatchNorm subtracts the batch's mean, computed from the convolution's
    output: not a constant, so nothing folds."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.common.fold_batchnorm import fold_channel_affine_chains

    text = _payload(_parameters()).replace(
        "  %mean3 = tensor.expand_shape %mean",
        f"  %mean1 = tensor.extract_slice %conv[0, 0, 0, 0] [1, {C_OUT}, 1, 1] [1, 1, 1, 1]"
        f" : {Y_T} to tensor<1x{C_OUT}x1x1xf32>\n"
        f"  %mean3 = tensor.collapse_shape %mean1 [[0, 1], [2], [3]] : "
        f"tensor<1x{C_OUT}x1x1xf32> into {B_T}\n  %unused = tensor.expand_shape %mean",
    ).replace("%unused = tensor.expand_shape %mean [[0, 1, 2]] output_shape", "%unused = "
              "tensor.expand_shape %mean [[0, 1, 2]] output_shape")  # fmt: skip
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        assert fold_channel_affine_chains(module) == 0
    assert len(collect(module, "linalg.generic")) == 6


# ---------------------------------------------------------------- from PyTorch

MODELS = """
import torch
import torch.nn as nn


def _stats(model):
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g))
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.randn(c, generator=g))
            m.bias.data.copy_(torch.randn(c, generator=g))
    return model


def conv_bn_relu(train=False):
    model = _stats(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=True),
                                 nn.BatchNorm2d(8), nn.ReLU()))
    return (model if train else model.eval()), (torch.randn(2, 3, 9, 9),)


def conv_bn_relu_train():
    return conv_bn_relu(train=True)


def linear_bn():
    model = _stats(nn.Sequential(nn.Linear(16, 12), nn.BatchNorm1d(12), nn.Tanh()))
    return model.eval(), (torch.randn(5, 16),)
"""


@pytest.fixture
def models(tmp_path, monkeypatch) -> str:
    pytest.importorskip("torch")
    package = tmp_path / "sg_fold_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bn.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "sg_fold_models.bn"


@pytest.mark.parametrize("factory", ["conv_bn_relu", "linear_bn", "conv_bn_relu_train"])
def test_pytorch_models_verify_against_eager(models: str, factory: str) -> None:
    """Eval BatchNorm with non-trivial running statistics folds and matches eager PyTorch;
    training-mode BatchNorm (batch statistics, updated running buffers) stays and matches."""
    result = sg.run("x86", f"{models}:{factory}", threads=1)
    assert result.verified is True, result.message


def test_pytorch_eval_batchnorm_leaves_no_elementwise_step(models: str, tmp_path) -> None:
    """After x86.normalize the eval model's only generics are the bias broadcast and the
    ReLU; in training mode the BatchNorm's reductions and steps remain."""

    def generics(factory: str) -> int:
        dump = tmp_path / factory
        sg.run("x86", f"{models}:{factory}", threads=1, dump_ir=str(dump))
        (normalized,) = dump.glob("*-normalize.mlir")
        return len(collect(parse_payload(normalized.read_text()), "linalg.generic"))

    assert generics("conv_bn_relu") == 2
    assert generics("conv_bn_relu_train") > 4
