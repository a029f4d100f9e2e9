"""Roll runs of identical steps of a function back into an ``scf.for``.

An importer that unrolls a recurrent network leaves one copy of the cell per time step.
:mod:`stagegraph.stages.common.dedup` already makes each copy a few calls of shared
functions, but the entry still holds every step's calls, slices and reshapes: an unrolled
GRU's entry lowers to ~135k LLVM ops, and lowering plus LLVM's passes over that one
straight-line function then cost more than everything else of the compile. Rolled into a
loop, the entry holds one step.

A run is found by structure alone (:func:`roll_repeated`): ``k`` consecutive stretches of
the entry's top-level ops with equal op names, result types and attributes. It is rolled
only when the IR proves the loop computes the same values. Every operand of a step's op
must be, in every step, one of:

* a value of the same step, at the same position (``internal``);
* the same value defined before the run (``invariant``);
* the previous step's value at one position, the first step's being defined before the
  run (``carried``: an ``iter_arg``);
* a chain of static slices and reshapes of one value defined before the run, equal in
  every step but for slice offsets that advance by a constant stride (``chain``: rebuilt
  in the loop from the induction variable).

Every value a step produces must be used after the run only in the last step (the loop
yields it), or in every step by one ``tensor.concat`` whose operands they are, in step
order or reverse step order (the loop inserts each into an accumulator at its offset).
The steps may hold only ops without side effects: static slices and reshapes, empties,
constants and calls of functions the caller vouches for (``pure_callees``), so the loop
runs the same ops, in the same order, on the same values.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from stagegraph.mlir.bindings import arith, bufferization, ir, scf, tensor
from stagegraph.mlir.walk import top_level_ops
from stagegraph.stages.common.dedup import significant_attributes
from stagegraph.stages.common.roll_runs import (
    VIEW_OPS,
    Run,
    Signatures,
    best_phase,
    next_run,
)


@dataclass
class Chain:
    """Slices and reshapes of ``root`` that give one operand in every step: per op (root
    side first) iteration 0's op and, for a slice whose offsets advance, (base, stride)
    per dimension."""

    root: Any
    levels: list[tuple[Any, list[tuple[int, int]] | None]]


@dataclass
class Collector:
    """A ``tensor.concat`` (``concat``) taking one result of every step, step ``i`` at
    operand ``first + sign * i``; ``offsets`` are its operands' offsets along ``dim``."""

    position: tuple[int, int]
    concat: Any
    first: int
    sign: int
    dim: int
    offsets: list[int]


@dataclass
class Plan:
    """How one run becomes a loop (see the module docstring for the operand kinds)."""

    steps: list[list[Any]]
    operands: dict[tuple[int, int], tuple[str, Any]] = field(default_factory=dict)
    carried: dict[tuple[int, int], Any] = field(default_factory=dict)  # position -> init
    yielded: list[tuple[int, int]] = field(default_factory=list)  # last step's, not carried
    collectors: list[Collector] = field(default_factory=list)
    chains: list[list[Any]] = field(default_factory=list)  # per chain, every step's value


def _chain(values: Sequence[Any]) -> Chain | None:
    """The chain of slices and reshapes giving ``values`` (one per step) from one common
    value, or None when they do not come from one that way."""
    levels: list[tuple[Any, list[tuple[int, int]] | None]] = []
    current = list(values)
    while not all(v == current[0] for v in current):
        owners = [v.owner for v in current]
        if any(isinstance(o, ir.Block) for o in owners):
            return None
        ops = [o.operation for o in owners]
        first = ops[0]
        if first.name not in VIEW_OPS or len(first.operands) != 1:
            return None
        skip = ("static_offsets",) if first.name == "tensor.extract_slice" else ()
        attrs = significant_attributes(first, skip)
        for op in ops:
            if (
                op.name != first.name
                or len(op.operands) != 1
                or op.results[0].type != first.results[0].type
                or significant_attributes(op, skip) != attrs
            ):
                return None
        strides = None
        if skip:
            offsets = [list(ir.DenseI64ArrayAttr(op.attributes["static_offsets"])) for op in ops]
            step = [b - a for a, b in zip(offsets[0], offsets[1], strict=True)]
            for i, row in enumerate(offsets):
                if any(row[d] != offsets[0][d] + i * step[d] for d in range(len(row))):
                    return None
            strides = list(zip(offsets[0], step, strict=True))
        levels.append((first, strides))
        current = [op.operands[0] for op in ops]
    if not levels:
        return None
    levels.reverse()
    return Chain(current[0], levels)


