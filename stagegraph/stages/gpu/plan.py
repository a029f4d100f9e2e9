"""The host-side plan: the lowered host function read into allocations, copies and launches.

After the GPU lowering the entry function holds only host work: buffers (arguments,
``memref.alloc``, constants through ``memref.get_global``), views of them (subviews and
reshapes with static layouts), device-to-device copies and ``gpu.launch_func`` ops. Each is
read through the bindings into a JSON-able step; a runtime without MLIR runs the steps
(:mod:`stagegraph.runtime.cuda`). Kernel arguments follow the LLVM lowering of a memref:
``allocated, aligned, offset, sizes..., strides...`` (elements), then scalars by value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stagegraph.errors import UnsupportedPayloadError

VIEW_OPS = frozenset({
    "memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.cast",
    "memref.reinterpret_cast",
})  # fmt: skip
IGNORED_OPS = frozenset({"memref.assume_alignment", "ub.poison"})


@dataclass
class HostPlan:
    """What the emit stage writes as the manifest's plan (plus the constants' values)."""

    arguments: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    launches: dict[str, dict[str, Any]] = field(default_factory=dict)  # kernel -> first config
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    scratch: list[str] = field(default_factory=list)  # buffers freed at the end (tensor maps)


def element_name(element_type: Any) -> str:
    from stagegraph.runtime.memref import element_name as name

    return name(element_type)


def _view(buffer: str, memref_type: Any) -> dict[str, Any]:
    """A buffer reference for a memref value of static layout."""
    from stagegraph.mlir.bindings import ir

    mtype = ir.MemRefType(memref_type)
    strides, offset = mtype.get_strides_and_offset()
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    if offset == dynamic or dynamic in strides or not mtype.has_static_shape:
        raise UnsupportedPayloadError(
            f"the GPU plan needs static layouts on the host; got {mtype} (stage gpu.emit)"
        )
    return {"buffer": buffer, "offset": offset, "sizes": list(mtype.shape),
            "strides": list(strides), "dtype": element_name(mtype.element_type)}  # fmt: skip


def _nbytes(memref_type: Any) -> int:
    from stagegraph.dtypes import byte_size
    from stagegraph.mlir.bindings import ir

    mtype = ir.MemRefType(memref_type)
    return math.prod(mtype.shape) * byte_size(element_name(mtype.element_type), default=1)


def _scalar(op: Any) -> dict[str, Any]:
    from stagegraph.mlir.bindings import ir

    attr = op.attributes["value"]
    if isinstance(attr, ir.BoolAttr):
        return {"scalar": int(attr.value), "dtype": "i1"}
    if isinstance(attr, ir.FloatAttr):
        return {"scalar": float(attr.value), "dtype": element_name(attr.type)}
    if isinstance(attr, ir.IntegerAttr):
        name = "index" if isinstance(attr.type, ir.IndexType) else element_name(attr.type)
        return {"scalar": int(attr.value), "dtype": name}
    raise UnsupportedPayloadError(f"the GPU plan cannot pass the host constant {attr} to kernels")


#: CUDA's limits on a launch (every architecture this graph targets).
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024


def check_launch_limits(kernel: str, config: dict[str, Any]) -> None:
    """Refuse a launch CUDA would reject, at compile time and naming the kernel.

    Raises:
        UnsupportedPayloadError: a grid or block dim over CUDA's limits.
    """
    grid, block = config["grid"], config["block"]
    over = [
        f"{what} {axis} = {n} > {limit}"
        for what, sizes, limits in (("grid", grid, MAX_GRID), ("block", block, MAX_BLOCK))
        for axis, n, limit in zip("xyz", sizes, limits, strict=True)
        if n > limit
    ]
    if math.prod(block) > MAX_THREADS:
        over.append(f"{math.prod(block)} threads per block > {MAX_THREADS}")
    if over:
        raise UnsupportedPayloadError(
            f"stage gpu.emit: kernel {kernel} would launch beyond CUDA's limits "
            f"({', '.join(over)}); the mapping does not fold such grids yet"
        )


def _segments(op: Any) -> list[int]:
    from stagegraph.mlir.bindings import ir

    return list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))


class _Reader:
    """Walks the host function once, turning values into buffer views or scalars."""

    def __init__(self, module: Any, plan: HostPlan) -> None:
        self.module, self.plan = module, plan
        self.values: dict[Any, dict[str, Any]] = {}
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def operand(self, value: Any) -> dict[str, Any]:
        found = self.values.get(value)
        if found is None:
            owner = getattr(value.owner, "name", "an argument")
            raise UnsupportedPayloadError(
                f"the GPU plan cannot compute host value {value.get_name()} (from {owner}) "
                "(stage gpu.emit): only constants and buffers reach kernels"
            )
        return found

    def launch(self, op: Any) -> None:
        from stagegraph.mlir.bindings import ir

        seg = _segments(op)
        operands = list(op.operands)
        start = seg[0]
        sizes = [self.operand(v)["scalar"] for v in operands[start : start + 6]]
        # Segments: async deps, grid x/y/z, block x/y/z, cluster x/y/z, dynamic shared
        # memory, kernel operands, async object.
        shared = self.operand(operands[sum(seg[:-3])])["scalar"] if seg[-3] else 0
        start = sum(seg[:-2])
        args = [self.operand(v) for v in operands[start : start + seg[-2]]]
        module_name, function = ir.SymbolRefAttr(op.attributes["kernel"]).value
        kernel = f"{module_name}__{function}"
        config = {"grid": sizes[:3], "block": sizes[3:], "shared_mem_bytes": shared}
        check_launch_limits(f"{module_name}::{function}", config)
        if self.plan.launches.setdefault(kernel, config) != config:
            raise UnsupportedPayloadError(
                f"stage gpu.emit: kernel {kernel} is launched with two configurations; the "
                "manifest gives each kernel one"
            )
        self.plan.steps.append({"op": "launch", "kernel": kernel, "args": args})

    def global_buffer(self, op: Any) -> None:
        from stagegraph.mlir.bindings import ir

        symbol = ir.FlatSymbolRefAttr(op.attributes["name"]).value
        name = f"const_{symbol}"
        if name not in self.plan.constants:
            self.plan.constants[name] = _global_value(self.module, symbol)
            self.plan.steps.append(
                {"op": "alloc", "buffer": name, "bytes": _nbytes(op.results[0].type)}
            )
            self.plan.steps.append({"op": "constant", "buffer": name, "data": name})
        self.values[op.results[0]] = _view(name, op.results[0].type)

    def step(self, op: Any) -> None:
        from stagegraph.stages.gpu.tma import read_host_op

        name = op.name
        if read_host_op(self, op):
            return
        if name == "arith.constant":
            self.values[op.results[0]] = _scalar(op)
        elif name in ("memref.alloc", "memref.alloca"):
            buffer = self.name("buf")
            self.plan.steps.append(
                {"op": "alloc", "buffer": buffer, "bytes": _nbytes(op.results[0].type)}
            )
            self.values[op.results[0]] = _view(buffer, op.results[0].type)
        elif name == "memref.dealloc":
            self.plan.steps.append({"op": "free", "buffer": self.operand(op.operands[0])["buffer"]})
        elif name == "memref.get_global":
            self.global_buffer(op)
        elif name in VIEW_OPS:
            self.values[op.results[0]] = _view(
                self.operand(op.operands[0])["buffer"], op.results[0].type
            )
        elif name == "memref.copy":
            self.plan.steps.append({"op": "copy_d2d", "src": self.operand(op.operands[0]),
                                    "dst": self.operand(op.operands[1])})  # fmt: skip
        elif name == "gpu.launch_func":
            self.launch(op)
        elif name not in IGNORED_OPS and name != "func.return":
            raise UnsupportedPayloadError(
                f"the GPU plan cannot run the host op {name} (stage gpu.emit): every "
                "computation must be in a kernel"
            )


def row_major_strides(shape: list[int]) -> list[int]:
    """Element strides of a dense row-major array of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _global_value(module: Any, symbol: str) -> np.ndarray:
    """The initial value of ``memref.global @symbol`` as an array (``dense_resource``
    blobs, which the bindings cannot read, are evaluated by a small compiled probe)."""
    from stagegraph.mlir.bindings import arith, ir
    from stagegraph.stages.common.constant_gathers import evaluate_constants

    found = next(
        (op for op in module.body.operations
         if op.operation.name == "memref.global"
         and ir.StringAttr(op.attributes["sym_name"]).value == symbol),
        None,
    )  # fmt: skip
    if found is None or "initial_value" not in found.attributes:
        raise UnsupportedPayloadError(f"memref.global @{symbol} has no initial value")
    attr = found.attributes["initial_value"]
    if isinstance(attr, ir.DenseElementsAttr) and not attr.is_splat:
        return np.array(attr)
    with module.context, ir.Location.unknown(module.context):
        holder = ir.Module.create()
        with ir.InsertionPoint(holder.body):
            constant = arith.ConstantOp(attr.type, attr)
        return evaluate_constants(module, [constant.operation])[0]


