"""The packed matmul kernel's shape decisions for one site, from its description and
params alone (no transform ops): K blocks, whether the register tiles write C directly,
whether the threads share each K block's packed B. :mod:`.packed_kernel` builds the kernel
from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stagegraph.mlir.bindings import ir
from stagegraph.stages.x86.matmul.canonical import MatmulSite
from stagegraph.stages.x86.matmul.params import MatmulParams, pack_k_step


@dataclass(frozen=True)
class KernelPlan:
    """The shape decisions for one site, from its description and params alone.

    ``k_block``: the K block length (0: one block); ``direct``: register tiles write C
    themselves; ``shared``: the threads share each K block's packed B; ``pass_n``: columns
    per block of the parallel pass over C when shared; ``row_blocks``: a block holds
    several ``tile_m`` row blocks; ``k_step``: k elements per packing step."""

    k_block: int
    direct: bool
    shared: bool
    pass_n: int
    row_blocks: bool
    k_step: int


def plan_kernel(
    site: MatmulSite, params: MatmulParams, widenings: Sequence[ir.Value | None]
) -> KernelPlan:
    """The site's shape decisions (no transform ops)."""
    k_block = params.k_block(site.k)
    # One K block and whole register tiles: the tiles write C themselves (see
    # writes_c_directly) and the kernel skips the packed-C path's tiling.
    direct = writes_c_directly(site, params, k_block, widenings)
    # Columns per block of the parallel pass over C (shared): a multiple of reg_n below N
    # unless whole panels tile N. An unpack block spanning a partial panel unpacks into a
    # padded temporary that is then copied to C.
    panels = -(-site.n // params.reg_n)
    pass_n = site.n if site.n % params.reg_n == 0 else -(-panels // 2) * params.reg_n
    return KernelPlan(
        k_block=k_block,
        direct=direct,
        shared=shares_b(site, params, k_block, direct),
        pass_n=pass_n,
        row_blocks=params.block_rows > params.tile_m,
        # Pack steps must tile the K block evenly, or every step gets a k mask.
        k_step=pack_k_step(k_block or site.k),
    )


def writes_c_directly(
    site: MatmulSite, params: MatmulParams, k_block: int, widenings: Sequence[ir.Value | None]
) -> bool:
    """Whether the register tiles can be computed inside the pass that writes C: one K
    block (the accumulators need no packed C between blocks) and, with several row blocks,
    no widening copy of A (it would have to follow A's packing into the row-block loop).
    Partial edge tiles are peeled into pieces of their own, each with its kernel
    (``packed_kernel._peel_direct_edges``), unless an elementwise chain follows (the pieces' tiles
    then still slice a whole packed C, left allocated) or several parallel blocks each
    hold several row blocks (229x65x571 on two threads: 120-row blocks of 60-row blocks,
    the last partial; the fusion into the peeled row loop fails). Those keep packed C.

    Then no packed C exists: no zeroing pass, no pass that reads it back to write C. (With
    row blocks and a partial column, the unpack's row-block tiling still writes a padded
    temporary that is copied to C, as on the packed-C path.)

    Several K blocks keep packed C: computing the last block's tiles in the pass over C
    costs in strided stores to C what the unpack pass saves. The measurements:
    docs/measurements.md, "Design decisions: the packed matmul kernel"."""
    one_row_block_loop = params.block_rows <= params.tile_m or params.block_rows >= site.m
    edges_ok = not site.consumers and one_row_block_loop
    return (
        not k_block
        and (params.whole_register_tiles(site.m, site.n) or edges_ok)
        and not (params.block_rows > params.tile_m and widenings[0] is not None)
    )


def shares_b(site: MatmulSite, params: MatmulParams, k_block: int, direct: bool) -> bool:
    """Whether the threads share each K block's packed B (``MatmulParams.share_b``): the
    K-block loop runs outermost and serially; per K block the threads pack B's panels
    together, then take the row blocks, each packing its own A slice. The passes that zero
    packed C (unless the first K block starts from the fill: first_k_block) and write C
    back are parallel loops of their own.

    Otherwise each parallel block packs its own B: with row blocks as the parallel blocks,
    every K block of B is packed once per block (four times at 1024^3 on two threads).
    Needs several K blocks, packed C, one parallel block spanning C (the threads share the
    loops inside it instead) and several row blocks to share."""
    return (
        params.share_b
        and not site.prepacked_b  # (no packing of B to share)
        and params.threads > 1
        and bool(k_block)
        and not direct
        and params.block_rows >= site.m
        and params.tile_n >= site.n
        and params.block_rows > params.tile_m
        and site.n > params.reg_n
    )