def plan(ops: Sequence[Any], run: Run) -> Plan | None:
    """How to roll ``run`` of ``ops`` into a loop, or None if the IR does not prove the
    loop equivalent (see the module docstring)."""
    k, period = run.trips, run.period
    steps = [list(ops[run.start + i * period : run.start + (i + 1) * period]) for i in range(k)]
    where: dict[Any, tuple[int, int]] = {}
    for i, step in enumerate(steps):
        for j, op in enumerate(step):
            where[op] = (i, j)
    result = Plan(steps)

    def info(value: Any) -> tuple[int, int, int] | None:
        owner = value.owner
        if isinstance(owner, ir.Block):
            return None
        at = where.get(owner.operation)
        if at is None:
            return None
        return at[0], at[1], ir.OpResult(value).result_number

    chains: dict[tuple[Any, ...], int] = {}
    for j, op in enumerate(steps[0]):
        for q in range(len(op.operands)):
            values = [step[j].operands[q] for step in steps]
            infos = [info(v) for v in values]
            kind = _classify(values, infos, result, chains)
            if kind is None:
                return None
            result.operands[(j, q)] = kind
    if not _outputs(steps, where, result):
        return None
    return result


def _classify(
    values: list[Any], infos: list[Any], result: Plan, chains: dict[tuple[Any, ...], int]
) -> tuple[str, Any] | None:
    first = infos[0]
    if first is not None:
        if first[0] == 0 and all(x == (i, first[1], first[2]) for i, x in enumerate(infos)):
            return ("internal", first[1:])
        return None
    if all(x is None for x in infos) and all(v == values[0] for v in values):
        return ("invariant", values[0])
    rest = infos[1:]
    if rest[0] is not None and all(x == (i, rest[0][1], rest[0][2]) for i, x in enumerate(rest)):
        position = (rest[0][1], rest[0][2])
        init = result.carried.setdefault(position, values[0])
        return ("carried", position) if init == values[0] else None
    if any(x is not None for x in infos):
        return None
    key = tuple(values)
    if key not in chains:
        chain = _chain(values)
        if chain is None:
            return None
        chains[key] = len(result.chains)
        result.chains.append([chain, values])
    return ("chain", result.chains[chains[key]][0])


def _outputs(steps: list[list[Any]], where: dict[Any, Any], result: Plan) -> bool:
    """Find how each step's results are used after the run; False if not as allowed."""
    for j, op in enumerate(steps[0]):
        for r in range(len(op.results)):
            outside = []
            for step in steps:
                uses = [
                    (use.owner.operation, use.operand_number)
                    for use in step[j].results[r].uses
                    if use.owner.operation not in where
                ]
                outside.append(uses)
            if not any(outside):
                continue
            collector = _collector(steps, (j, r), outside)
            if collector is not None:
                result.collectors.append(collector)
                outside = [[u for u in uses if u[0] != collector.concat] for uses in outside]
            if any(outside[:-1]):
                return False
            if outside[-1] and (j, r) not in result.carried:
                if not _static_tensor(steps[0][j].results[r].type):
                    return False
                result.yielded.append((j, r))
    concats = [c.concat for c in result.collectors]
    return len(set(concats)) == len(concats)


def _static_tensor(type_: Any) -> bool:
    return isinstance(type_, ir.RankedTensorType) and ir.RankedTensorType(type_).has_static_shape


