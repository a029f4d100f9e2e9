"""A vectorized convolution tile's accumulators stay in registers across its reduction loops
(``generic/conv_accumulators.py``), and its window may be tiled tap by tap
(``GenericParams.conv_nhwc_window_tile``): IR structure and values against the definition."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.mlir.diagnostics import parse_payload
from stagegraph.stages.analysis import analyze
from stagegraph.stages.target import named_x86_target
from stagegraph.stages.x86.generic.params import GenericParams, heuristic_generic_params
from tests.test_generic_schedule import _conv2d_nchw, _conv3d_reference, _jit


def _scheduled(text: str, target: str, **changes) -> object:
    """``text`` prepared (channels-last where the channels fill vectors) and scheduled with
    the heuristic params of ``target`` changed by ``changes``."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.x86.generic.prepare import prepare
    from stagegraph.stages.x86.generic.schedule import (
        apply_generic_schedule,
        build_generic_schedule,
    )

    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        prepare(module, entry_function(module, "main"))
    facts = analyze(module)
    params = heuristic_generic_params(facts, named_x86_target(target))
    params = params.model_copy(update=changes)
    with module.context, ir.Location.unknown():
        apply_generic_schedule(module, build_generic_schedule(facts, params), facts)
    return module


def _reduction_loops(module) -> list:
    """The ``scf.for`` loops around the convolution's FMAs (inside its output tile's
    ``scf.forall``)."""
    from stagegraph.mlir.walk import collect

    loops: list = []
    for fma in collect(module, "vector.fma"):
        parent = fma.parent
        while parent is not None and parent.name != "scf.forall":
            if parent.name == "scf.for" and parent not in loops:  # (== compares the ops)
                loops.append(parent)
            parent = parent.parent
    return loops


def _carries_vectors(loop) -> bool:
    from stagegraph.mlir.bindings import ir

    return any(isinstance(result.type, ir.VectorType) for result in loop.results)


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("window_tile", [0, 1], ids=["whole-window", "tap-by-tap"])
def test_reduction_loops_carry_the_accumulators(target: str, window_tile: int) -> None:
    """Every reduction loop (window rows, window taps when tiled, input channels) carries the
    output tile as a vector: no load and store of the accumulators per step. Without
    hoisting, none does."""
    # 32 input channels: several channel steps on either target
    text, _ = _conv2d_nchw(2, 32, 32, (6, 12), (3, 5), (1, 1), (1, 1))
    module = _scheduled(text, target, conv_nhwc_window_tile=window_tile)  # (the loops' owner)
    hoisted = _reduction_loops(module)
    # window rows, channel chunks, and the taps when tiled
    assert len(hoisted) == 2 + (window_tile == 1)
    assert all(_carries_vectors(loop) for loop in hoisted)
    plain = _scheduled(
        text, target, conv_nhwc_window_tile=window_tile, conv_hoist_accumulators=False
    )
    kept = _reduction_loops(plain)
    assert len(kept) == len(hoisted) and not any(_carries_vectors(loop) for loop in kept)


@pytest.mark.parametrize(
    ("c", "f", "kernel", "strides", "dilations"),
    [
        (16, 32, (3, 7), (1, 1), (1, 1)),
        (16, 16, (5, 9), (1, 1), (2, 3)),
        (8, 16, (2, 3), (2, 1), (1, 2)),
        (5, 8, (3, 3), (1, 1), (1, 1)),
    ],
    ids=["asymmetric", "dilated", "strided", "few-channels"],
)
def test_hoisted_and_tap_by_tap_convolutions_match_the_definition(
    c: int, f: int, kernel: tuple[int, int], strides: tuple[int, int],
    dilations: tuple[int, int],
) -> None:  # fmt: skip
    """Hoisted accumulators, with the window whole or tap by tap and a channel tile that
    does or does not divide the channels, compute the convolution (AVX2 tiles: they run on
    every x86-64-v3 host)."""
    text, (x_shape, w_shape, _) = _conv2d_nchw(2, c, f, (12, 30), kernel, strides, dilations)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    expected = _conv3d_reference(x[:, :, None], w[:, :, None], (1, *strides), (1, *dilations))
    facts = analyze(parse_payload(text))
    base = heuristic_generic_params(facts, named_x86_target("x86-64-v3"))
    for changes in (
        {},
        {"conv_nhwc_window_tile": 1},
        {"conv_nhwc_window_tile": 2, "conv_reduction_tile": 4},
    ):
        params = GenericParams(**{**base.model_dump(), **changes})
        (out,) = _jit(text, params).call("main", [x, w])
        np.testing.assert_allclose(out, expected[:, :, 0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("target", "width"), [("x86-64-v3", 4), ("x86-64-v4", 8)])
def test_channels_last_tiles_follow_the_register_file(target: str, width: int) -> None:
    """Two vectors of filters times a width whose accumulators take half the target's
    vector registers (16 on AVX2, 32 on AVX-512), one tap per reduction step."""
    text, _ = _conv2d_nchw(1, 16, 32, (6, 12), (3, 3), (1, 1), (1, 1))
    facts = analyze(parse_payload(text))
    params = heuristic_generic_params(facts, named_x86_target(target))
    lanes = params.lanes
    assert (params.conv_nhwc_channel_tile, params.conv_nhwc_width_tile) == (2 * lanes, width)
    assert params.conv_nhwc_window_tile == 1 and params.conv_hoist_accumulators


@pytest.mark.parametrize(
    ("channels", "width", "target", "taps"),
    [
        (32, 7, "x86-64-v4", 1),
        (3, 7, "x86-64-v4", 0),
        (3, 9, "x86-64-v4", 3),
        (2, 9, "x86-64-v3", 3),
        (3, 8, "x86-64-v3", 2),
    ],
    ids=["many-channels", "rgb-7-taps", "rgb-9-taps", "two-channels-avx2", "rgb-8-taps-avx2"],
)
def test_few_input_channels_keep_enough_taps_per_step(
    channels: int, width: int, target: str, taps: int
) -> None:
    """One tap per reduction step where the step's input channels reach
    ``conv_reduction_tile`` (8 on AVX-512, 4 on AVX2); with fewer, the smallest divisor of
    the window's width whose tap-channel pairs do (0: the whole row)."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.stages.x86.generic.plan import convolution_plan
    from stagegraph.stages.x86.generic.prepare import prepare

    text, _ = _conv2d_nchw(2, channels, 16, (8, 20), (3, width), (1, 1), (1, 1))
    module = parse_payload(text)
    with module.context, ir.Location.unknown():
        prepare(module, entry_function(module, "main"))
    facts = analyze(module)
    (conv,) = facts.ops_of("convolution")
    assert conv.name == "linalg.conv_2d_nhwc_hwcf"
    sizes, _ = convolution_plan(conv, heuristic_generic_params(facts, named_x86_target(target)))
    assert sizes[conv.convolution.filter_loop[-1]] == taps
