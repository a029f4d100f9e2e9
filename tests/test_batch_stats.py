"""A norm's batch statistics in one pass (``stages.x86.generic.batch_stats``, run by
``x86.normalize``): the IR after the rewrite, the f64 variance against numpy where the
textbook one-pass formula would lose it, and training-mode BatchNorm from PyTorch with
fewer passes over memory and the same values as eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.mlir.walk import collect

N, C, H = 4, 3, 8
COUNT = N * H * H  # elements per channel
X_T, X64_T = f"tensor<{N}x{C}x{H}x{H}xf32>", f"tensor<{N}x{C}x{H}x{H}xf64>"
G_T, G64_T = f"tensor<1x{C}x1x1xf32>", f"tensor<1x{C}x1x1xf64>"
MAP4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>"
GROUP = "affine_map<(d0, d1, d2, d3) -> (0, d1, 0, 0)>"
PARALLEL = '["parallel", "parallel", "parallel", "parallel"]'
PER_CHANNEL = '["reduction", "parallel", "reduction", "reduction"]'


def _generic(name: str, ins: list[tuple[str, str, str]], out: tuple[str, str, str],
             kinds: str, body: list[str]) -> list[str]:  # fmt: skip
    """A ``linalg.generic`` line by line: ``ins``/``out`` are (value, type, map)."""
    maps = ", ".join(m for _, _, m in [*ins, out])
    values = ", ".join(v for v, _, _ in ins)
    types = ", ".join(t for _, t, _ in ins)
    scalars = ", ".join(f"%a{k}: {t.split('x')[-1][:-1]}" for k, (_, t, _) in enumerate(ins))
    return [
        f"  {name} = linalg.generic {{indexing_maps = [{maps}], iterator_types = {kinds}}} "
        f"ins({values} : {types}) outs({out[0]} : {out[1]}) {{",
        f"  ^bb0({scalars}, %o: {out[1].split('x')[-1][:-1]}):",
        *(f"    {line}" for line in body),
        f"  }} -> {out[1]}",
    ]


def _batchnorm_statistics() -> str:
    """BatchNorm's statistics as the importer writes them (``X = extf(x)``, the f64 mean,
    the two-pass sum of squared deviations, the f32 mean beside): returns the f32 mean and
    the f64 sum of squared deviations per channel."""
    lines = [
        f"func.func @main(%x: {X_T}) -> ({G_T}, {G64_T}) {{",
        "  %z64 = arith.constant 0.0 : f64",
        "  %z32 = arith.constant 0.0 : f32",
        f"  %n64 = arith.constant {float(COUNT)} : f64",
        f"  %n32 = arith.constant {float(COUNT)} : f32",
        f"  %e64 = tensor.empty() : {X64_T}",
        f"  %g64 = tensor.empty() : {G64_T}",
        f"  %f64 = linalg.fill ins(%z64 : f64) outs(%g64 : {G64_T}) -> {G64_T}",
        f"  %g32 = tensor.empty() : {G_T}",
        f"  %f32 = linalg.fill ins(%z32 : f32) outs(%g32 : {G_T}) -> {G_T}",
        *_generic("%wide", [("%x", X_T, MAP4)], ("%e64", X64_T, MAP4), PARALLEL,
                  ["%w = arith.extf %a0 : f32 to f64", "linalg.yield %w : f64"]),
        *_generic("%sum", [("%wide", X64_T, MAP4)], ("%f64", G64_T, GROUP), PER_CHANNEL,
                  ["%s = arith.addf %a0, %o : f64", "linalg.yield %s : f64"]),
        *_generic("%mean", [("%sum", G64_T, MAP4)], ("%g64", G64_T, MAP4), PARALLEL,
                  ["%m = arith.divf %a0, %n64 : f64", "linalg.yield %m : f64"]),
        *_generic("%dev", [("%wide", X64_T, MAP4), ("%mean", G64_T, GROUP)],
                  ("%e64", X64_T, MAP4), PARALLEL,
                  ["%d = arith.subf %a0, %a1 : f64", "linalg.yield %d : f64"]),
        *_generic("%sq", [("%dev", X64_T, MAP4), ("%dev", X64_T, MAP4)],
                  ("%e64", X64_T, MAP4), PARALLEL,
                  ["%q = arith.mulf %a0, %a1 : f64", "linalg.yield %q : f64"]),
        *_generic("%var", [("%sq", X64_T, MAP4)], ("%f64", G64_T, GROUP), PER_CHANNEL,
                  ["%v = arith.addf %a0, %o : f64", "linalg.yield %v : f64"]),
        *_generic("%sum32", [("%x", X_T, MAP4)], ("%f32", G_T, GROUP), PER_CHANNEL,
                  ["%s = arith.addf %a0, %o : f32", "linalg.yield %s : f32"]),
        *_generic("%mean32", [("%sum32", G_T, MAP4)], ("%g32", G_T, MAP4), PARALLEL,
                  ["%m = arith.divf %a0, %n32 : f32", "linalg.yield %m : f32"]),
        f"  return %mean32, %var : {G_T}, {G64_T}",
        "}",
    ]  # fmt: skip
    return "\n".join(lines)


def _reductions(module) -> list:
    """The generics with a reduction loop (in the order they appear)."""
    from stagegraph.stages.analysis.ops import declared_iterator_types

    return [g for g in collect(module, "linalg.generic")
            if "reduction" in declared_iterator_types(g)]  # fmt: skip


def test_three_reductions_become_one_with_three_results() -> None:
    from stagegraph.mlir.bindings import ir
    from stagegraph.stages.x86.generic.batch_stats import one_pass_statistics

    module = parse_payload(_batchnorm_statistics())
    assert len(_reductions(module)) == 3
    with module.context, ir.Location.unknown():
        assert one_pass_statistics(module) == 1
        assert module.operation.verify()
        (merged,) = _reductions(module)
        # T1, T2 (shifted) and the f64 sum of X; the f32 sum of x is that sum, rounded.
        kinds = [str(ir.RankedTensorType(r.type).element_type) for r in merged.results]
        assert kinds == ["f64", "f64", "f64"]
        # (the f64 mean only centred the two-pass deviations: it is gone with them)
        bodies = [[op.name for op in collect(u.owner)] for u in merged.results[2].uses]
        assert bodies == [["arith.truncf", "linalg.yield"]]
        # It reads x itself (widened in its body) and each channel's first element.
        source, shift = list(merged.operands)[:2]
        assert isinstance(source, ir.BlockArgument)  # %x, the function's argument
        assert shift.owner.name == "tensor.extract_slice"
        assert ir.RankedTensorType(shift.type).shape == [1, C, 1, 1]
        # Only the reduction reads the shift: the variance is T2 - T1^2 / N per group.
        assert [u.owner for u in shift.uses] == [merged]
        # No whole-tensor f64 op is left: the widening, deviation and square are gone.
        wide = [g for g in collect(module, "linalg.generic")
                if ir.RankedTensorType(g.results[0].type).shape == [N, C, H, H]]  # fmt: skip
        assert wide == []
        assert one_pass_statistics(module) == 0  # nothing left to rewrite


def test_the_variance_keeps_f64_accuracy_with_a_large_mean(tmp_path) -> None:
    """Each channel's mean is 1000 standard deviations from 0: ``E[x^2] - E[x]^2`` in f64
    would be off by ~1e-10 relative (the f64 tolerance here is ~2e-13); the shifted sums
    are not. The f32 means stay the f32 sums of ``x``."""
    rng = np.random.default_rng(7)
    offsets = np.array([1000.0, -3000.0, 0.5])[None, :, None, None]
    x = (offsets + rng.standard_normal((N, C, H, H))).astype(np.float32)
    wide = x.astype(np.float64)
    mean = wide.mean(axis=(0, 2, 3), keepdims=True)
    squared = ((wide - mean) ** 2).sum(axis=(0, 2, 3), keepdims=True)
    (tmp_path / "bn.mlir").write_text(_batchnorm_statistics())
    np.savez(tmp_path / "bn.npz", in0=x, out0=mean.astype(np.float32), out1=squared)
    result = sg.run("x86", str(tmp_path / "bn.mlir"), threads=1)
    assert result.verified is True, result.message


# ---------------------------------------------------------------- from PyTorch

MODELS = """
import torch
import torch.nn as nn


