"""Attention chains tiled over (batch, query-row blocks) (``stages.x86.attention``, run by
``x86.normalize``): the loop around the whole QK^T -> softmax -> PV chain and no
score-sized tensor outside it, the chains it must leave alone (tiling off, a softmax with a
second user, scores that fit L2), the row block the cost model picks on pinned targets, and
compiled values against numpy (odd sizes, a causal mask, an additive mask, batch > 1, an
unbatched chain)."""

from __future__ import annotations

import numpy as np
import pytest

import stagegraph as sg
from stagegraph.core.catalog import load_graph
from stagegraph.mlir.bindings import ir, new_context
from stagegraph.mlir.walk import collect
from stagegraph.stages.target import resolve_target, target_from_override
from stagegraph.stages.x86.attention import (
    LOOP_ATTR,
    AttentionChain,
    AttentionTiles,
    find_chains,
    row_block,
    tile_attention,
)

_V4 = resolve_target("x86-64-v4")
_V3 = resolve_target("x86-64-v3")


def _maps(rank: int) -> tuple[str, str, str]:
    dims = ", ".join(f"d{k}" for k in range(rank))
    rows = ", ".join(f"d{k}" for k in range(rank - 1))
    keys = f"d{rank - 2}, d{rank - 1}"
    return (
        f"affine_map<({dims}) -> ({dims})>",
        f"affine_map<({dims}) -> ({rows})>",
        f"affine_map<({dims}) -> ({keys})>",
    )


def _attention(
    b: int,
    m: int,
    n: int,
    d: int,
    e: int,
    mask: str = "",
    returns_probs: bool = False,
    exp: str = "math.exp",
    heads: int = 0,
) -> str:
    """``softmax(scale * Q K^T [+ mask]) V`` as the importer writes it: a matmul into the
    scores, one generic per step (:func:`_softmax`), a matmul of the probabilities.
    ``b == 0``: unbatched (``linalg.matmul``). ``heads``: the matmuls run on
    ``[b * heads, ...]``, the softmax on ``[b, heads, ...]`` (an expand and a collapse
    between them, as MinGPT's). ``returns_probs``: the probabilities are a second
    result."""
    mm_lead = [b * heads] if heads else ([b] if b else [])
    lead = [b, heads] if heads else mm_lead

    def t(dims: list[int], *rest: int) -> str:
        return "tensor<" + "x".join(str(x) for x in [*dims, *rest]) + "xf32>"

    s_t, mm_s_t, out_t = t(lead, m, n), t(mm_lead, m, n), t(mm_lead, m, e)
    mm = "linalg.batch_matmul" if b else "linalg.matmul"
    lines = [
        f"func.func @main(%q: {t(mm_lead, m, d)}, %kt: {t(mm_lead, d, n)},"
        f" %v: {t(mm_lead, n, e)}, %mask: tensor<{m}x{n}xf32>)"
        f" -> ({out_t}{', ' + s_t if returns_probs else ''}) {{",
        "  %zero = arith.constant 0.0 : f32",
        f"  %se3 = tensor.empty() : {mm_s_t}",
        f"  %s0 = linalg.fill ins(%zero : f32) outs(%se3 : {mm_s_t}) -> {mm_s_t}",
        f"  %s3 = {mm} ins(%q, %kt : {t(mm_lead, m, d)}, {t(mm_lead, d, n)})"
        f" outs(%s0 : {mm_s_t}) -> {mm_s_t}",
    ]
    if heads:
        lines.append(
            f"  %s = tensor.expand_shape %s3 [[0, 1], [2], [3]] output_shape [{b}, {heads},"
            f" {m}, {n}] : {mm_s_t} into {s_t}"
        )
    lines += _softmax("%s" if heads else "%s3", lead, m, n, mask, exp)
    probs = "%p"
    if heads:
        lines.append(f"  %p3 = tensor.collapse_shape %p [[0, 1], [2], [3]] : {s_t} into {mm_s_t}")
        probs = "%p3"
    lines += [
        f"  %oe = tensor.empty() : {out_t}",
        f"  %o0 = linalg.fill ins(%zero : f32) outs(%oe : {out_t}) -> {out_t}",
        f"  %out = {mm} ins({probs}, %v : {mm_s_t}, {t(mm_lead, n, e)})"
        f" outs(%o0 : {out_t}) -> {out_t}",
        f"  return %out, %p : {out_t}, {s_t}" if returns_probs else f"  return %out : {out_t}",
        "}",
    ]
    return "\n".join(lines)


