"""Pass pipelines shared by every CPU graph: bufferization and lowering to the LLVM dialect.

Calling convention after ``BUFFERIZE``: the entry function takes its inputs and then its
outputs as memrefs (results become caller-allocated out-parameters), so runners pass numpy
arrays for both and nothing is allocated or freed across the boundary.

``LOWER_TO_LLVM`` runs ``scf.forall`` loops serially; ``LOWER_TO_LLVM_OPENMP`` turns them
into OpenMP parallel loops (the JIT then needs an OpenMP runtime, see
``stagegraph.runtime.openmp``). It is ``TO_OPENMP`` then ``OPENMP_TO_LLVM``; between the
two, ``schedule_guided`` makes the loops hand out their iterations in shrinking chunks. Both
fully unroll the n-D vector transfers left by the schedules into 1-D ones first (a partial
unroll leaves stack allocas inside loops).
"""

# Canonicalization before the out-params: a loop that updates its buffer in place (as the
# matmul's unpack loop does when the block loop has a single block and is inlined) must
# fold to that buffer, or the returned value is not the allocation itself and the result
# is copied into the out-parameter instead of being written there.
# ``eliminate-empty-tensors`` first: a producer whose init is a ``tensor.empty`` and whose
# result is inserted into a larger tensor (a concatenation, see
# ``stagegraph.stages.common.concat_in_place``) then writes straight into its slice.
BUFFERIZE = (
    "eliminate-empty-tensors,"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "canonicalize,"
    "buffer-results-to-out-params{hoist-static-allocs modify-public-functions},"
    "cse,canonicalize"
)

#: What turns memref results into caller-allocated out-parameters: the calling convention
#: runners use, applied after a user's bufferizing pipeline that left results returned.
RESULTS_TO_OUT_PARAMS = (
    "canonicalize,buffer-results-to-out-params{hoist-static-allocs modify-public-functions},"
    "canonicalize"
)

_VECTORS = "func.func(convert-vector-to-scf{full-unroll=true target-rank=1},canonicalize)"

# ``math.fpowi`` (x ** n from PyTorch) has no vector form in LLVM: constant exponents become
# multiplications, the rest calls to a generated function (vectors per element).
_POWI = "func.func(math-expand-ops{ops=fpowi}),convert-math-to-funcs"

# Math ops LLVM has no intrinsic for (erf, tan, atan, cbrt, ...) call libm; the others
# become intrinsics first, so vector sqrt, floor, fma, ... stay vector instructions.
_MATH_TO_LLVM = "convert-math-to-llvm,convert-math-to-libm"

_TO_LLVM = (
    f"{_POWI},buffer-deallocation-pipeline,convert-bufferization-to-memref,expand-strided-metadata,"
    "lower-affine,convert-scf-to-cf,convert-vector-to-llvm,finalize-memref-to-llvm,"
    f"{_MATH_TO_LLVM},convert-to-llvm,reconcile-unrealized-casts"
)

# Serial: the per-block packing buffers are allocated once, outside the block loops.
LOWER_TO_LLVM = f"func.func(scf-forall-to-for,buffer-loop-hoisting),{_VECTORS},{_TO_LLVM}"

# Up to OpenMP: ``scf.forall`` -> ``scf.parallel`` -> ``omp.wsloop`` (memrefs still plain).
TO_OPENMP = (
    f"func.func(scf-forall-to-parallel),{_VECTORS},"
    # Deallocation first: it must not insert ops into the omp.wsloop wrapper; the
    # memref.alloca_scope made by scf-to-openmp is lowered before scf-to-cf splits its body.
    "buffer-deallocation-pipeline,convert-bufferization-to-memref,convert-scf-to-openmp"
)

OPENMP_TO_LLVM = (
    f"{_POWI},expand-strided-metadata,lower-affine,convert-vector-to-llvm,finalize-memref-to-llvm,"
    f"convert-scf-to-cf,convert-openmp-to-llvm,{_MATH_TO_LLVM},convert-to-llvm,"
    "reconcile-unrealized-casts"
)