def _collector(
    steps: list[list[Any]], position: tuple[int, int], outside: list[list[Any]]
) -> Collector | None:
    """The ``tensor.concat`` that takes the result at ``position`` of every step, in step
    order or reverse order, if there is one."""
    concats = [op for op, _ in outside[0] if op.name == "tensor.concat"]
    if not concats:
        return None
    concat = concats[0]
    numbers = []
    for uses in outside:
        mine = [n for op, n in uses if op == concat]
        if len(mine) != 1:
            return None
        numbers.append(mine[0])
    sign = numbers[1] - numbers[0]
    if sign not in (1, -1) or any(n != numbers[0] + sign * i for i, n in enumerate(numbers)):
        return None
    dim = ir.IntegerAttr(concat.attributes["dim"]).value
    offsets, at = [], 0
    for operand in concat.operands:
        if not _static_tensor(operand.type):
            return None
        offsets.append(at)
        at += ir.RankedTensorType(operand.type).shape[dim]
    if not _static_tensor(concat.results[0].type):
        return None
    return Collector(position, concat, numbers[0], sign, dim, offsets)


def _index(value: int) -> Any:
    return arith.ConstantOp(ir.IndexType.get(), value).result


def _affine(iv: Any, base: int, stride: int) -> Any:
    """``base + iv * stride`` as index arithmetic."""
    scaled = arith.MulIOp(iv, _index(stride)).result
    return arith.AddIOp(scaled, _index(base)).result if base else scaled


def _slice(source: Any, result_type: Any, template: Any, iv: Any, strides: Any) -> Any:
    """``template`` (a static ``tensor.extract_slice``) with offsets ``base + iv * stride``."""
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    static, values = [], []
    for base, stride in strides:
        if stride:
            static.append(dynamic)
            values.append(_affine(iv, base, stride))
        else:
            static.append(base)
    sizes = template.attributes["static_sizes"]
    unit = template.attributes["static_strides"]
    return tensor.ExtractSliceOp(result_type, source, values, [], [], static, sizes, unit).result


def _build_chain(chain: Chain, iv: Any) -> Any:
    value = chain.root
    for op, strides in chain.levels:
        if strides is not None and any(s for _, s in strides):
            value = _slice(value, op.results[0].type, op, iv, strides)
            continue
        copy = op.clone()
        copy.operands[0] = value
        value = copy.results[0]
    return value


def _insert(value: Any, into: Any, dim: int, offset: Any) -> Any:
    """``tensor.insert_slice`` of ``value`` into ``into`` at ``offset`` (int or index
    value) along ``dim``, zero along the others."""
    shape = ir.RankedTensorType(value.type).shape
    static = [0] * len(shape)
    values = []
    if isinstance(offset, int):
        static[dim] = offset
    else:
        static[dim] = ir.ShapedType.get_dynamic_stride_or_offset()
        values.append(offset)
    unit = [1] * len(shape)
    return tensor.InsertSliceOp(
        value, into, values, [], [], static, shape, unit, results=[into.type]
    ).result


def _into(value: Any, destination: Any) -> Any:
    """``value`` written into ``destination``'s buffer (a tensor equivalent to it)."""
    if not isinstance(value.type, ir.RankedTensorType):
        return value
    return bufferization.MaterializeInDestinationOp(value.type, value, destination).result


def _empty(type_: Any) -> Any:
    ranked = ir.RankedTensorType(type_)
    return tensor.EmptyOp(list(ranked.shape), ranked.element_type).result


