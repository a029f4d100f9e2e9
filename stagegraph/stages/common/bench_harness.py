"""The benchmark harness: a function spliced into the IR around the payload entry.

``<entry>_bench(args..., outs..., warmup: i64, repeat: i64, timings: memref<?xi64>)``
calls the payload ``warmup`` times, then ``repeat`` times, storing each call's duration in
nanoseconds into ``timings``. Time is read inside the compiled code with libc's
``clock_gettime(CLOCK_MONOTONIC)`` (the wheel has no ``rtclock`` runtime), so a
measurement costs no Python and no FFI crossing.

The wrapper is built from the entry's signature at the point where it is inserted:

* tensor level: tensor arguments pass through and each tensor result is copied into a
  destination memref argument (``bufferization.materialize_in_destination``), which keeps
  the results observable so LLVM cannot delete the work. The timed call then includes the
  payload's result allocation and that copy. The wrapper is bufferized and lowered with
  the payload (``BUFFERIZE`` + ``LOWER_TO_LLVM``).
* buffer level (after ``BUFFERIZE``): memref arguments, out-parameters included, pass
  through unchanged; only the payload is timed.

Wrapper functions carry the unit attribute ``stagegraph.wrapper`` so analyses skip them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stagegraph.errors import WrapperError
from stagegraph.mlir.functions import WRAPPER_ATTR, find_function
from stagegraph.runtime.memref import (
    OUTPUTS_ATTR,
    CallableBinary,
    coerce,
    record_signature,
)

CLOCK = "clock_gettime"
CLOCK_MONOTONIC = 1


def is_wrapper(op: Any) -> bool:
    """True for functions inserted by a wrapper stage (analyses skip them)."""
    return WRAPPER_ATTR in op.attributes


def bench_entry_name(entry: str) -> str:
    """The name of the benchmark wrapper around the payload function ``entry``: what the
    wrapper stage inserts and every timer calls."""
    return f"{entry}_bench"


def insert_bench_wrapper(module: Any, entry: str, *, name: str | None = None) -> str:
    """Add a benchmark entry point around ``entry`` and return its name.

    Args:
        module: an ``ir.Module`` at the tensor or buffer level; modified in place.
        entry: the payload function to time.
        name: the wrapper's name (default ``<entry>_bench``).

    Raises:
        WrapperError: ``entry`` is missing, already lowered to LLVM, a declaration, or has
            an argument or result the wrapper cannot pass (e.g. a memref or scalar result).
    """
    from stagegraph.mlir.bindings import ir

    name = name or bench_entry_name(entry)
    op = find_function(module, entry)
    if op is None:
        raise WrapperError(f"cannot wrap {entry!r}: no function of that name in the module")
    if op.operation.name != "func.func":
        raise WrapperError(
            f"cannot wrap {entry!r}: it is already lowered to the LLVM dialect; insert the "
            "benchmark wrapper at the tensor or buffer level"
        )
    if not len(op.regions[0].blocks):
        raise WrapperError(f"cannot wrap {entry!r}: it is a declaration without a body")
    if find_function(module, name) is not None:
        raise WrapperError(f"cannot wrap {entry!r}: a function named {name!r} already exists")

    with module.context, ir.Location.unknown():
        ftype = ir.TypeAttr(op.attributes["function_type"]).value
        args, results = list(ftype.inputs), list(ftype.results)
        _check(entry, args, results)
        outs = [_destination(t) for t in results]
        flags = _payload_flags(op, args, results)
        i64 = ir.IntegerType.get_signless(64)
        timings = ir.MemRefType.get([ir.ShapedType.get_dynamic_size()], i64)
        clock = _declare_clock(module)
        with ir.InsertionPoint(module.body):
            wrapper = _build(entry, name, args, results, outs, i64, timings, clock)
        wrapper.attributes[WRAPPER_ATTR] = ir.UnitAttr.get()
    record_signature(module, name, outputs=[*flags, *[True] * len(outs), False, False, True])
    return name


def _check(entry: str, args: Sequence[Any], results: Sequence[Any]) -> None:
    from stagegraph.mlir.bindings import ir

    passable = (ir.RankedTensorType, ir.MemRefType, ir.IntegerType, ir.IndexType, ir.FloatType)
    for i, t in enumerate(args):
        if not isinstance(t, passable):
            raise WrapperError(f"cannot wrap {entry!r}: argument #{i} has unsupported type {t}")
    for i, t in enumerate(results):
        if isinstance(t, ir.MemRefType):
            raise WrapperError(
                f"cannot wrap {entry!r}: result #{i} is a memref ({t}); run "
                "buffer-results-to-out-params (lowering.BUFFERIZE) first"
            )
        if not isinstance(t, ir.RankedTensorType):
            raise WrapperError(
                f"cannot wrap {entry!r}: result #{i} of type {t} would be unobservable; only "
                "ranked tensor results are supported"
            )


def _destination(tensor_type: Any) -> Any:
    from stagegraph.mlir.bindings import ir

    return ir.MemRefType.get(tensor_type.shape, tensor_type.element_type)


def _payload_flags(op: Any, args: Sequence[Any], results: Sequence[Any]) -> list[bool]:
    """Which payload arguments are outputs (recorded at the buffer level, else none)."""
    from stagegraph.mlir.bindings import ir

    if not results and OUTPUTS_ATTR in op.attributes:
        flags = [bool(x) for x in ir.DenseBoolArrayAttr(op.attributes[OUTPUTS_ATTR])]
        if len(flags) == len(args):
            return flags
    return [False] * len(args)


def _declare_clock(module: Any) -> Any:
    """``func.func private @clock_gettime(i32, !llvm.ptr) -> i32`` (reused if present)."""
    from stagegraph.mlir.bindings import func, ir, llvm

    i32 = ir.IntegerType.get_signless(32)
    ftype = ir.FunctionType.get([i32, llvm.PointerType.get()], [i32])
    existing = find_function(module, CLOCK)
    if existing is not None:
        if existing.operation.name != "func.func" or (
            ir.TypeAttr(existing.attributes["function_type"]).value != ftype
        ):
            raise WrapperError(f"the module already defines {CLOCK!r} with another type")
        return existing
    with ir.InsertionPoint.at_block_begin(module.body):
        decl = func.FuncOp(CLOCK, ftype, visibility="private")
    decl.attributes[WRAPPER_ATTR] = ir.UnitAttr.get()
    return decl


def _build(
    entry: str,
    name: str,
    args: Sequence[Any],
    results: Sequence[Any],
    outs: Sequence[Any],
    i64: Any,
    timings_type: Any,
    clock: Any,
) -> Any:
    from stagegraph.mlir.bindings import arith, bufferization, func, ir, llvm, memref, scf

    wrapper = func.FuncOp(name, ir.FunctionType.get([*args, *outs, i64, i64, timings_type], []))
    block = wrapper.add_entry_block()
    n_args, n_outs = len(args), len(outs)
    payload_args = list(block.arguments)[:n_args]
    destinations = list(block.arguments)[n_args : n_args + n_outs]
    warmup, repeat, timings = list(block.arguments)[n_args + n_outs :]
    index = ir.IndexType.get()
    timespec = llvm.StructType.get_literal([i64, i64])

    with ir.InsertionPoint(block):
        one = arith.constant(i64, 1)
        # At function entry: an alloca inside the loops would grow the stack per iteration.
        spec = llvm.AllocaOp(llvm.PointerType.get(), one, timespec).result
        monotonic = arith.constant(ir.IntegerType.get_signless(32), CLOCK_MONOTONIC)
        billion = arith.constant(i64, 1_000_000_000)
        zero, step = arith.constant(index, 0), arith.constant(index, 1)

        def payload() -> None:
            call = func.CallOp(list(results), ir.FlatSymbolRefAttr.get(entry), payload_args)
            for value, dest in zip(call.results, destinations, strict=True):
                bufferization.MaterializeInDestinationOp(
                    None, value, dest, restrict=True, writable=True
                )

        def now() -> Any:
            func.CallOp(clock, [monotonic, spec])
            loaded = llvm.LoadOp(timespec, spec).result
            sec = llvm.ExtractValueOp(i64, loaded, [0]).result
            nsec = llvm.ExtractValueOp(i64, loaded, [1]).result
            return arith.addi(arith.muli(sec, billion), nsec)

        warm = scf.ForOp(zero, arith.index_cast(index, warmup), step)
        with ir.InsertionPoint(warm.body):
            payload()
            scf.YieldOp([])
        timed = scf.ForOp(zero, arith.index_cast(index, repeat), step)
        with ir.InsertionPoint(timed.body):
            start = now()
            payload()
            memref.StoreOp(arith.subi(now(), start), timings, [timed.induction_variable])
            scf.YieldOp([])
        func.ReturnOp([])
    return wrapper


def run_benchmark(
    binary: CallableBinary,
    bench_entry: str,
    inputs: Sequence[Any],
    warmup: int,
    repeat: int,
    *,
    outputs: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """Run a wrapper built by :func:`insert_bench_wrapper`; returns ``repeat`` durations (s).

    ``inputs`` are the payload's inputs; its outputs are allocated from the recorded
    signature unless given in ``outputs`` (then they hold the results afterwards).
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got {repeat=} {warmup=}")
    sig = binary.signature(bench_entry)
    tail = sig.args[-3:]
    if len(tail) < 3 or [(a.dtype, a.shape) for a in tail] != [
        ("i64", None),
        ("i64", None),
        ("i64", (None,)),
    ]:
        raise WrapperError(f"{bench_entry!r} is not a benchmark wrapper (see insert_bench_wrapper)")
    payload = sig.args[:-3]
    n_out = sum(a.output for a in payload)
    n_in = len(payload) - n_out
    if len(inputs) != n_in:
        raise ValueError(f"{bench_entry}: expected {n_in} inputs, got {len(inputs)}")
    if outputs is not None and len(outputs) != n_out:
        raise ValueError(f"{bench_entry}: expected {n_out} outputs, got {len(outputs)}")
    ins, outs = iter(inputs), iter(outputs or ())
    args: list[Any] = []
    for i, spec in enumerate(payload):
        if not spec.output:
            args.append(coerce(bench_entry, i, spec, next(ins)))
        elif outputs is None:
            args.append(spec.allocate())
        else:
            args.append(coerce(bench_entry, i, spec, next(outs)))
    timings = np.zeros(repeat, dtype=np.int64)
    binary.call_into(bench_entry, [*args, np.int64(warmup), np.int64(repeat), timings])
    return timings.astype(np.float64) * 1e-9
