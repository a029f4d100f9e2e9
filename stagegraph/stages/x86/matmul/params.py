"""The knobs of the x86 matmul schedule (:class:`MatmulParams`) and the tuner's space over
them; :mod:`.heuristic` derives them from the target.

The schedule is BLIS-shaped: a parallel loop over ``tile_m x tile_n`` cache blocks of C,
inside each block A and B are packed (zero-padded) into ``reg_m``-row and ``reg_n``-column
panels, and an unrolled ``reg_m x reg_n`` register tile of accumulators is swept over k.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from stagegraph.core.ports import Params
from stagegraph.core.tunable import Choice, Range, declare_space
from stagegraph.dtypes import byte_size
from stagegraph.stages.target import Target


class MatmulParams(Params):
    """Tile sizes and options of one matmul (plus its fused fill and elementwise consumers)."""

    tile_m: int = Field(64, ge=1, le=1 << 16, description="rows of A packed per K block")
    tile_n: int = Field(256, ge=1, le=1 << 16, description="columns of C per cache block")
    tile_k: int = Field(
        0, ge=0, le=1 << 16, description="k extent swept per accumulator pass (0: all of K)"
    )
    reg_m: int = Field(8, ge=1, le=32, description="rows of the register tile")
    reg_n: int = Field(32, ge=1, le=256, description="columns of the register tile")
    k_unroll: int = Field(1, ge=1, le=16, description="k steps per kernel iteration")
    vector_width: int = Field(16, ge=1, le=64, description="SIMD lanes of the element type")
    vector_registers: int = Field(32, ge=8, le=64, description="architectural SIMD registers")
    block_m: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="rows of C per parallel block, in whole tile_m blocks (0: tile_m)",
    )
    pack: bool = Field(True, description="pack A and B into zero-padded register panels")
    share_b: bool = Field(
        False,
        description="with threads > 1 and several K blocks: the K blocks run in turn, the "
        "threads pack each one's B together, then take row blocks (no B packed twice)",
    )
    threads: int = Field(1, ge=1, le=1024, description="threads sharing the block loop")
    prefetch_b: int = Field(
        0,
        ge=0,
        le=1 << 24,
        description="bytes ahead (in memory order) of the kernel's reads of a B packed at "
        "compile time that it prefetches into L2 (0: none); see stream_prefetch",
    )

    @model_validator(mode="after")
    def _check(self) -> MatmulParams:
        if self.reg_n % self.vector_width:
            raise ValueError(
                f"reg_n={self.reg_n} must be a multiple of vector_width={self.vector_width}"
            )
        vectors = self.reg_n // self.vector_width
        if vectors & (vectors - 1):
            raise ValueError(
                f"reg_n={self.reg_n} must be a power-of-two number of vectors "
                f"({vectors} of {self.vector_width} lanes lower to vectors that split into "
                "no whole registers: measured 10x slower)"
            )
        if self.tile_m % self.reg_m or self.tile_n % self.reg_n:
            raise ValueError(
                f"cache tile {self.tile_m}x{self.tile_n} must be a multiple of the "
                f"register tile {self.reg_m}x{self.reg_n}"
            )
        if self.tile_k and self.tile_k % self.k_unroll:
            raise ValueError(f"tile_k={self.tile_k} must be a multiple of k_unroll")
        if self.accumulator_registers + self.reg_n // self.vector_width + 1 > (
            self.vector_registers
        ):
            raise ValueError(
                f"register tile {self.reg_m}x{self.reg_n} needs more than "
                f"{self.vector_registers} vector registers"
            )
        return self

    @property
    def block_rows(self) -> int:
        """Rows of C per parallel block: ``block_m`` rounded down to whole ``tile_m`` blocks
        (at least one), so a tuner that changes ``tile_m`` alone keeps valid params."""
        return max(self.tile_m, self.block_m // self.tile_m * self.tile_m)

    def whole_register_tiles(self, m: int, n: int) -> bool:
        """Whether every register tile of an ``m x n`` C is whole: no partial edge tile in
        any block (the schedule then needs no peeled edge pieces)."""
        return not partial_tiles(m, self.block_rows, self.reg_m) and not partial_tiles(
            n, self.tile_n, self.reg_n
        )

    def k_block(self, k: int) -> int:
        """The K block length for a K extent of ``k``; 0 when K is one block (no K loop)."""
        return self.tile_k if self.tile_k and self.tile_k < k else 0

    @property
    def accumulator_registers(self) -> int:
        return self.reg_m * (self.reg_n // self.vector_width)


def pack_k_step(k: int) -> int:
    """k elements per vectorized step of the schedule's A and B packing, for a K extent
    (or K block) of ``k``: the largest of 8, 4, 2, 1 dividing it."""
    return next(s for s in (8, 4, 2, 1) if k % s == 0)


def whole_b_panels(n: int, params: MatmulParams) -> bool:
    """Whether every column block of B is whole ``reg_n``-column panels, each block the same
    static width: then B can be packed ahead (``constant_pack``) and each block's pack of
    it folds away exactly (a partial panel would need padding, a last narrower block a
    dynamic shape)."""
    return n % params.reg_n == 0 and n % min(params.tile_n, n) == 0


def partial_tiles(extent: int, block: int, tile: int) -> bool:
    """Whether the tile loop over a block of a dimension of ``extent`` split into blocks of
    ``block`` can end with a partial ``tile``: a dynamic bound (the blocks do not divide
    the extent) or a static one that ``tile`` does not divide. A tile of one is never
    partial (and a loop of unit steps has no last iteration to peel)."""
    if tile == 1:
        return False
    if extent > block and extent % block:
        return True
    return min(extent, block) % tile != 0


# -- search space (read by the tuner through stagegraph.core.tunable) -------------------------

#: Fields a tuner may vary; vector_width, vector_registers and threads stay as the cost
#: model chose them (they describe the machine and the run, not the schedule).
TUNABLE_FIELDS = ("tile_m", "tile_n", "tile_k", "reg_m", "reg_n", "k_unroll", "pack")


# Register tiles are at most 2**this vectors wide (16 x 16 lanes: beyond any register file).
_MAX_VECTORS_LOG2 = 4


def tuning_constraints(p: object, logic: object) -> dict[str, object]:
    """The validator's rules as named expressions over ``p``'s fields.

    ``logic`` provides ``Or`` (z3, or plain Python), so a solver and a checker share one
    statement of the rules. The register budget is multiplied through by vector_width
    (exact because reg_n is a multiple of it) to stay free of division.
    """
    return {
        "reg_n_multiple_of_vector_width": p.reg_n % p.vector_width == 0,
        "reg_n_power_of_two_vectors": logic.Or(
            *(p.reg_n == p.vector_width * (1 << j) for j in range(_MAX_VECTORS_LOG2 + 1))
        ),
        "tile_m_multiple_of_reg_m": p.tile_m % p.reg_m == 0,
        "tile_n_multiple_of_reg_n": p.tile_n % p.reg_n == 0,
        "tile_k_multiple_of_k_unroll": logic.Or(p.tile_k == 0, p.tile_k % p.k_unroll == 0),
        "register_budget": p.reg_m * p.reg_n + p.reg_n + p.vector_width
        <= p.vector_registers * p.vector_width,
    }


def matmul_shape(op: object) -> tuple[int, int, int, int]:
    """(m, n, k, element bytes) of a matmul op's facts (the accumulator's element type)."""
    c = op.contraction
    return c.m, c.n, c.k, byte_size(op.outputs[0].dtype, 4)


def matmul_space_rules(p: object, op: object, target: Target, logic: object) -> dict[str, object]:
    """The model's rules, then shape bounds (no block beyond the matrix) and cache
    capacities (A's block in L2, B's micro-panel in half of it) for this op."""
    m, n, k, elem = matmul_shape(op)
    kc = logic.If(p.tile_k == 0, k, p.tile_k)
    l2 = target.l2_bytes
    return {
        **tuning_constraints(p, logic),
        f"tile_m_within_m={m}": p.tile_m < m + p.reg_m,
        f"tile_n_within_n={n}": p.tile_n < n + p.reg_n,
        f"tile_k_divides_k={k}": logic.Or(p.tile_k == 0, k % p.tile_k == 0),
        f"k_unroll_divides_k={k}": k % p.k_unroll == 0,
        f"a_block_fits_l2={l2}B": p.tile_m * kc * elem <= l2,
        "b_panel_fits_half_l2": kc * p.reg_n * elem <= l2 // 2,
    }  # fmt: skip


def _lanes(op: object, target: Target) -> int:
    return max(1, target.vector_bits // (8 * matmul_shape(op)[3]))


declare_space(
    MatmulParams,
    "matmul",
    {
        "tile_m": lambda op, t: Range(1, matmul_shape(op)[0] + 31),
        "tile_n": lambda op, t: Range(1, matmul_shape(op)[1] + 255),
        "tile_k": lambda op, t: Range(0, max(0, matmul_shape(op)[2] - 1)),
        "reg_m": lambda op, t: Range(1, min(32, max(1, matmul_shape(op)[0]))),
        "reg_n": lambda op, t: Range(_lanes(op, t), min(256, t.vector_registers * _lanes(op, t))),
        "k_unroll": Range(1, 16),
        "pack": Choice((0, 1)),
    },
    matmul_space_rules,
    applies_to=lambda target: target.arch in ("x86_64", "AMD64"),
)