def emit(found: Plan) -> Any:
    """Replace the run ``found`` describes by an ``scf.for``; returns the loop op."""
    steps = found.steps
    k = len(steps)
    first = steps[0][0]
    carried = list(found.carried)
    views = _chain_ops(found)  # before any op moves or goes
    with first.context, first.location, ir.InsertionPoint(first):
        inits = [found.carried[p] for p in carried]
        inits += [_empty(steps[0][j].results[r].type) for j, r in found.yielded]
        inits += [_empty(c.concat.results[0].type) for c in found.collectors]
        loop = scf.ForOp(_index(0), _index(k), _index(1), inits)
    args = list(loop.inner_iter_args)
    slot = {p: i for i, p in enumerate(carried)}
    body: dict[tuple[int, int], Any] = {}
    with first.context, first.location, ir.InsertionPoint(loop.body):
        iv = loop.induction_variable
        built: dict[int, Any] = {}
        for j, op in enumerate(steps[0]):
            operands = []
            for q in range(len(op.operands)):
                kind, what = found.operands[(j, q)]
                if kind == "internal":
                    operands.append(body[what])
                elif kind == "carried":
                    operands.append(args[slot[what]])
                elif kind == "invariant":
                    operands.append(what)
                else:
                    if id(what) not in built:
                        built[id(what)] = _build_chain(what, iv)
                    operands.append(built[id(what)])
            copy = op.clone()
            for q, value in enumerate(operands):
                copy.operands[q] = value
            for r, value in enumerate(copy.results):
                body[(j, r)] = value
        # Bufferization wants each yielded buffer to be its iter_arg's: the step's new
        # value is copied into the iter_arg's buffer (a step's state, a few KiB).
        yields = [_into(body[p], args[n]) for n, p in enumerate(carried + found.yielded)]
        base = len(yields)
        for n, c in enumerate(found.collectors):
            size = ir.RankedTensorType(body[c.position].type).shape[c.dim]
            offset = _affine(iv, c.offsets[c.first], c.sign * size)
            yields.append(_insert(body[c.position], args[base + n], c.dim, offset))
        scf.YieldOp(yields)
    results = list(loop.results)
    last = steps[-1]
    for p in carried + found.yielded:
        j, r = p
        index = slot[p] if p in slot else len(carried) + found.yielded.index(p)
        last[j].results[r].replace_all_uses_with(results[index])
    for n, c in enumerate(found.collectors):
        taken = {c.first + c.sign * i for i in range(k)}
        with first.context, c.concat.location, ir.InsertionPoint(c.concat):
            value = results[base + n]
            for p, operand in enumerate(c.concat.operands):
                if p not in taken:
                    value = _insert(operand, value, c.dim, c.offsets[p])
        c.concat.results[0].replace_all_uses_with(value)
        c.concat.erase()
    for step in reversed(steps):
        for op in reversed(step):
            op.erase()
    for op in views:
        if not any(True for _ in op.results[0].uses):
            op.erase()
    return loop


def _chain_ops(found: Plan) -> list[Any]:
    """The slices and reshapes that gave the chains' values (each once), users first:
    erased after the run if nothing else reads them."""
    ops: list[Any] = []
    for chain, values in found.chains:
        for value in values:
            for _ in chain.levels:
                op = value.owner.operation
                if op not in ops:
                    ops.append(op)
                value = op.operands[0]
    return sorted(ops, key=functools.cmp_to_key(lambda a, b: -1 if b.is_before_in_block(a) else 1))


#: Ops with no effect but their results: erased from a step when nothing reads them.
UNUSED_OPS = VIEW_OPS | {"tensor.empty", "arith.constant", "linalg.fill"}


def erase_unused(fn: Any) -> int:
    """Erase the top-level ops of ``fn`` of :data:`UNUSED_OPS` whose results nothing reads
    (deduplication clones each group's fill into its function and leaves the original, so
    every step would otherwise hold a dead fill no step may hold); returns how many."""
    erased = 0
    for op in reversed(top_level_ops(fn)):
        if op.name not in UNUSED_OPS or not len(op.results):
            continue  # a fill of a buffer has no result, and writes
        if any(True for result in op.results for _ in result.uses):
            continue
        op.erase()
        erased += 1
    return erased


def roll_repeated(fn: Any, pure_callees: Set[str]) -> int:
    """Roll every run of identical steps of ``fn``'s body that provably computes the same
    as a loop (see the module docstring); returns how many loops were made.

    The body is scanned once, left to right: a run that cannot be rolled is skipped whole
    (its later suffixes would fail the same way), and after a loop is made the scan goes on
    after it, over the ops listed afresh (an erased op's Python object may stand for a new
    op, so nothing is kept across)."""
    erase_unused(fn)
    numbering: dict[Hashable, int] = {}
    rolled, start = 0, 0
    ops = top_level_ops(fn)[:-1]  # the terminator never repeats
    ids = Signatures(ops, pure_callees, numbering)
    while True:
        run = next_run(ids, start)
        if run is None:
            return rolled
        phased = best_phase(ops, ids, run)
        found = plan(ops, phased)
        if found is None:
            start = phased.start + phased.period * phased.trips
            continue
        loop = emit(found)
        rolled += 1
        ops = top_level_ops(fn)[:-1]
        start = ops.index(loop.operation) + 1
        ids = Signatures(ops, pure_callees, numbering)