def conv_bn_relu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    return model.train(), (torch.randn(4, 3, 12, 12) + 2.0,)


def linear_bn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.Tanh())
    return model.train(), (torch.randn(64, 32),)


def conv_groupnorm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(4, 8))
    return model, (torch.randn(2, 3, 12, 12),)
"""


#: A cache this small makes the small test tensors streams (1 KiB: the per-channel
#: statistics and the weights of a few hundred values stay resident).
RESIDENT = 1024


@pytest.fixture
def models(tmp_path, monkeypatch) -> str:
    pytest.importorskip("torch")
    package = tmp_path / "sg_stats_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "norms.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "sg_stats_models.norms"


def _two_pass(monkeypatch) -> None:
    """The x86 graph as before this rewrite: the importer's reductions left as they are."""
    from stagegraph.stages.x86.generic import batch_stats

    monkeypatch.setattr(batch_stats, "one_pass_statistics", lambda module: 0)


#: Passes saved per model. The linear layer's bias add is recomputed on its first row
#: for the shift (16 values, not the whole output stored for a slice of it): the counter
#: sees a read of the matmul's buffer there and counts it as a pass.
SAVED = {"conv_bn_relu": 2, "linear_bn": 1, "conv_groupnorm": 2}


@pytest.mark.parametrize("factory", sorted(SAVED))
def test_training_norms_take_fewer_passes_and_match_eager(
    models: str, factory: str, monkeypatch
) -> None:
    """The statistics' three reductions were three passes over the norm's input; in one
    reduction they are one. Outputs (the normalized values and, for BatchNorm, the updated
    running mean and variance) match eager PyTorch."""
    from stagegraph.app.memory_passes import payload_memory_passes

    spec = f"{models}:{factory}"
    one_pass = payload_memory_passes(spec, resident_bytes=RESIDENT).total
    result = sg.run("x86", spec, threads=1)
    assert result.verified is True, result.message
    with monkeypatch.context() as patch:
        _two_pass(patch)
        two_pass = payload_memory_passes(spec, resident_bytes=RESIDENT).total
    assert one_pass == two_pass - SAVED[factory], (one_pass, two_pass)
