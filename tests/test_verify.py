"""The verification criterion: rounding noise passes, real miscompiles fail.

Each miscompile is simulated by computing the output the way the wrong code would (the
correct reference perturbed in the miscompile's way) in float32; the correct output is the
same computation in float32 without the mistake, i.e. with genuine float32 rounding noise.
"""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

from stagegraph import workload
from stagegraph.workload import TensorSpec, Workload, parse_workload, verify
from stagegraph.workload.verify import Verdict, compare, rms
from tests.conftest import kernelbench_or_skip

F32 = np.float32


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def check(got: np.ndarray, ref: np.ndarray, *, n: int, magnitude: float) -> Verdict:
    """One float32 output against a float64 reference, with reduction length ``n``."""
    spec = TensorSpec(shape=ref.shape, dtype="f32")
    return compare(
        [got.astype(F32)], [ref], [spec], reduction_length=n, magnitudes=[magnitude], who="t"
    )


def matmul_f32_sequential(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` summed term by term in float32: the worst ordinary summation order."""
    products = a.astype(F32)[:, :, None] * b.astype(F32)[None, :, :]
    return np.cumsum(products, axis=1, dtype=F32)[:, -1, :]


class Linear(Workload):
    """``y = x @ w + b`` (float32 in and out, float64 reference): a test-only workload."""

    name = "test-linear"

    def input_specs(self) -> list[TensorSpec]:
        return [
            TensorSpec(shape=(24, 48), dtype="f32"),
            TensorSpec(shape=(48, 20), dtype="f32"),
            TensorSpec(shape=(20,), dtype="f32"),
        ]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec(shape=(24, 20), dtype="f32")]

    def _compute_reference(self) -> list[np.ndarray]:
        x, w, b = (a.astype(np.float64) for a in self.inputs())
        return [x @ w + b]

    @property
    def reduction_length(self) -> int:
        return 48


# ---------------------------------------------------------------- the criterion itself


def test_verdict_is_still_importable_from_workload() -> None:
    assert workload.Verdict is verify.Verdict


def test_tolerance_is_per_dtype_unit_roundoff_times_sqrt_reduction() -> None:
    assert verify.UNIT_ROUNDOFF == {
        "f64": 2.0**-53,
        "f32": 2.0**-24,
        "f16": 2.0**-11,
        "bf16": 2.0**-8,
    }
    norm, elem = verify.tolerances("f32", 400)
    assert norm == pytest.approx(verify.NORMWISE * 2.0**-24 * 20)
    assert elem == pytest.approx(verify.ELEMENTWISE * 2.0**-24 * 20)
    assert verify.tolerances("bf16", 1)[0] == pytest.approx(2**16 * verify.tolerances("f32", 1)[0])
    assert verify.tolerances("i64", 400) == (0.0, 0.0)


def test_magnitudes_default_to_the_largest_input_rms_and_matmul_knows_better() -> None:
    linear = Linear()
    assert linear.magnitudes() == [pytest.approx(max(rms(a) for a in linear.inputs()))]
    mm = parse_workload("matmul:m=8,n=6,k=100")
    a, b = mm.inputs()
    assert mm.magnitudes() == [pytest.approx(10 * rms(a) * rms(b))]


# ---------------------------------------------------------------- rounding noise passes


@pytest.mark.parametrize("k", [8, 256, 4096])
def test_float32_sequential_matmul_passes(k: int) -> None:
    w = parse_workload(f"matmul:m=12,n=10,k={k}")
    a, b = w.inputs()
    verdict = w.verify([matmul_f32_sequential(a, b)])
    assert verdict.ok, verdict.message
    assert verdict.ratio < 0.25  # noise sits well inside the tolerance, not at its edge


def test_float32_linear_layer_passes() -> None:
    w = Linear()
    x, wt, b = w.inputs()
    verdict = w.verify([matmul_f32_sequential(x, wt) + b])
    assert verdict.ok, verdict.message


def group_norm_mean(x: np.ndarray, groups: int, beta: np.ndarray, extent: int | None = None):
    """GroupNorm (no affine scale) then the mean over everything but the batch, in x's dtype.

    The mean of normalized values is zero up to rounding: the KernelBench ``l2_023`` shape.
    ``extent`` < group size averages too few elements (a wrong reduction extent).
    """
    batch, channels = x.shape[:2]
    g = x.reshape(batch, groups, -1)
    normed = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    normed = normed.reshape(x.shape) + beta.reshape(1, channels, *([1] * (x.ndim - 2)))
    flat = normed.reshape(batch, -1)
    if extent is not None:
        flat = flat.reshape(batch, groups, -1)[:, :, :extent].reshape(batch, -1)
    return flat.mean(-1)


def test_near_zero_outputs_from_cancellation_pass() -> None:
    x = rng().uniform(-1, 1, (4, 8, 6, 6))
    beta = np.zeros(8)
    ref = group_norm_mean(x, 4, beta)
    got = group_norm_mean(x.astype(F32), 4, beta.astype(F32))
    assert np.abs(ref).max() < 1e-14 and np.abs(got - ref).max() > 1e-9  # all cancellation
    assert check(got, ref, n=72, magnitude=rms(x)).ok


# ---------------------------------------------------------------- miscompiles fail


def test_dropped_bias_fails() -> None:
    w = Linear()
    x, wt, b = w.inputs()
    assert w.verify([matmul_f32_sequential(x, wt) + b]).ok
    verdict = w.verify([matmul_f32_sequential(x, wt)])
    assert not verdict.ok and "output 0 differs" in verdict.message


def test_dropped_small_bias_fails() -> None:
    """A bias 1000x smaller than the output is still far above rounding noise."""
    x, wt = (rng(1).uniform(-1, 1, s) for s in ((16, 64), (64, 16)))
    bias = rng(2).uniform(-1, 1, 16) * 1e-3 * rms(x @ wt)
    ref = x @ wt + bias
    assert check(matmul_f32_sequential(x, wt) + bias.astype(F32), ref, n=64, magnitude=1).ok
    assert not check(matmul_f32_sequential(x, wt), ref, n=64, magnitude=1).ok


@pytest.mark.parametrize("k", [8, 256, 4096])
@pytest.mark.parametrize("dropped", ["last", "first"])
def test_reduction_over_k_minus_one_terms_fails(k: int, dropped: str) -> None:
    w = parse_workload(f"matmul:m=12,n=10,k={k}")
    a, b = w.inputs()
    kept = slice(0, k - 1) if dropped == "last" else slice(1, k)
    verdict = w.verify([matmul_f32_sequential(a[:, kept], b[kept, :])])
    assert not verdict.ok, verdict.message


def test_transposed_operand_fails() -> None:
    w = parse_workload("matmul:m=32,n=32,k=32")
    a, b = w.inputs()
    assert w.verify([matmul_f32_sequential(a, b)]).ok
    assert not w.verify([matmul_f32_sequential(a, b.T)]).ok
    assert not w.verify([matmul_f32_sequential(a.T, b)]).ok


def avg_pool(x: np.ndarray, window: int, shift: int = 0, last_width: int | None = None):
    """Valid ``window`` x ``window`` average pooling, stride 1, over the last two axes.

    ``shift`` moves every window down by that many rows (zero rows enter at the border);
    ``last_width`` gives the last output column a window that many columns wide (a loop
    bound off by one at the edge: a wrong result in one column only).
    """
    height, width = x.shape[-2] - window + 1, x.shape[-1] - window + 1
    padded = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, abs(shift)), (0, 0)])
    out = np.zeros((*x.shape[:-2], height, width), dtype=x.dtype)
    for i in range(height):
        for j in range(width):
            cols = last_width if (last_width is not None and j == width - 1) else window
            rows = padded[..., i + shift : i + shift + window, j : j + cols]
            out[..., i, j] = rows.sum(axis=(-2, -1)) / np.asarray(window * window, x.dtype)
    return out


def test_avg_pool_rounding_passes_and_off_by_one_windows_fail() -> None:
    x = rng(3).uniform(-1, 1, (2, 3, 12, 12))
    ref = avg_pool(x, 3)
    x32 = x.astype(F32)
    assert check(avg_pool(x32, 3), ref, n=9, magnitude=rms(x)).ok
    assert not check(avg_pool(x32, 3, shift=1), ref, n=9, magnitude=rms(x)).ok
    border = check(avg_pool(x32, 3, last_width=2), ref, n=9, magnitude=rms(x))
    assert not border.ok
    assert re.search(r"at index \(\d+, \d+, \d+, 9\)", border.message)  # the wrong column


def test_max_pool_shifted_window_fails() -> None:
    x = rng(4).uniform(-1, 1, (2, 2, 9, 9))

    def max_pool(values: np.ndarray, shift: int) -> np.ndarray:
        windows = np.lib.stride_tricks.sliding_window_view(values, (3, 3), axis=(-2, -1))
        pooled = windows.max(axis=(-2, -1))
        return pooled[..., shift : shift + 6, :]

    assert check(max_pool(x.astype(F32), 0), max_pool(x, 0), n=9, magnitude=rms(x)).ok
    assert not check(max_pool(x.astype(F32), 1), max_pool(x, 0), n=9, magnitude=rms(x)).ok


def test_miscompiles_of_near_zero_outputs_still_fail() -> None:
    """The floor that lets cancellation noise pass does not hide wrong code there."""
    x = rng(5).uniform(-1, 1, (4, 8, 8, 8))
    beta = rng(6).uniform(-0.1, 0.1, 8)
    ref = group_norm_mean(x, 4, beta)
    n, floor = 128, rms(x)
    assert check(group_norm_mean(x.astype(F32), 4, beta.astype(F32)), ref, n=n, magnitude=floor).ok
    no_beta = group_norm_mean(x.astype(F32), 4, np.zeros(8, F32))
    assert not check(no_beta, ref, n=n, magnitude=floor).ok
    short = group_norm_mean(x.astype(F32), 4, beta.astype(F32), extent=127)
    assert not check(short, ref, n=n, magnitude=floor).ok


def test_integer_outputs_must_match_exactly() -> None:
    spec = TensorSpec(shape=(3,), dtype="i32")
    ref = np.array([1, 2, 3], np.int32)
    kwargs = {"reduction_length": 1000, "magnitudes": [1e6], "who": "t"}
    assert compare([ref.copy()], [ref], [spec], **kwargs).ok
    verdict = compare([ref + np.array([0, 0, 1], np.int32)], [ref], [spec], **kwargs)
    assert not verdict.ok and math.isinf(verdict.ratio)


# ---------------------------------------------------------------- KernelBench payloads

# Outputs near zero by cancellation (GroupNorm then mean/sum, GELU of very negative values)
# that the previous criterion (relative to |ref| + mean|ref|) rejected.
LEVEL2 = [
    ("l2_003_ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU", "x86"),
    ("l2_023_Conv3d_GroupNorm_Mean", "x86"),
    ("l2_023_Conv3d_GroupNorm_Mean", "naive"),
    ("l2_075_Gemm_GroupNorm_Min_BiasAdd", "x86"),
    ("l2_093_ConvTranspose2d_Add_Min_GELU_Multiply", "x86"),
]


def run_payload(level: str, stem: str, graph: str) -> tuple[Workload, list[np.ndarray]]:
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine

    path = kernelbench_or_skip(level) / f"{stem}.mlir"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    w = parse_workload(str(path))
    result = Engine().run(load_graph(graph), w)
    return w, result.binary.call(w.entry, w.inputs())


@pytest.mark.parametrize(("stem", "graph"), LEVEL2)
def test_level2_cancellation_payloads_verify(stem: str, graph: str) -> None:
    w, outputs = run_payload("level2", stem, graph)
    verdict = w.verify(outputs)
    assert verdict.ok, verdict.message


def test_level3_training_running_stats_near_zero_verify() -> None:
    """ShuffleNet's updated BatchNorm running means include values ~1e-10 (got ~5e-9)."""
    w, outputs = run_payload("level3", "l3_025_ShuffleNetUnit", "x86")
    verdict = w.verify(outputs)
    assert verdict.ok, verdict.message
    # Skipping the momentum update is caught through the running variance (left at 1 instead
    # of ~0.93); left at 0, the running mean differs from its true value (~1e-10) by less
    # than the rounding noise of a batch mean of O(1) values: no criterion can see that.
    wrong = [o.copy() for o in outputs]
    wrong[7] = np.ones_like(wrong[7])
    assert not w.verify(wrong).ok


# Real miscompiles, simulated by editing the payload: the output of l2_093 is ~1000x smaller
# than what produced it (GELU of mostly very negative values), so its floor dominates; l2_003
# normalizes (LayerNorm) before pooling. Each edit must still fail verification.
MUTATIONS = [
    pytest.param(
        "l2_093_ConvTranspose2d_Add_Min_GELU_Multiply",
        "naive",
        "%11 = arith.addf %in, %cst_1 : f32",
        "%11 = arith.addf %in, %cst : f32",
        id="l2_093-dropped-add",
    ),
    pytest.param(
        "l2_093_ConvTranspose2d_Add_Min_GELU_Multiply",
        "naive",
        "[0, 0, 3, 3] [8, 16, 8, 8]",
        "[0, 0, 3, 2] [8, 16, 8, 8]",
        id="l2_093-padding-off-by-one",
    ),
    pytest.param(
        "l2_093_ConvTranspose2d_Add_Min_GELU_Multiply",
        "naive",
        "%cst_3[%12, %11, %15, %16]",
        "%cst_3[%11, %12, %15, %16]",
        id="l2_093-transposed-weights",
    ),
    pytest.param(
        "l2_003_ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU",
        "x86",
        "%cst_10 = arith.constant 6.400000e+01 : f32",
        "%cst_10 = arith.constant 6.300000e+01 : f32",
        id="l2_003-layernorm-mean-over-63",
    ),
]


@pytest.mark.parametrize(("stem", "graph", "old", "new"), MUTATIONS)
def test_mutated_kernelbench_payloads_fail(stem, graph, old, new, tmp_path) -> None:
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine

    source = kernelbench_or_skip("level2") / f"{stem}.mlir"
    if not source.is_file():
        pytest.skip(f"{source} not found")
    text = source.read_text()
    assert text.count(old) == 1, f"{stem} changed: {old!r} is not there once"
    path = tmp_path / source.name
    path.write_text(text.replace(old, new))
    shutil.copy(source.with_suffix(".npz"), path.with_suffix(".npz"))
    w = parse_workload(str(path))
    result = Engine().run(load_graph(graph), w)
    verdict = w.verify(result.binary.call(w.entry, w.inputs()))
    assert not verdict.ok and verdict.ratio > 100, verdict.message
