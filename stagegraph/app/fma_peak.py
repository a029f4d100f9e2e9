"""The FMA peak of this machine, measured: a loop of independent vector FMAs, built and run
through the same lowering, OpenMP runtime and JIT as the graphs' code.

Why measure instead of computing units x lanes x 2 x clock: the clock the cores actually run
at (boost, a VM's share of the host, thermal limits) is in no file, and it drifts. The
benchmarks divide GFLOP/s by this number, measured in the same process as the kernels they
compare, to report a fraction of the FMA limit that holds on any host.

The loop keeps ``vector_registers - 4`` accumulator chains (12 on 16 registers, 28 on 32),
more than any x86 core's FMA latency x FMAs per cycle, so it is throughput-bound; each
chain is ``x = x * a + b`` on vectors of the target's width (see ``SCALE``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from stagegraph.stages.target import Target, detect_target

# Loop trips per call: long enough (half a millisecond on one Zen 1 core) that a call's fork
# and join on several threads cost little beside its FMAs.
TRIPS = 1 << 17
# Each chain is x <- SCALE x + OFFSET (= 1 - SCALE): it decays towards 1 (SCALE^TRIPS = 0.07,
# so the result still tells a chain that ran from one that did not). No chain may start at
# the fixed point 1: LLVM folds such a chain away (one FMA fewer per trip than counted).
SCALE, OFFSET = 0.99998, 0.00002


def chain_start(chain: int) -> float:
    """The value chain ``chain`` starts from (never the fixed point 1)."""
    return 2.0 + chain / 64


def _fma_loop_text(threads: int, lanes: int, chains: int) -> str:
    """A function ``main(out: memref<threads x lanes>)``: per thread, ``chains`` FMA chains
    over ``TRIPS`` trips, summed into the thread's row of ``out`` (so none is dead)."""
    vec = f"vector<{lanes}xf32>"
    names = [f"%x{c}" for c in range(chains)]
    inits = "\n".join(
        f"      %i{c} = arith.constant dense<{chain_start(c)}> : {vec}" for c in range(chains)
    )
    carried = ", ".join(f"{n} = %i{c}" for c, n in enumerate(names))
    steps = "\n".join(
        f"        %y{c} = vector.fma {n}, %a, %b : {vec}" for c, n in enumerate(names)
    )
    sums = [f"      %s0 = arith.addf %r#0, %r#1 : {vec}"]
    sums += [f"      %s{c - 1} = arith.addf %s{c - 2}, %r#{c} : {vec}" for c in range(2, chains)]
    return f"""
func.func @main(%out: memref<{threads}x{lanes}xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %trips = arith.constant {TRIPS} : index
  scf.forall (%t) in ({threads}) {{
      %a = arith.constant dense<{SCALE:e}> : {vec}
      %b = arith.constant dense<{OFFSET:e}> : {vec}
{inits}
      %r:{chains} = scf.for %i = %c0 to %trips step %c1 iter_args({carried})
          -> ({", ".join([vec] * chains)}) {{
{steps}
        scf.yield {", ".join(f"%y{c}" for c in range(chains))} : {", ".join([vec] * chains)}
      }}
{chr(10).join(sums)}
      vector.store %s{chains - 2}, %out[%t, %c0] : memref<{threads}x{lanes}xf32>, {vec}
  }}
  return
}}
"""


class FmaLoop(NamedTuple):
    """The compiled loop: ``run()`` runs it once into ``out`` (``threads x lanes``, each
    lane the sum of the chains), doing ``flops`` floating-point operations. ``binary``
    keeps the JIT's code alive for ``run``."""

    run: Callable[[], None]
    out: np.ndarray
    flops: float
    chains: int
    module: Any
    binary: Any


def build_fma_loop(threads: int = 1, target: Target | None = None) -> FmaLoop:
    """Lower and JIT the FMA loop for ``threads`` threads on ``target`` (default: the host),
    exactly as the x86 graph lowers its code (OpenMP for several threads)."""
    from stagegraph.core.ports import Module
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.runtime.jit import JitBinary
    from stagegraph.runtime.memref import record_signature
    from stagegraph.stages.common import lowering
    from stagegraph.stages.common.emit import runtime_libraries
    from stagegraph.stages.common.passes import run_lowering, run_pipeline

    target = target or detect_target()
    lanes, chains = max(1, target.vector_bits // 32), target.vector_registers - 4
    threads = max(1, threads)
    with new_context():
        module = Module(ir.Module.parse(_fma_loop_text(threads, lanes, chains)), "buffer")
        record_signature(module.ir, "main", outputs=[True])
        if threads == 1:
            run_lowering(module, lowering.LOWER_TO_LLVM)
        else:
            run_lowering(module, lowering.TO_OPENMP)
            run_pipeline(module, lowering.OPENMP_TO_LLVM)
        lowering.pin_codegen_target(module.ir, target)
        binary = JitBinary(module.ir, shared_libs=runtime_libraries(module.ir))
    out = np.zeros((threads, lanes), np.float32)
    run = binary.bind("main", [out])
    return FmaLoop(run, out, 2.0 * TRIPS * chains * lanes * threads, chains, module.ir, binary)


def fma_peak_gflops(threads: int = 1, target: Target | None = None, seconds: float = 0.5) -> float:
    """GFLOP/s of the FMA loop on ``threads`` threads, sustained over about ``seconds`` (the
    host's vector width and register count unless ``target`` says otherwise; it must run
    here).

    On one thread, timed by the thread's CPU time (a loaded host reads the same peak).
    Sustained, not the best call: on a VM the speed of single short calls spreads widely
    (Zen 1, one thread, 0.1 ms calls: 10th percentile and best 25% apart), while a kernel
    that runs for milliseconds sees the average."""
    loop = build_fma_loop(threads, target)
    loop.run()  # warm up the threads
    # One thread runs the loop in this thread: its CPU time is the loop's time even while
    # other processes share the cores (the wall clock then read a third of the peak, and
    # tables showed kernels at 200% of it). Several threads need the wall clock.
    clock = time.thread_time if threads == 1 else time.perf_counter
    calls, start = 0, clock()
    while (elapsed := clock() - start) < seconds or calls == 0:
        loop.run()
        calls += 1
    return calls * loop.flops / elapsed / 1e9
