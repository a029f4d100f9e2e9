"""Large entries outline every group of ops, those that occur once too
(``ScheduleConfig.outline_every_group_above``), so that no function LLVM compiles holds a
whole model; and outlining groups whose ops interleave keeps every call's arguments in the
function that calls (the rolled ResNet-18 crashed reading a value moved into another
group's function)."""

from __future__ import annotations

import numpy as np

from stagegraph.mlir.diagnostics import parse_payload

_ID = "#id = affine_map<(d0, d1) -> (d0, d1)>"


def _generic(name: str, ins: list[str], body: str) -> str:
    types = ", ".join("tensor<4x8xf32>" for _ in ins)
    maps = ", ".join("#id" for _ in range(len(ins) + 1))
    args = ", ".join(f"%a{i}: f32" for i in range(len(ins))) + ", %o: f32"
    return f"""
  %{name} = linalg.generic {{indexing_maps = [{maps}],
                            iterator_types = ["parallel", "parallel"]}}
      ins({", ".join(ins)} : {types}) outs(%e : tensor<4x8xf32>) {{
  ^bb0({args}):
    {body}
  }} -> tensor<4x8xf32>"""


# Groups by use-def: {%p, %s} (%p's only use is %s), {%q} (read by %s and %t), {%t}.
# Ordered by first op, {%p, %s} would be outlined before {%q} and take %q as an argument;
# {%q}, outlined next, moves %q into its own function (its other reader %t still sees it).
INTERLEAVED = (
    f"""{_ID}
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>)
    -> (tensor<4x8xf32>, tensor<4x8xf32>) {{
  %e = tensor.empty() : tensor<4x8xf32>"""
    + _generic("p", ["%x"], "%r = math.exp %a0 : f32\n    linalg.yield %r : f32")
    + _generic("q", ["%y"], "%r = math.tanh %a0 : f32\n    linalg.yield %r : f32")
    + _generic("s", ["%p", "%q"], "%r = arith.addf %a0, %a1 : f32\n    linalg.yield %r : f32")
    + _generic("t", ["%q", "%s"], "%r = arith.mulf %a0, %a1 : f32\n    linalg.yield %r : f32")
    + """
  return %s, %t : tensor<4x8xf32>, tensor<4x8xf32>
}
"""
)


def _expected(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.exp(x) + np.tanh(y)
    return s, np.tanh(y) * s


def _compiled(text: str, every_above: int | None, deduplicate_above: int = 0):
    """``text`` through the x86 schedule, bufferize and lower stages with the given
    thresholds; returns the scheduled function names and the JIT binary."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.stages.analysis import analyze
    from stagegraph.stages.common.costmodel import CostModelConfig
    from stagegraph.stages.common.emit import runtime_libraries
    from stagegraph.stages.common.passes import BufferizeConfig, bufferize
    from stagegraph.stages.target import detect_target
    from stagegraph.stages.x86.ir_stages import LowerConfig, ScheduleConfig, lower, schedule
    from stagegraph.stages.x86.params_stage import heuristic

    payload = parse_payload(text)
    with payload.context, ir.Location.unknown():
        facts = analyze(payload)
        params = heuristic.fn(facts, detect_target(), CostModelConfig(threads=1))
        config = ScheduleConfig(
            deduplicate_above=deduplicate_above, outline_every_group_above=every_above
        )
        schedule.fn(Module["tensor"](payload), facts, params, config)
        assert payload.operation.verify()
        names = sorted(
            op.operation.attributes["sym_name"].value
            for op in payload.body.operations
            if op.operation.name == "func.func"
        )
        bufferize.fn(Module["tensor"](payload), BufferizeConfig())
        lower.fn(Module["buffer"](payload), params, detect_target(), LowerConfig())
        binary = JitBinary(payload, shared_libs=runtime_libraries(payload))
    return names, binary


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((4, 8), dtype=np.float32) for _ in range(2))


def test_interleaved_groups_outlined_once_each_compute_the_same():
    names, binary = _compiled(INTERLEAVED, every_above=0)
    # Four linalg ops in three groups, each its own function: {%p, %s}, {%q}, {%t}.
    assert names[0] == "main" and len(names) == 4
    assert all(name.startswith("main_group") for name in names[1:])
    x, y = _inputs()
    s, t = binary.call("main", [x, y])
    expected = _expected(x, y)
    np.testing.assert_allclose(s, expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t, expected[1], rtol=1e-5, atol=1e-6)


def test_entries_up_to_the_threshold_keep_their_unique_groups_inline():
    from stagegraph.stages.x86.ir_stages import ScheduleConfig

    # By default (None) never: outlined groups run slower (each returns a fresh tensor).
    assert ScheduleConfig().outline_every_group_above is None
    for above in (4, None):  # four linalg ops: not above 4
        names, _ = _compiled(INTERLEAVED, every_above=above)
        assert names == ["main"]
    names, binary = _compiled(INTERLEAVED, every_above=3)
    assert len(names) == 4
    x, y = _inputs()
    for got, expected in zip(binary.call("main", [x, y]), _expected(x, y), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_group_read_before_its_last_op_stays_in_place():
    """Groups handed in whose ops interleave (not as :func:`dedup.groups` makes them): a
    group an earlier-outlined group reads as an argument is left where it is."""
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.functions import entry_function
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.common import dedup

    payload = parse_payload(INTERLEAVED)
    with payload.context, ir.Location.unknown():
        fn = entry_function(payload, "main")
        p, q, s, t = collect(fn, "linalg.generic")
        p, q, s, t = (op for op in (p, q, s, t) if op.parent.name == "func.func")
        # {%p, %s} ends before {%q, %t} does, and reads %q: {%q, %t} must stay.
        shared = dedup.outline_repeated(payload, fn, [[p, s], [q, t]], min_sites=1)
        assert [d.sites for d in shared.distinct] == [1]
        dedup.install(payload, shared)
        assert payload.operation.verify()
        main_ops = [op.name for op in collect(fn, lambda op: op.parent.name == "func.func")]
        assert main_ops.count("linalg.generic") == 2  # %q and %t, in place
        assert main_ops.count("func.call") == 1
