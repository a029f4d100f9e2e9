"""Constant weights are packed once, at compile time, into the panels the kernel reads.

The packed kernel reads B as ``reg_n``-column panels contiguous over k, ``[N/reg_n, K,
reg_n]`` (:mod:`.packed_kernel`). A weight that is a compile-time constant (``nn.Linear``'s,
imported as an ``arith.constant``, usually read through a transpose) would be packed into
that layout on every call: a pass that reads all of B, transposes it when B is stored
``[n, k]``, and writes it again, as long as the register tiles themselves when M is small
(a batch of 16 against a 4096x4096 weight: one FMA per B element per 16 lanes).

:func:`prepack_constant_weights` evaluates such a constant (``constant_gathers.evaluate_constants``:
``dense_resource`` blobs are not readable through the bindings), lays it out as the panels
with numpy, and replaces the matmul's B by ``linalg.unpack`` of the packed constant
(``outer_dims_perm = [1, 0]``: the packing the kernel applies, inverted). The schedule fuses
that unpack into each parallel block (``schedule._schedule_site``); there the kernel's pack
of B meets it, and canonicalization folds the pair away
(``pack(unpack(x)) -> x``): the register tiles read slices of the packed constant, and no
packing of B runs at all (``MatmulSite.prepacked_b``; ``packed_kernel`` then skips B's
packing steps).

Only where the fold is exact: f32, B not widened, every column block whole panels
(``params.whole_b_panels``: no padded panel, no narrower last block), the packed kernel
(``pack``) and no shared packing of B among threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.matmul.canonical import SITE_ATTR, MatmulSite
from stagegraph.stages.x86.matmul.params import MatmulParams, whole_b_panels

#: Weights with more elements are left packed per call (the probe would hold two copies).
MAX_PREPACK_ELEMENTS = 1 << 26  # 256 MiB of f32: an 8192x8192 weight


def prepackable(site: MatmulSite, params: MatmulParams) -> bool:
    """Whether ``site``'s B, if constant, can be packed at compile time with ``params``."""
    return (
        params.pack
        and site.dtype == "f32"
        and not site.widened[1]
        and whole_b_panels(site.n, params)
        and site.n * site.k <= MAX_PREPACK_ELEMENTS
        and not (params.share_b and params.threads > 1)
    )


def pack_panels(b: np.ndarray, reg_n: int, transposed: bool) -> np.ndarray:
    """B (``[k, n]``, or ``[n, k]`` when ``transposed``) as ``[n / reg_n, k, reg_n]``
    panels: panel ``j`` holds columns ``j * reg_n ...`` of B, row by row over k."""
    if transposed:
        n, k = b.shape
        return np.ascontiguousarray(b.reshape(n // reg_n, reg_n, k).transpose(0, 2, 1))
    k, n = b.shape
    return np.ascontiguousarray(b.reshape(k, n // reg_n, reg_n).transpose(1, 0, 2))


def prepack_constant_weights(
    payload: Any,
    labelled: Sequence[tuple[int, MatmulSite]],
    params: Sequence[MatmulParams],
) -> list[tuple[int, MatmulSite]]:
    """Pack every prepackable site's constant B at compile time (see the module doc);
    returns ``labelled`` with those sites marked ``prepacked_b`` (B no longer transposed:
    the unpack yields ``[k, n]``)."""
    from stagegraph.stages.common.constant_gathers import evaluate_constants

    by_label = {
        ir.IntegerAttr(op.attributes[SITE_ATTR]).value: op
        for op in collect(
            payload, lambda op: op.name == "linalg.matmul" and SITE_ATTR in op.attributes
        )
    }
    chosen = []
    for (label, site), site_params in zip(labelled, params, strict=True):
        mm = by_label.get(label)
        constant = _constant_operand(mm, 1) if mm is not None else None
        if constant is not None and prepackable(site, site_params):
            chosen.append((label, site, site_params, mm, constant))
    if not chosen:
        return list(labelled)
    # A weight several matmuls read (an unrolled recurrent network's steps) is evaluated
    # and packed once per layout; the packed constants are equal attributes, one global.
    unique: list[Any] = []
    for *_, constant in chosen:
        if not any(constant == seen for seen in unique):
            unique.append(constant)
    values = evaluate_constants(payload, unique)
    packed: dict[tuple[int, int, bool], np.ndarray] = {}
    done = {}
    for label, site, site_params, mm, constant in chosen:
        which = next(i for i, seen in enumerate(unique) if constant == seen)
        key = (which, site_params.reg_n, site.transpose_b)
        if key not in packed:
            value = np.asarray(values[which])
            packed[key] = pack_panels(value, site_params.reg_n, site.transpose_b)
        _replace_b(mm, packed[key], site_params.reg_n)
        done[label] = site.model_copy(update={"prepacked_b": True, "transpose_b": False})
    return [(label, done.get(label, site)) for label, site in labelled]


def _constant_operand(op: Any, index: int) -> Any | None:
    """The ``arith.constant`` defining operand ``index`` of ``op``, if any."""
    owner = op.operands[index].owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return None
    owner = owner.operation
    return owner if owner.name == "arith.constant" else None


def _replace_b(mm: Any, panels: np.ndarray, reg_n: int) -> None:
    """Make ``mm`` read B as the unpack of the ``panels`` constant, with B's map
    ``(m, n, k) -> (k, n)``."""
    from stagegraph.mlir.bindings import arith, linalg_native, linalg_ops, tensor

    k = panels.shape[1]
    n = panels.shape[0] * reg_n
    f32 = ir.F32Type.get(mm.context)
    with ir.InsertionPoint(mm), mm.location:
        packed_type = ir.RankedTensorType.get(list(panels.shape), f32)
        packed = arith.ConstantOp(packed_type, ir.DenseElementsAttr.get(panels, type=f32))
        empty = tensor.EmptyOp([k, n], f32)
        # The generated op class, not the OpDSL module (``linalg.unpack``), whose import
        # costs a tenth of a small model's compile (tests/test_analysis.py).
        unpacked = linalg_ops.UnPackOp(
            empty.result.type, packed.result, empty.result, [1], [], [reg_n],
            outer_dims_perm=[1, 0],
        ).result  # fmt: skip
    old = mm.operands[1].owner.operation
    mm.operands[1] = unpacked
    maps = [ir.AffineMapAttr(m).value for m in linalg_native.get_indexing_maps(mm)]
    results = list(maps[1].results)
    positions = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in results]
    if positions == [1, 2]:  # B was read [n, k]: now [k, n]
        maps[1] = ir.AffineMap.get(3, 0, [results[1], results[0]])
        mm.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])
    if not list(old.results[0].uses):
        old.erase()
