"""TMA tensor maps: created on the host side of the IR, encoded by the host plan.

A wgmma kernel (:mod:`stagegraph.stages.gpu.wgmma`) reads its operands through TMA, which
needs a 128-byte tensor map per operand, encoded on the host by the driver
(``cuTensorMapEncodeTiled``) from the operand's device address, shape and strides and the
shared-memory box it fills. In the IR that is an ``nvgpu.tma.create.descriptor`` of the
operand (cast to an unranked memref) before the block loop; the host plan
(:mod:`stagegraph.stages.gpu.plan`) reads it into an ``alloc`` of 128 bytes and a
``tensor_map`` step, which the runtime (:mod:`stagegraph.runtime.tensor_map`) encodes and
copies to that buffer; launches pass the buffer's device address
(``{"tensor_map": name}``), which the kernel takes as the descriptor's pointer.
"""

from __future__ import annotations

from typing import Any

#: Set on each host ``nvgpu.tma.create.descriptor``: its swizzle in bytes (the descriptor
#: type has no accessors in the bindings, so the plan reads this).
SWIZZLE_ATTR = "stagegraph.tma_swizzle"
SWIZZLE_BYTES = 128
#: What the descriptors built here ask of the tensor map: L2 promotion in bytes, and
#: out-of-bounds elements read as zero.
L2_PROMOTION_BYTES = 256
OOB_FILL = "zero"
#: Bytes of an encoded tensor map (``CUtensorMap``).
TENSOR_MAP_BYTES = 128
CREATE = "nvgpu.tma.create.descriptor"
CAST = "builtin.unrealized_conversion_cast"


def create_descriptor(build: Any, memref: Any, box: tuple[int, ...]) -> Any:
    """``nvgpu.tma.create.descriptor`` of ``memref`` for a ``box`` (elements per dim,
    outermost first) in 128-byte-swizzled shared memory, at ``build``'s insertion point
    (a :class:`~stagegraph.stages.gpu.mma._Builder` on the host)."""
    from stagegraph.mlir.bindings import ir, nvgpu
    from stagegraph.mlir.bindings import memref as memref_d

    element = ir.MemRefType(memref.type).element_type
    with build.location:
        cast = memref_d.CastOp(ir.UnrankedMemRefType.get(element, None), memref,
                               ip=build.point).result  # fmt: skip
        tile = ir.MemRefType.get(list(box), element, memory_space=ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), 3))  # fmt: skip
        kind = nvgpu.TensorMapDescriptorType.get(
            tile, int(nvgpu.TensorMapSwizzleKind.SWIZZLE_128B),
            int(nvgpu.TensorMapL2PromoKind.L2PROMO_256B), int(nvgpu.TensorMapOOBKind.OOB_ZERO),
            int(nvgpu.TensorMapInterleaveKind.INTERLEAVE_NONE),
        )  # fmt: skip
        sizes = [build.const(n) for n in box]
        made = nvgpu.TmaCreateDescriptorOp(kind, cast, sizes, ip=build.point)
        made.attributes[SWIZZLE_ATTR] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), SWIZZLE_BYTES
        )
    return made.result


def read_host_op(reader: Any, op: Any) -> bool:
    """Read one host op of the TMA setup into the plan (``reader``: the plan's reader, with
    ``values``, ``operand``, ``name`` and ``plan``); False for any other op.

    A cast to an unranked memref stands for its source; a descriptor becomes an ``alloc``
    and a ``tensor_map`` step; a cast of a descriptor (to the kernel's address) stands for
    the tensor map."""
    from stagegraph.mlir.bindings import ir

    if op.name == "memref.cast" and isinstance(op.results[0].type, ir.UnrankedMemRefType):
        reader.values[op.results[0]] = reader.operand(op.operands[0])
        return True
    if op.name == CAST and "tensor_map" in reader.values.get(op.operands[0], {}):
        reader.values[op.results[0]] = reader.values[op.operands[0]]
        return True
    if op.name != CREATE:
        return False
    source = reader.operand(op.operands[0])
    buffer = reader.name("tmap")
    reader.plan.steps.append({"op": "alloc", "buffer": buffer, "bytes": TENSOR_MAP_BYTES})
    reader.plan.steps.append({
        "op": "tensor_map", "buffer": buffer, "source": source,
        "box": [reader.operand(v)["scalar"] for v in list(op.operands)[1:]],
        "swizzle": ir.IntegerAttr(op.attributes[SWIZZLE_ATTR]).value,
        "l2_promotion": L2_PROMOTION_BYTES, "oob_fill": OOB_FILL,
    })  # fmt: skip
    reader.plan.scratch.append(buffer)
    reader.values[op.results[0]] = {"tensor_map": buffer}
    return True