LOWER_TO_LLVM_OPENMP = f"{TO_OPENMP},{OPENMP_TO_LLVM}"


def to_openmp(threads: int) -> str:
    """``TO_OPENMP`` whose parallel regions run on exactly ``threads`` threads
    (``omp.parallel num_threads``): the count the cost model (or the tuner) chose, not the
    runtime's default of every core."""
    pass_with_count = f"convert-scf-to-openmp{{num-threads={threads}}}"
    return TO_OPENMP.replace("convert-scf-to-openmp", pass_with_count)


def schedule_guided(module) -> int:
    """Give every ``omp.wsloop`` of ``module`` (an ``ir.Module`` after ``TO_OPENMP``) the
    ``guided`` schedule: threads take chunks of the remaining iterations, large first and
    shrinking to one.

    A static split hands each thread a fixed share, so the whole loop waits for the
    slowest thread; on a machine whose cores are shared (another process, or the spinning
    workers of another threading runtime) one slowed core then stalls the other. The
    ``dynamic`` schedule balances by handing out one iteration per request, but a
    convolution's or an elementwise op's loop has tens of thousands of small output tiles,
    and their requests (a lock each) cost more than the tiles: RegNet ran slower on two
    threads than on one. Guided needs a few requests per thread and still balances the
    tail (RegNet on two threads 22 -> 18 ms at equal schedules; matmul blocks unchanged).
    Returns the number of loops changed.
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import collect

    kind = ir.Attribute.parse("#omp<schedulekind guided>", module.context)
    loops = collect(
        module, lambda op: op.name == "omp.wsloop" and "schedule_kind" not in op.attributes
    )
    for loop in loops:
        loop.attributes["schedule_kind"] = kind
    return len(loops)


LINALG_TO_LOOPS = "convert-linalg-to-loops"


TARGET_ISA_ATTR = "stagegraph.target_isa"
TARGET_NAME_ATTR = "stagegraph.target_name"


def pin_codegen_target(module, target) -> int:
    """Build every function of an LLVM-dialect ``module`` for ``target``, not the host.

    A named target (``target.cpu`` set) becomes each ``llvm.func``'s ``target_cpu`` and an
    explicit ``target_features`` list: LLVM then builds that function for the named CPU
    whatever the JIT's host is, and a feature the target lacks is switched off even when the
    host has it (``-avx512f`` on an AVX-512 host pinned to ``x86-64-v3``). The target's ISA
    is recorded on the module (``TARGET_ISA_ATTR``) so an emitter can refuse to run code the
    host cannot execute. Returns the number of functions pinned (0 for the host target).
    """
    from stagegraph.mlir.bindings import ir
    from stagegraph.mlir.walk import children
    from stagegraph.stages.target_names import llvm_features

    context = module.context
    module.operation.attributes[TARGET_NAME_ATTR] = ir.StringAttr.get(target.name, context)
    module.operation.attributes[TARGET_ISA_ATTR] = ir.ArrayAttr.get(
        [ir.StringAttr.get(f, context) for f in sorted(target.isa)], context
    )
    if target.cpu is None:
        return 0
    quoted = ", ".join(f'"{f}"' for f in llvm_features(target.isa))
    features = ir.Attribute.parse(f"#llvm.target_features<[{quoted}]>", context)
    cpu = ir.StringAttr.get(target.cpu, context)
    pinned = 0
    for op in children(module.operation):  # iterating the body imports the llvm module
        if op.name == "llvm.func":
            op.operation.attributes["target_cpu"] = cpu
            op.operation.attributes["target_features"] = features
            pinned += 1
    return pinned


def required_isa(module) -> tuple[str, frozenset[str]] | None:
    """(target name, ISA features) recorded by :func:`pin_codegen_target`, if any."""
    attrs = module.operation.attributes
    if TARGET_ISA_ATTR not in attrs:
        return None
    from stagegraph.mlir.bindings import ir

    name = ir.StringAttr(attrs[TARGET_NAME_ATTR]).value if TARGET_NAME_ATTR in attrs else "?"
    return name, frozenset(ir.StringAttr(a).value for a in attrs[TARGET_ISA_ATTR])


#: Dialects an LLVM-level module may hold when it is translated to LLVM IR.
LLVM_LEVEL_DIALECTS = frozenset({"llvm", "omp"})


def not_lowered(module) -> list:
    """Ops of an LLVM-level ``module`` that LLVM translation cannot take: anything outside
    the llvm/omp dialects (the module op itself aside). Casts the conversions left
    (``builtin.unrealized_conversion_cast``) come last: the op they stand for is the cause."""
    return survey_llvm_level(module)[0]


def survey_llvm_level(module) -> tuple[list, bool]:
    """One walk of an LLVM-level ``module``: the ops :func:`not_lowered` reports, and
    whether any ``omp`` op is left (the JIT then needs an OpenMP runtime).

    The walk visits every op of what is the largest module of a compile (an outlined LSTM's
    LLVM dialect holds 150,000): the emit stage asks both questions of this one walk."""
    from stagegraph.mlir.bindings import ir

    top = getattr(module, "operation", module)
    left: list = []
    omp = False
    lowered = tuple(f"{d}." for d in LLVM_LEVEL_DIALECTS)
    advance = ir.WalkResult.ADVANCE

    def visit(op) -> object:
        nonlocal omp
        name = op.name
        if name.startswith(lowered):
            omp = omp or name.startswith("omp.")
        elif name != "builtin.module":
            left.append(op)
        return advance

    top.walk(visit, ir.WalkOrder.PRE_ORDER)
    left.sort(key=lambda op: op.name == "builtin.unrealized_conversion_cast")
    return left, omp


def require_llvm_level(module, who: str) -> None:
    """Raise when ``module`` still holds ops LLVM translation cannot take, naming the first
    such op and ``who`` should have removed it (a lowering stage, or the stage before emit).

    Raises:
        LoweringIncompleteError: with the op's name, location and the count.
    """

    left = not_lowered(module)
    raise_not_lowered(left, who)


def raise_not_lowered(left: list, who: str) -> None:
    """:func:`require_llvm_level` on the ops :func:`survey_llvm_level` found not lowered."""
    from stagegraph.errors import LoweringIncompleteError

    if not left:
        return
    first = left[0]
    names = sorted({op.name for op in left})
    raise LoweringIncompleteError(
        f"{len(left)} ops were not lowered to the LLVM dialect ({', '.join(names)}); the "
        f"first, {first.name} at {first.location}, should have been removed by {who}: no "
        "conversion in its pipeline handles it (lower it earlier, or add the conversion)"
    )


#: Dialects the LLVM lowering pipelines do not convert: ops of these must be gone before.
NOT_CONVERTED_TO_LLVM = ("linalg.", "tensor.", "bufferization.to_tensor")


def require_lowerable(module, who: str) -> None:
    """Before an LLVM lowering pipeline: raise when ``module`` still holds ops it has no
    conversion for (linalg or tensor ops), naming the first and ``who`` left it.

    Raises:
        LoweringIncompleteError: with the op's name, location and the count.
    """
    from stagegraph.errors import LoweringIncompleteError
    from stagegraph.mlir.walk import collect

    left = collect(module, lambda op: op.name.startswith(NOT_CONVERTED_TO_LLVM))
    if left:
        names = sorted({op.name for op in left})
        raise LoweringIncompleteError(
            f"{len(left)} ops reached the LLVM lowering that it cannot convert "
            f"({', '.join(names)}); the first, {left[0].name} at {left[0].location}, should "
            f"have been removed by {who}"
        )