def _generic(
    maps: list[str], kinds: str, ins: str, outs: str, body: list[str], to: str
) -> list[str]:
    return [
        f"  linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{kinds}]}}"
        f" ins({ins}) outs({outs}) {{",
        *[f"    {line}" for line in body],
        f"  }} -> {to}",
    ]


def _softmax(source: str, lead: list[int], m: int, n: int, mask: str, exp: str) -> list[str]:
    """The softmax of ``source`` over its rows as separate generics: a scale (with a
    ``causal`` mask: keys after the query row get -inf, from ``linalg.index``), an
    ``add`` mask (an input ``[m, n]`` broadcast over the batch), the max with its argmax
    result, subtract, ``exp`` (another op in its place: no softmax), sum, divide into
    ``%p``."""
    rank = len(lead) + 2
    whole, _, keys = _maps(rank)
    par = ", ".join(['"parallel"'] * rank)
    dims = "x".join(str(x) for x in [*lead, m])
    s_t, r_t, i_t = f"tensor<{dims}x{n}xf32>", f"tensor<{dims}xf32>", f"tensor<{dims}xi64>"
    scale = ["^bb0(%a: f32, %o: f32):", "%y = arith.mulf %a, %scale : f32"]
    if mask == "causal":
        scale += [
            f"%i = linalg.index {rank - 2} : index",
            f"%j = linalg.index {rank - 1} : index",
            "%later = arith.cmpi ugt, %j, %i : index",
            "%z = arith.select %later, %ninf, %y : f32",
            "linalg.yield %z : f32",
        ]
    else:
        scale.append("linalg.yield %y : f32")
    lines = [
        "  %ninf = arith.constant 0xFF800000 : f32",
        "  %scale = arith.constant 0.35 : f32",
        "  %c0 = arith.constant 0 : i64",
        f"  %se = tensor.empty() : {s_t}",
        f"  %re = tensor.empty() : {r_t}",
        f"  %m0 = linalg.fill ins(%ninf : f32) outs(%re : {r_t}) -> {r_t}",
        f"  %ie = tensor.empty() : {i_t}",
        f"  %i0 = linalg.fill ins(%c0 : i64) outs(%ie : {i_t}) -> {i_t}",
        f"  %z0 = linalg.fill ins(%zero : f32) outs(%re : {r_t}) -> {r_t}",
        "  %x =",
        *_generic([whole, whole], par, f"{source} : {s_t}", f"%se : {s_t}", scale, s_t),
    ]
    x = "%x"
    if mask == "add":
        add = ["^bb0(%a: f32, %c: f32, %o: f32):", "%y = arith.addf %a, %c : f32"]
        lines += ["  %xm =", *_generic(
            [whole, keys, whole], par, f"%x, %mask : {s_t}, tensor<{m}x{n}xf32>",
            f"%se : {s_t}", [*add, "linalg.yield %y : f32"], s_t,
        )]  # fmt: skip
        x = "%xm"
    return lines + _normalized(x, rank, s_t, r_t, i_t, exp)


