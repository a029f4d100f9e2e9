"""Register tiles of several K blocks start from zero and add packed C after the k loop.

With several K blocks, the register tiles accumulate into a packed C: a pass fills it with
C's initial value (zeros) before the K-block loop, and every tile of every K block loads its
accumulators from it, runs the k loop and stores them back. This rewrite (after the
schedule, on tensors) changes two things:

- In the first K block those loads only read back the fill. Each tile of it starts from
  the fill value instead (``scf.if`` on the K-block index), and the fill pass is dropped:
  packed C starts uninitialized, since the first K block writes every tile of it. Saved:
  one pass writing packed C (a memset, run by one thread when it is too small for a
  parallel loop) and one pass of tile loads.
- In the later K blocks the k loop starts from zeros and packed C is added after it
  (``vaddps`` from memory) instead of loaded before it. Packed C spans all of C, so a
  tile's lines come from L3; loaded first, the k loop's first FMAs wait for them, while
  added last, the loads issue ahead of the loop's end (out of order) and the FMAs never
  wait (measured: docs/measurements.md, "Design decisions: the packed matmul kernel").

The schedule marks the K-block loops it made (:data:`K_BLOCKS_ATTR`). A loop is rewritten
only when its packed C comes from a fill pass of a value defined outside it into an empty
tensor, and every read of packed C inside the loop is an accumulator load of a register
tile (a ``vector.transfer_read`` that starts a k loop); otherwise it is left as it is.
"""

from __future__ import annotations

from typing import Any

from stagegraph.mlir.bindings import arith, ir, scf
from stagegraph.mlir.constants import is_zero, zeros
from stagegraph.mlir.walk import collect, defining_op, nested_in

#: Set by the matmul schedule on each K-block loop whose first iteration may start from
#: the fill (removed by :func:`start_first_k_block_from_fill`).
K_BLOCKS_ATTR = "stagegraph.k_blocks"

# Ops through which packed C flows inside the K-block loop without being read.
_PASS_THROUGH = frozenset(
    {
        "tensor.extract_slice",
        "tensor.insert_slice",
        "tensor.parallel_insert_slice",
        "vector.transfer_write",
        "scf.for",
        "scf.forall",
        "scf.yield",
        "scf.forall.in_parallel",
    }
)


def start_first_k_block_from_fill(payload: Any) -> int:
    """Rewrite every marked K-block loop of ``payload`` (an ``ir.Module`` or op) that
    qualifies (see the module docstring); strip the marks. Returns how many were
    rewritten."""
    rewritten = 0
    for kloop in collect(payload, lambda op: K_BLOCKS_ATTR in op.attributes):
        del kloop.attributes[K_BLOCKS_ATTR]
        rewritten += _rewrite(kloop)
    return rewritten


def _rewrite(kloop: Any) -> int:
    if kloop.name != "scf.for" or len(kloop.results) != 1:
        return 0
    init = kloop.operands[3]
    fill = _fill_pass(init)
    if fill is None:
        return 0
    fill_op, empty, value = fill
    body = kloop.regions[0].blocks[0]
    reads = _accumulator_reads(body.arguments[1])
    if not reads or any(ir.VectorType(r.results[0].type) != value.type for r in reads):
        return 0
    with ir.InsertionPoint.at_block_begin(body), kloop.location:
        first = arith.CmpIOp(arith.CmpIPredicate.eq, body.arguments[0], kloop.operands[0]).result
    for read in reads:
        _add_after_k_loop(read, first, value)
    kloop.operands[3] = empty
    if not list(fill_op.results[0].uses):
        fill_op.erase()
    return 1


def _fill_pass(init: Any) -> tuple[Any, Any, Any] | None:
    """(the op, its empty destination, the vector written) when ``init`` is the result of
    a loop nest that only writes one vector value, defined outside it, into the tiles of a
    ``tensor.empty``."""
    if not isinstance(init.owner, ir.Operation | ir.OpView):
        return None
    op = init.owner.operation
    if op.name not in ("scf.for", "scf.forall") or len(op.results) != 1:
        return None
    dest = op.operands[_first_init(op)]
    if not isinstance(dest.owner, ir.Operation | ir.OpView) or dest.owner.name != "tensor.empty":
        return None
    writes = collect(op, "vector.transfer_write")
    values = {w.operands[0] for w in writes}
    if len(values) != 1 or any(w.name not in _FILL_NEST for w in collect(op)):
        return None
    (value,) = values
    if nested_in(defining_op(value), {op}):
        return None
    return op, dest, value


