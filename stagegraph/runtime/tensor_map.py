"""Encoding the TMA tensor maps of a ``cuda`` plan's ``tensor_map`` steps on the host.

A ``tensor_map`` step describes a view of a device buffer (sizes and strides in elements,
outermost first, like every view of the plan) and the box of it that one TMA copy moves.
The driver wants the same facts innermost first, strides in bytes and without the
innermost one (which must be the element), so :func:`encode_arguments` reorders them;
:func:`encode` calls ``cuTensorMapEncodeTiled`` and returns the 128 bytes the kernel
reads through a pointer. No MLIR and no pydantic here: this runs on the GPU machine.
"""

from __future__ import annotations

from typing import Any

from stagegraph.errors import CudaError

#: Manifest dtype -> the driver's ``CU_TENSOR_MAP_DATA_TYPE_*`` name and element bytes.
DATA_TYPES: dict[str, tuple[str, int]] = {
    "f16": ("FLOAT16", 2), "bf16": ("BFLOAT16", 2), "f32": ("FLOAT32", 4),
    "f64": ("FLOAT64", 8), "i32": ("INT32", 4), "i64": ("INT64", 8), "ui8": ("UINT8", 1),
}  # fmt: skip
TENSOR_MAP_BYTES = 128


def encode_arguments(step: dict[str, Any], address: int) -> dict[str, Any]:
    """The ``cuTensorMapEncodeTiled`` arguments of ``step`` for a view at device
    ``address`` (the view's own start): rank, dims and box innermost first, byte strides
    of the outer dims, unit element strides, and the enum names of the options.

    Raises:
        CudaError: a dtype TMA cannot move, a view whose innermost stride is not 1, or
            strides TMA cannot take (multiples of 16 bytes).
    """
    source = step["source"]
    if source["dtype"] not in DATA_TYPES:
        raise CudaError(f"tensor map {step['buffer']}: TMA cannot move {source['dtype']}")
    kind, size = DATA_TYPES[source["dtype"]]
    sizes, strides = list(source["sizes"]), list(source["strides"])
    if strides[-1] != 1 or any(s * size % 16 for s in strides[:-1]) or address % 16:
        raise CudaError(
            f"tensor map {step['buffer']}: the view {sizes} with strides {strides} of "
            f"{source['dtype']} is not dense in its last dim with 16-byte aligned rows"
        )
    return {
        "data_type": kind,
        "rank": len(sizes),
        "address": address,
        "dims": sizes[::-1],
        "strides": [s * size for s in strides[:-1]][::-1],
        "box": list(step["box"])[::-1],
        "element_strides": [1] * len(sizes),
        "interleave": "NONE",
        "swizzle": f"{step['swizzle']}B" if step["swizzle"] else "NONE",
        "l2_promotion": f"L2_{step['l2_promotion']}B" if step["l2_promotion"] else "NONE",
        "oob_fill": "NONE" if step["oob_fill"] == "zero" else "NAN_REQUEST_ZERO_FMA",
    }


def encode(cu: Any, step: dict[str, Any], address: int, check: Any) -> Any:
    """The encoded tensor map (``CUtensorMap``: ``getPtr()`` gives its 128 bytes) of
    ``step`` through the driver module ``cu``; ``check`` is the runtime's status check
    (:func:`stagegraph.runtime.cuda.check`, passed in so this module needs no import of
    the runtime that calls it).

    Raises:
        CudaError: :func:`encode_arguments` refused the view, or the driver did.
    """
    args = encode_arguments(step, address)
    # The binding takes its arrays as the driver's integer types, not Python ints
    # (cuda-bindings 13.3 refuses ints: "Cannot convert int to cuuint32_t").
    u64 = [cu.cuuint64_t(v) for v in args["dims"]], [cu.cuuint64_t(v) for v in args["strides"]]
    u32 = (
        [cu.cuuint32_t(v) for v in args["box"]],
        [cu.cuuint32_t(v) for v in args["element_strides"]],
    )
    return check(cu, cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{args['data_type']}"),
        args["rank"], args["address"], *u64, *u32,
        getattr(cu.CUtensorMapInterleave, f"CU_TENSOR_MAP_INTERLEAVE_{args['interleave']}"),
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{args['swizzle']}"),
        getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{args['l2_promotion']}"),
        getattr(cu.CUtensorMapFloatOOBfill, f"CU_TENSOR_MAP_FLOAT_OOB_FILL_{args['oob_fill']}"),
    ), "cuTensorMapEncodeTiled")  # fmt: skip