def _normalized(x: str, rank: int, s_t: str, r_t: str, i_t: str, exp: str) -> list[str]:
    """max (with its argmax result), subtract, ``exp``, sum, divide of ``x`` into ``%p``."""
    whole, rows, _ = _maps(rank)
    par = ", ".join(['"parallel"'] * rank)
    red = ", ".join(['"parallel"'] * (rank - 1) + ['"reduction"'])
    argmax = [
        "^bb0(%a: f32, %o: f32, %oi: i64):",
        f"%k = linalg.index {rank - 1} : index",
        "%ki = arith.index_cast %k : index to i64",
        "%y = arith.maximumf %a, %o : f32",
        "%gt = arith.cmpf ogt, %a, %o : f32",
        "%w = arith.select %gt, %ki, %oi : i64",
        "linalg.yield %y, %w : f32, i64",
    ]
    two = "^bb0(%a: f32, %c: f32, %o: f32):"
    lines = [
        "  %mx:2 =",
        *_generic(
            [whole, rows, rows],
            red,
            f"{x} : {s_t}",
            f"%m0, %i0 : {r_t}, {i_t}",
            argmax,
            f"({r_t}, {i_t})",
        ),
    ]
    lines += [
        "  %sh =",
        *_generic(
            [whole, rows, whole],
            par,
            f"{x}, %mx#0 : {s_t}, {r_t}",
            f"%se : {s_t}",
            [two, "%y = arith.subf %a, %c : f32", "linalg.yield %y : f32"],
            s_t,
        ),
    ]
    lines += [
        "  %ex =",
        *_generic(
            [whole, whole],
            par,
            f"%sh : {s_t}",
            f"%se : {s_t}",
            ["^bb0(%a: f32, %o: f32):", f"%y = {exp} %a : f32", "linalg.yield %y : f32"],
            s_t,
        ),
    ]
    lines += [
        "  %sum =",
        *_generic(
            [whole, rows],
            red,
            f"%ex : {s_t}",
            f"%z0 : {r_t}",
            ["^bb0(%a: f32, %o: f32):", "%y = arith.addf %a, %o : f32", "linalg.yield %y : f32"],
            r_t,
        ),
    ]
    lines += ["  %p =", *_generic([whole, rows, whole], par, f"%ex, %sum : {s_t}, {r_t}",
                                  f"%se : {s_t}", [two, "%y = arith.divf %a, %c : f32",
                                                   "linalg.yield %y : f32"], s_t)]  # fmt: skip
    return lines


def _reference(q, kt, v, mask_kind: str, mask) -> np.ndarray:
    s = np.matmul(q.astype(np.float64), kt.astype(np.float64)) * np.float64(np.float32(0.35))
    m, n = s.shape[-2:]
    if mask_kind == "causal":
        s = np.where(np.arange(n)[None, :] > np.arange(m)[:, None], -np.inf, s)
    if mask_kind == "add":
        s = s + mask
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v.astype(np.float64))


def _tile(text: str, config: AttentionTiles, target=_V4):
    context = new_context()
    with context, ir.Location.unknown():
        module = ir.Module.parse(text)
        count = tile_attention(module, target, config)
        assert module.operation.verify()
    return context, module, count


def _tensor_shapes_outside(module, loop) -> set[tuple[int, ...]]:
    shapes = set()
    for op in collect(module.operation):
        if loop is not None and _inside(op, loop):
            continue
        for result in op.results:
            if isinstance(result.type, ir.RankedTensorType):
                shapes.add(tuple(ir.RankedTensorType(result.type).shape))
    return shapes


def _inside(op, loop) -> bool:
    parent = op.parent
    while parent is not None:
        if parent == loop:
            return True
        parent = parent.parent
    return False


def test_the_chain_runs_in_one_loop_over_batch_and_row_blocks():
    """Batch 3, 45 query rows, 40 keys, a pinned block of 10 rows: 9 rows (a divisor of
    45) a block, a 3 x 5 ``scf.forall``; both matmuls and every softmax op in it, and no
    op outside it makes a tensor of the scores' shape."""
    context, module, count = _tile(_attention(3, 45, 40, 8, 6), AttentionTiles(row_block=10))
    with context:
        assert count == 1
        [loop] = collect(module.operation, lambda op: LOOP_ATTR in op.attributes)
        assert loop.name == "scf.forall"
        matmuls = collect(module.operation, "linalg.batch_matmul")
        assert len(matmuls) == 2 and all(_inside(op, loop) for op in matmuls)
        shapes = [tuple(ir.RankedTensorType(op.results[0].type).shape) for op in matmuls]
        assert shapes == [(1, 9, 40), (1, 9, 6)]
        generics = collect(module.operation, "linalg.generic")
        assert len(generics) == 6 and all(_inside(op, loop) for op in generics)
        assert (3, 45, 40) not in _tensor_shapes_outside(module, loop)
        assert list(loop.attributes["staticUpperBound"]) == [3, 5]