def host_plan(module: Any, entry: str) -> HostPlan:
    """Read the lowered host function ``entry`` into a :class:`HostPlan`.

    Raises:
        UnsupportedPayloadError: host work that is no buffer, view, copy or launch.
    """
    from stagegraph.runtime.memref import find_function, read_signature

    plan = HostPlan()
    reader = _Reader(module, plan)
    signature = read_signature(module, entry)
    function = find_function(module, entry)
    arguments = function.regions[0].blocks[0].arguments
    for position, (spec, value) in enumerate(zip(signature.args, arguments, strict=True)):
        kind = "results" if spec.output else "arguments"
        # Named as the CPU kind names them (in0, in1, ..., out0, ...: a reference .npz's keys)
        name = f"{'out' if spec.output else 'in'}{len(getattr(plan, kind))}"
        shape = None if spec.shape is None else list(spec.shape)
        getattr(plan, kind).append({
            "name": name, "position": position, "dtype": spec.dtype, "shape": shape,
            "strides": None if shape is None else row_major_strides(shape),
            "layout": "row-major",
        })  # fmt: skip
        if spec.shape is None:  # a scalar argument: passed to kernels by value
            reader.values[value] = {"argument": name, "dtype": spec.dtype}
            continue
        plan.steps.append({"op": "alloc", "buffer": name, "bytes": _nbytes(value.type)})
        if not spec.output:
            plan.steps.append({"op": "copy_h2d", "src": name, "dst": name})
        reader.values[value] = _view(name, value.type)
    for block in function.regions[0].blocks:
        for op in block.operations:
            reader.step(op.operation)
    for result in plan.results:
        plan.steps.append({"op": "copy_d2h", "src": result["name"], "dst": result["name"]})
    for value in (*plan.arguments, *plan.results):
        if value["shape"] is not None:
            plan.steps.append({"op": "free", "buffer": value["name"]})
    for name in (*plan.constants, *plan.scratch):
        plan.steps.append({"op": "free", "buffer": name})
    return plan