# Ops a fill pass's loop nest is made of: tiling, and the vector write of the fill value.
_FILL_NEST = _PASS_THROUGH | {"affine.apply", "affine.min", "arith.constant"}


def _first_init(loop: Any) -> int:
    """The operand index of the first initial value (iter_arg / shared output) of an
    ``scf.for`` or ``scf.forall``."""
    return 3 if loop.name == "scf.for" else len(loop.operands) - len(loop.results)


def _accumulator_reads(packed: Any) -> list[Any]:
    """The accumulator loads among the uses of ``packed`` (followed through slices and
    loop-carried values), or [] when packed C is used any other way."""
    reads: list[Any] = []
    pending, seen = [packed], set()
    while pending:
        value = pending.pop()
        for use in value.uses:
            user = use.owner.operation
            if user.name == "vector.transfer_read":
                if not _starts_a_k_loop(user):
                    return []
                reads.append(user)
                continue
            if user.name not in _PASS_THROUGH or not _overwrites(user, use.operand_number):
                return []
            for carried in _carried(user, use.operand_number):
                if carried not in seen:
                    seen.add(carried)
                    pending.append(carried)
    return reads


def _overwrites(user: Any, operand: int) -> bool:
    """False for a masked ``vector.transfer_write`` into packed C: the lanes it leaves
    would keep what the fill wrote. (The register tiles cover packed C, padding included,
    with unmasked writes: the first K block writes all of it.)"""
    if user.name != "vector.transfer_write" or operand != 1:
        return True
    return user.opview.mask is None


def _carried(user: Any, operand: int) -> list[Any]:
    """Where packed C flows from operand ``operand`` of ``user``: a loop's region argument
    and its result for its initial value, a slice's or a write's result."""
    name = user.name
    if name in ("scf.for", "scf.forall"):
        i = operand - _first_init(user)
        if i < 0:
            return []
        arguments = user.regions[0].blocks[0].arguments  # (its iter_args / outputs last)
        return [arguments[len(arguments) - len(user.results) + i], user.results[i]]
    if name in ("tensor.extract_slice", "tensor.insert_slice", "vector.transfer_write"):
        return [user.results[0]]
    return []  # a yield: the loop's result is followed from its initial value


def _starts_a_k_loop(read: Any) -> bool:
    """A register tile's accumulator load: its only use is a loop's initial value."""
    uses = list(read.results[0].uses)
    return len(uses) == 1 and uses[0].owner.name == "scf.for" and uses[0].operand_number >= 3


def _add_after_k_loop(read: Any, first: Any, value: Any) -> None:
    """Start the k loop that ``read`` (a register tile's accumulator load) feeds from zeros,
    and add ``first ? value : read`` to its result, loading only when not first."""
    (use,) = list(read.results[0].uses)
    kloop, operand = use.owner, use.operand_number
    vtype = ir.VectorType(read.results[0].type)
    with ir.InsertionPoint(kloop), kloop.location:
        kloop.operands[operand] = zeros(vtype)
    product = kloop.results[operand - _first_init(kloop)]
    users = [u.owner for u in product.uses]
    add = arith.AddFOp if isinstance(vtype.element_type, ir.FloatType) else arith.AddIOp
    with ir.InsertionPoint.after(kloop), kloop.location:
        choice = scf.IfOp(first, [vtype], has_else=True)
        with ir.InsertionPoint(choice.then_block):
            # A zero fill adds nothing: the product as it is. (Adds in both branches let
            # LLVM merge them behind a phi of the two addends, which spills the loaded
            # tile to the stack.)
            scf.YieldOp([product if is_zero(value) else add(product, value).result])
        with ir.InsertionPoint(choice.else_block):
            added = add(product, read.results[0])
            scf.YieldOp([added.result])
    read.move_before(added.operation)
    for user in users:
        for i, operand_value in enumerate(user.operands):
            if operand_value == product:
                user.operands[i] = choice.results[0]