def test_heads_apart_from_the_batch_tile_through_the_reshapes():
    """MinGPT's form: the matmuls on ``[batch * heads, ...]``, the softmax on ``[batch,
    heads, ...]``: the expand and the collapse move into the loop (a block's slice of
    each), and neither the 4-D scores nor the 3-D ones are made outside it."""
    text = _attention(2, 24, 40, 8, 8, mask="causal", heads=3)
    context, module, count = _tile(text, AttentionTiles(row_block=8))
    with context:
        assert count == 1
        [loop] = collect(module.operation, lambda op: LOOP_ATTR in op.attributes)
        assert list(loop.attributes["staticUpperBound"]) == [6, 3]
        shapes = _tensor_shapes_outside(module, loop)
        assert (2, 3, 24, 40) not in shapes and (6, 24, 40) not in shapes
        reshapes = collect(module.operation, ("tensor.expand_shape", "tensor.collapse_shape"))
        assert reshapes and all(_inside(op, loop) for op in reshapes)


def test_every_chain_of_the_module_is_tiled():
    """Two functions with a chain each (ops a tiling's clean-up may touch): two loops."""
    first = _attention(2, 16, 24, 4, 4)
    second = _attention(0, 32, 24, 4, 4, mask="causal").replace("@main", "@second")
    context, module, count = _tile(f"{first}\n{second}", AttentionTiles(row_block=8))
    with context:
        assert count == 2
        loops = collect(module.operation, lambda op: LOOP_ATTR in op.attributes)
        assert [list(loop.attributes["staticUpperBound"]) for loop in loops] == [[2, 2], [4]]


def test_an_unbatched_chain_tiles_its_rows():
    context, module, count = _tile(_attention(0, 32, 24, 4, 4), AttentionTiles(row_block=8))
    with context:
        assert count == 1
        [loop] = collect(module.operation, lambda op: LOOP_ATTR in op.attributes)
        assert list(loop.attributes["staticUpperBound"]) == [4]
        matmuls = collect(module.operation, "linalg.matmul")
        assert [tuple(ir.RankedTensorType(op.results[0].type).shape) for op in matmuls] == [
            (8, 24),
            (8, 4),
        ]
        assert (32, 24) not in _tensor_shapes_outside(module, loop)


@pytest.mark.parametrize(
    ("text", "config"),
    [
        (_attention(3, 45, 40, 8, 6), AttentionTiles(enabled=False, row_block=9)),
        (_attention(3, 45, 40, 8, 6, returns_probs=True), AttentionTiles(row_block=9)),
        (_attention(3, 45, 40, 8, 6), AttentionTiles()),  # 21 KB of scores: fits L2
        (_attention(0, 32, 24, 4, 4), AttentionTiles(row_block=32)),  # one block: no loop
        (_attention(3, 45, 40, 8, 6, exp="math.tanh"), AttentionTiles(row_block=9)),
    ],
    ids=["off", "probabilities-returned", "fits-l2", "one-block", "no-exp"],
)
def test_chains_left_whole(text, config):
    context, module, count = _tile(text, config)
    with context:
        assert count == 0
        assert not collect(module.operation, "scf.forall")


