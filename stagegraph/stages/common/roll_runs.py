"""Finding runs of identical steps among a function's top-level ops, for
:mod:`stagegraph.stages.common.roll`: each op gets a signature id (equal ids: ops a step may
hold that agree in name, types and attributes), and a run is ``k`` consecutive stretches of
equal ids, started at the phase that carries fewest values across steps."""

from __future__ import annotations

from collections.abc import Hashable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from stagegraph.mlir.bindings import ir
from stagegraph.stages.common.dedup import significant_attributes

#: Ops a chain from an outside value to a step's operand may consist of (single operand).
VIEW_OPS = frozenset({"tensor.extract_slice", "tensor.collapse_shape", "tensor.expand_shape"})

#: Ops a rolled step may hold (``func.call`` only of the caller's pure callees).
STEP_OPS = VIEW_OPS | {"tensor.empty", "arith.constant", "func.call"}

#: Longest step (in top-level ops) looked for; an unrolled cell is a dozen or two.
MAX_PERIOD = 128

#: Fewest steps worth a loop.
MIN_TRIPS = 2


@dataclass(frozen=True)
class Run:
    """``trips`` consecutive steps of ``period`` ops each, from op ``start`` of a list."""

    start: int
    period: int
    trips: int


def _callee(op: Any) -> str:
    return ir.FlatSymbolRefAttr(op.attributes["callee"]).value


def signature(op: Any, pure_callees: Set[str]) -> Hashable | None:
    """What two ops at the same position of two steps must share, or None for an op no
    step may hold."""
    if op.name not in STEP_OPS or len(op.regions):
        return None
    if op.name == "func.call" and _callee(op) not in pure_callees:
        return None
    return (
        op.name,
        tuple(value.type for value in op.operands),  # a carried init then types as the yield
        tuple(result.type for result in op.results),
        significant_attributes(op),
    )


class Signatures(Sequence[int]):
    """Signature ids of a list of ops (equal ids: equal :func:`signature`; an op no step may
    hold gets a negative id of its own), computed as the scan reaches each op."""

    def __init__(self, ops: Sequence[Any], pure_callees: Set[str], numbering: dict) -> None:
        self.ops, self.pure, self.numbering = ops, pure_callees, numbering
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ops)

    def __getitem__(self, index: Any) -> Any:
        stop = index.stop if isinstance(index, slice) else index + 1
        for n in range(len(self.ids), min(stop, len(self.ops))):
            sig = signature(self.ops[n], self.pure)
            self.ids.append(
                -1 - n if sig is None else self.numbering.setdefault(sig, len(self.numbering))
            )
        return self.ids[index]


def next_run(ids: Sequence[int], start: int = 0) -> Run | None:
    """The first candidate run from op ``start`` of a list of signature ids (a negative id
    never matches): at the first op where one starts, the period covering most ops."""
    n = len(ids)
    for i in range(start, n):
        best: Run | None = None
        near = ids[i : i + MAX_PERIOD + 1]  # one plain list: most periods fail on its ids
        if near[0] < 0:
            continue
        for period in range(1, min(MAX_PERIOD, (n - i) // 2) + 1):
            if near[period] != near[0]:
                continue
            trips = _trips(ids, i, period)
            if trips >= MIN_TRIPS and (best is None or trips * period > best.trips * best.period):
                best = Run(i, period, trips)
        if best is not None:
            return best
    return None


def _trips(ids: Sequence[int], start: int, period: int) -> int:
    head = ids[start : start + period]
    if len(head) < period or min(head) < 0:
        return 0
    trips = 1
    while ids[start + trips * period : start + (trips + 1) * period] == head:
        trips += 1
    return trips


def _crossings(ops: Sequence[Any], run: Run) -> int:
    """Operands of a middle step that read the step before it: what a loop starting at
    this phase carries (a phase cutting a step in two carries more)."""
    middle = run.start + (run.trips // 2) * run.period
    before = set(ops[middle - run.period : middle])
    count = 0
    for op in ops[middle : middle + run.period]:
        for value in op.operands:
            owner = value.owner
            if not isinstance(owner, ir.Block) and owner.operation in before:
                count += 1
    return count


def best_phase(ops: Sequence[Any], ids: Sequence[int], run: Run) -> Run:
    """``run`` or the same period started up to a period later, whichever carries fewest
    values across steps (ties: the earliest)."""
    best, fewest = run, _crossings(ops, run)
    for shift in range(1, run.period):
        trips = _trips(ids, run.start + shift, run.period)
        if trips < MIN_TRIPS:
            break
        candidate = Run(run.start + shift, run.period, trips)
        crossings = _crossings(ops, candidate)
        if crossings < fewest:
            best, fewest = candidate, crossings
    return best
