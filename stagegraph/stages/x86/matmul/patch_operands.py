"""An implicit GEMM's patch matrix gathered straight into the packed panels of B.

The implicit GEMM (:mod:`stagegraph.stages.x86.conv.gemm`) reads its B, the patch matrix
``P[(c, t), (n, o)] = X[n, c, o*s + t*d]``, from one copy of the input's windows. Built
as a separate op, that copy writes ``P`` out and the packed kernel's packing of B reads it
back into ``reg_n``-column panels: two passes over every patch element (on KernelBench's
l1_050, 3->96 channels 11x11/4, the copy took ~12% of the time and the packing ~9%,
docs/measurements.md, session 20).

A patch matrix built by :func:`stagegraph.stages.x86.conv.patch_gather.patch_matrix` is a
``linalg.generic`` over ``[C*T, N*O]`` marked :data:`PATCH_ATTR` whose body reads the input
with ``tensor.extract`` (no window map: any stride, dilation or rank). :func:`mark_patch_operands`
gives it the matmul's widening mark (``canonical.WIDEN_ATTR``): the matmul schedule then
treats it as it treats a widening copy of B, fused into each packing step
(``packed_kernel._tile_packing``), so every step gathers its ``k_step x reg_n`` tile of
patches from the input into registers and stores it in the panel: one pass, no patch
matrix in memory. Where the packing steps would need masks (:func:`fusable`), the patch
matrix stays an op of its own that the generic schedule runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from stagegraph.mlir.bindings import ir
from stagegraph.mlir.walk import collect
from stagegraph.stages.x86.matmul.canonical import PATCH_ATTR, SOURCE_ATTR, WIDEN_ATTR
from stagegraph.stages.x86.matmul.params import MatmulParams, whole_b_panels

__all__ = ["PATCH_ATTR", "fusable", "mark_patch_operands"]


def fusable(columns: int, params: MatmulParams) -> bool:
    """Whether the packing of a ``columns``-wide patch matrix runs in steps of static
    shape, so the gather fused into each step needs no mask (a masked ``vector.gather``
    of a unit-dim tile fails to verify): the packed kernel (``pack``), and every column
    block whole ``reg_n`` panels, or one block spanning the columns whose partial last
    panel ``packed_kernel._split_partial_panel`` splits off (l1_050's blocks of 605
    columns: 18 panels of 32 and one of 29)."""
    if not params.pack:
        return False
    split = params.tile_n >= columns and columns // params.reg_n >= 2
    return whole_b_panels(columns, params) or split


def mark_patch_operands(payload: ir.Module, params: Mapping[int, MatmulParams]) -> int:
    """Give every patch matrix that only a labelled matmul reads, as its B, that matmul's
    widening mark for operand 1 when its packing is :func:`fusable` with the matmul's
    ``params`` (by ``SOURCE_ATTR``), so the schedule fuses it into B's packing (see the
    module doc). Any other patch matrix loses :data:`PATCH_ATTR`: the generic schedule
    then takes it as an op of its own. Run before the generic schedule, after
    ``canonical.label_contractions``. Returns the number marked."""
    patches = collect(
        payload, lambda op: op.name == "linalg.generic" and PATCH_ATTR in op.attributes
    )
    i64 = ir.IntegerType.get_signless(64, payload.context)
    marked = 0
    for producer in patches:
        uses = list(producer.results[0].uses)
        reader = uses[0].owner.operation if len(uses) == 1 else None
        source = None
        if (
            reader is not None
            and reader.name == "linalg.matmul"
            and uses[0].operand_number == 1
            and SOURCE_ATTR in reader.attributes
        ):
            source = ir.IntegerAttr(reader.attributes[SOURCE_ATTR]).value
        columns = ir.RankedTensorType(producer.results[0].type).shape[1]
        if source is None or source not in params or not fusable(columns, params[source]):
            del producer.attributes[PATCH_ATTR]
            continue
        producer.attributes[WIDEN_ATTR] = ir.IntegerAttr.get(i64, 2 * source + 1)
        marked += 1
    return marked