def test_a_softmax_with_a_second_user_is_no_chain():
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_attention(2, 16, 16, 4, 4, returns_probs=True))
        assert find_chains(module) == []
        module = ir.Module.parse(_attention(2, 16, 16, 4, 4, mask="add"))
        [chain] = find_chains(module)
        assert (chain.scores, chain.depth, chain.width, len(chain.between)) == (
            (2, 16, 16),
            4,
            4,
            7,  # scale, mask, max, subtract, exp, sum, divide
        )


def _chain(batch: int, rows: int, keys: int, depth: int) -> AttentionChain:
    return AttentionChain(
        last=None, first=None, scores=(batch, rows, keys), depth=depth, width=depth
    )


def test_the_row_block_from_l2_and_the_head_width():
    """VisionAttention's 8 x 1024 x 1024 scores (head dim 8, 4 KB a score row): 32 rows
    (``min_rows``) on x86-64-v4 and v3 (an eighth of their L2 holds 31 and 15); with a
    4 MB L2, 64 rows (512 KB). 4096 keys of head dim 64: 128 rows (``rows_per_width`` x
    (64 + 64)), past L2. Scores that fit the budget whole stay whole; a pinned block is
    rounded down to a divisor; a one-block unbatched chain is no tiling."""
    config = AttentionTiles()
    vision = _chain(8, 1024, 1024, 8)
    assert row_block(vision, _V4, config) == 32
    assert row_block(vision, _V3, config) == 32
    large_l2 = target_from_override(**{**_V4.model_dump(), "l2_bytes": 4 << 20})
    assert row_block(vision, large_l2, config) == 64
    assert row_block(_chain(2, 4096, 4096, 64), _V4, config) == 128
    assert row_block(_chain(2, 4096, 4096, 64), _V4, AttentionTiles(rows_per_width=0)) == 32
    assert row_block(_chain(8, 32, 32, 8), _V4, config) is None
    assert row_block(vision, _V4, AttentionTiles(row_block=100)) == 64
    assert row_block(vision, _V4, AttentionTiles(enabled=False)) is None
    assert row_block(_chain(1, 1024, 1024, 8), _V4, AttentionTiles(row_block=4096)) is None


@pytest.mark.parametrize(
    ("b", "m", "n", "d", "e", "mask", "rows", "heads"),
    [
        (3, 45, 40, 8, 6, "", 10, 0),
        (2, 33, 48, 16, 16, "causal", 11, 0),
        (2, 20, 37, 5, 7, "add", 4, 0),
        (0, 30, 32, 8, 8, "causal", 6, 0),
        (2, 24, 40, 8, 8, "causal", 8, 3),
    ],
    ids=["odd-batched", "causal", "additive-mask", "unbatched", "heads-causal"],
)
def test_tiled_attention_matches_numpy(tmp_path, b, m, n, d, e, mask, rows, heads):
    rng = np.random.default_rng(7)
    lead = (b * heads,) if heads else ((b,) if b else ())
    q = rng.standard_normal((*lead, m, d), dtype=np.float32)
    kt = rng.standard_normal((*lead, d, n), dtype=np.float32)
    v = rng.standard_normal((*lead, n, e), dtype=np.float32)
    mask_values = rng.standard_normal((m, n), dtype=np.float32)
    expected = _reference(q, kt, v, mask, mask_values.astype(np.float64))
    payload = tmp_path / "attention.mlir"
    payload.write_text(_attention(b, m, n, d, e, mask, heads=heads))
    np.savez(
        tmp_path / "attention.npz",
        in0=q,
        in1=kt,
        in2=v,
        in3=mask_values,
        out0=expected.astype(np.float32),
    )
    graph = load_graph("x86").with_config("normalize", attention={"row_block": rows})
    dumped = tmp_path / "ir"
    report = sg.run(graph, str(payload), threads=1, target="x86-64-v3", dump_ir=str(dumped))
    assert report.verified is True, report
    [normalized] = [p for p in dumped.iterdir() if "normalize" in p.name]
    with new_context():
        module = ir.Module.parse(normalized.read_text())
        assert len(collect(module.operation, lambda op: LOOP_ATTR in op.attributes)) == 1
