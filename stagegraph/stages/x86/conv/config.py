"""The implicit-GEMM choice for convolutions, as the ``x86.normalize`` stage's config: pure
data, no MLIR, so a graph file, a tuner or a benchmark can set it
(``graph.with_config("normalize", conv_gemm=False)``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stagegraph.core.ports import Config
from stagegraph.stages.x86.attention import AttentionTiles

#: The ways a dense channels-first convolution runs (``path``/``paths`` values); Winograd
#: only for 3x3 stride-1 2-D ones (:mod:`stagegraph.stages.x86.conv.winograd`).
Path = Literal["direct", "gemm", "winograd"]


class TunedSource(Config):
    """Where ``--cost-model tuned`` finds the paths a tuner chose: the tuning DB and the
    workload and graph they were measured for; ``version`` (the DB's size and time when the
    graph was built) keeps a cached normalization from outliving a grown DB."""

    db: str
    workload: str = ""
    graph: str = ""
    version: str = ""


class ConvGemmConfig(Config):
    """Which channels-first convolutions run as the implicit GEMM of their patches
    (:mod:`stagegraph.stages.x86.conv.gemm`) instead of the direct path.

    ``conv_gemm``: off, every convolution takes the direct path. ``ranks``: the spatial
    ranks (1: ``conv_1d``, 2, 3) that may take the GEMM; the others keep the direct path.
    Within them, ``path`` decides: ``auto`` (the default) asks the cost model of
    :mod:`stagegraph.stages.x86.conv.choice` per convolution (its constants are the
    ``direct_*``, ``gemm_*`` and ``patch_*`` fields below), ``direct`` or ``gemm`` forces
    one path on every convolution. ``paths`` overrides the choice for single
    convolutions, by their :func:`~stagegraph.stages.x86.conv.choice.conv_key` (which
    ``x86.normalize`` stamps on each convolution it decides, see
    :data:`~stagegraph.stages.x86.conv.choice.PATH_ATTRIBUTE`): a tuner or a user pins
    one layer without touching the others. ``col2im`` and its cost model: see below.
    ``min_filters``: fewer filters than this keep the direct path (the patch copy costs
    one move per ``2 * filters`` flops). ``max_patch_elements``: a larger patch matrix
    streams through memory instead of cache; such convolutions keep the direct path."""

    conv_gemm: bool = True
    #: The 2-D convolutions left on the direct path go channels-last here, and the
    #: transposes between them sink until they cancel (conv/chain_layout.py), before the
    #: schedule cuts a large model into groups; off: each goes channels-last on its own in
    #: the schedule's ``prepare`` (``GenericParams.conv_channels_last``).
    chain_channels_last: bool = True
    #: The patch matrix as a gather fused into the packing of B (one pass over the input:
    #: conv/patch_gather.py, ``gather_worth``), else a window copy written out whole, then
    #: packed. The gather where the innermost spatial stride is at least
    #: ``gather_min_stride`` (a unit-stride window copies whole rows with vector moves:
    #: ResNet-18's 64-channel 3x3 layer at 56^2 ran 0.88x gathered) and the input has at
    #: most ``gather_max_channels`` channels or the window at least ``gather_min_taps``
    #: taps. Measured (thread CPU time, under load, docs/measurements.md, session 20,
    #: "Patch matrices gathered into the packed panels"): 3 channels at 3x3/2, 7x7/2 and
    #: 11x11/4 1.12-1.18x, 32 at 5x5/2 1.02x, 64 at 7x7/2 1.04x; 64 and 128 channels at
    #: 3x3/2 0.97x and 0.92x, KernelBench's l1_076 (32 channels, 3 taps) 0.92x.
    gather_patches: bool = True
    gather_min_stride: int = Field(2, ge=1)
    gather_max_channels: int = Field(4, ge=0)
    gather_min_taps: int = Field(25, ge=1)
    path: Literal["auto", "direct", "gemm", "winograd"] = "auto"
    paths: dict[str, Path] = Field(default_factory=dict)
    #: Set by ``--cost-model tuned``: the best measured candidate's paths (its
    #: ``X86Params.conv_paths``) override ``paths`` (see ``x86.normalize``).
    tuned: TunedSource | None = None
    # Measured on an AVX-512 Xeon, one thread, against the direct path on the 35 KernelBench
    # level-1 convolutions (benchmarks/conv_vs_torch.py --direct): every 1-D one ran faster
    # as the GEMM (1.1-3.0x: the direct path has no channels-last form for 1-D and gathers
    # its strided channels); of 19 2-D/3-D ones, one ran faster and 16 slower (0.05-0.7x:
    # their channels-last direct path runs at 60-90% of the FMA peak, and a 3-D window of
    # 27-105 taps makes patch matrices of 10-45 MB that stream through memory).
    # Since the cost model (stagegraph.stages.x86.conv.choice) decides per shape, every rank
    # may take the GEMM; the model keeps those shapes on the direct path.
    ranks: frozenset[int] = frozenset({1, 2, 3})
    # Stride-1 transposed convolutions (a convolution of a zero-padded input): GEMM on the
    # real input then shifted adds (stagegraph.stages.x86.conv.col2im) when its estimated
    # time per useful flop, 1/gemm_efficiency + add_cost/(2*channels), beats the direct
    # path's, 1/(useful_fraction * direct_efficiency). add_cost: an element's shifted add,
    # in flops at the FMA peak. Fitted on an AVX-512 Xeon, one thread: 8 KernelBench
    # stride-1 transposed convolutions with 12-32 channels and 30-100% useful flops.
    col2im: bool = True
    gemm_efficiency: float = Field(0.8, gt=0.0, le=1.0)
    direct_efficiency: float = Field(0.8, gt=0.0, le=1.0)
    add_cost: float = Field(18.0, ge=0.0)
    # The GEMM's products (images x filters x taps x input positions) are all made before
    # the adds read them: beyond this many elements they stream through memory (a 5^3
    # window, 8 images of 16 x 8^3: 8M elements ran 0.75x the direct path; 1.7M, 2x).
    col2im_max_elements: int = Field(1 << 22, ge=1)
    # Beyond one image, the images of a block are as many as keep its products in this
    # fraction of L2 (a divisor of the batch), col2im running block by block. KernelBench's
    # l1_065 (16 filters x 21 taps x 16^2 inputs per image), one thread, AVX-512 Xeon:
    # 2-image blocks ran 1.19x faster than all 8 images at once; at 16x the batch, 1.6x
    # faster than 32-image blocks (docs/measurements.md, "col2im in blocks of images").
    col2im_block_l2_fraction: float = Field(0.5, gt=0.0, le=64.0)
    # The direct-vs-GEMM cost model (stagegraph.stages.x86.conv.choice): times in cycles
    # of one core, the FMA peak and the cache sizes read from the target. Fitted on an
    # AVX-512 Xeon (x86-64-v4, 48 KB L1, 2 MB L2), one thread, to the GEMM/direct speed of
    # 21 convolutions (ResNet-18 and VGG-16 layers at batch 1 and 224^2, small 2-D/3-D
    # ones with 3-128 channels) measured by benchmarks/conv_paths.py under load: all 21 on
    # the faster side (docs/measurements.md, "Convolutions: direct or GEMM"). Only ratios
    # are fitted, so gemm_peak_fraction is pinned at the matmul kernel's efficiency.
    # direct_rows_l1_weight was 0.17: the direct times it was fitted to included the
    # transpose of the result back to NCHW reading one element per cache line
    # (stagegraph.stages.x86.generic.transpose_tiles). With whole lines read, the 64-128
    # channel layers at 28^2-224^2 ran 1.04-1.29x faster direct than on the GEMM, which 0
    # predicts and 0.17 did not (docs/measurements.md, "Transposes that read whole cache
    # lines").
    # Few input channels into many filters (session 22, docs/measurements.md, "Few input
    # channels: direct or GEMM"): with 3-16 channels and 64-128 filters the direct path ran
    # 1.12-1.40x faster than the GEMM on AVX-512 (thread CPU time, under load: 7 shapes
    # from 3 channels at 224^2 to KernelBench's l2_067, 8 -> 64 at 14x30) where the old
    # fit (3.7, no depth term) chose the GEMM; ResNet-18's 7x7/2 first layer stayed 1.12x
    # faster on the GEMM. The GEMM's reduction there is short (channels times taps:
    # 27-200): each K panel's fixed work (its accumulator tile loaded and stored, the
    # patch packed) spreads over few FMAs, ``gemm_depth_half`` (the GEMM at half its rate
    # at that depth); and the direct kernel's channel penalty was smaller than fitted
    # (``direct_channels_half`` 3.7 -> 2). On AVX2 the two paths were within 0.85-1.18x on
    # these shapes; there VGG-16's first layer measured 0.88x direct (the model's miss).
    direct_peak_fraction: float = Field(0.59, gt=0.0, le=1.0)
    direct_channels_half: float = Field(2.0, ge=0.0)
    direct_l1_weight: float = Field(0.001, ge=0.0)
    direct_rows_l1_weight: float = Field(0.0, ge=0.0)
    direct_weight_bytes_per_cycle: float = Field(2.0, gt=0.0)
    # 1-D: the GEMM measured 1.1-3.0x faster on every KernelBench level-1 one (see above).
    direct_1d_fraction: float = Field(0.2, gt=0.0, le=1.0)
    gemm_peak_fraction: float = Field(0.9, gt=0.0, le=1.0)
    # 3-D convolutions: the direct path is the channels-last kernel of
    # stagegraph.stages.x86.conv.direct3d, estimated from its own blocking at this fraction
    # of that estimate (direct3d false: the estimate above, for the 2-D depth loops).
    # On an AVX-512 Xeon, one thread, thread CPU time under load (benchmarks/conv3d_rounds.py),
    # KernelBench's l2_023 (3 -> 24 channels, 3^3) and l2_003's transposed phases (8 -> 64)
    # ran 1.1x faster direct than on the GEMM the 2-D model chose.
    direct3d: bool = True
    direct3d_efficiency: float = Field(0.8, gt=0.0, le=1.0)
    gemm_rows_half: float = Field(11.0, ge=0.0)
    gemm_depth_half: float = Field(48.0, ge=0.0)
    patch_cycles: float = Field(1.5, ge=0.0)
    patch_spill_cycles: float = Field(2.6, ge=0.0)
    # One image's GEMM runs in blocks of output rows whose patch matrix takes this fraction
    # of L2 (stagegraph.stages.x86.conv.gemm_blocks; 0: never), at most max_patch_blocks.
    patch_block_l2_fraction: float = Field(0.5, ge=0.0)
    max_patch_blocks: int = Field(16, ge=1)
    # A block whose columns end in a partial register panel (two vectors) needs this many
    # whole panels (its tail a small share); else blocks take whole panels only.
    partial_block_min_panels: int = Field(16, ge=1)
    # Several images run one by one when each has this many register panels of outputs.
    per_image_min_panels: int = Field(4, ge=1)
    min_filters: int = Field(4, ge=1)
    max_patch_elements: int = Field(1 << 26, ge=1)
    #: Attention chains tiled over (batch, query rows) (stagegraph.stages.x86.attention).
    attention: AttentionTiles = Field(default_factory=AttentionTiles)
    #: Winograd F(winograd_tile, 3) for 3x3 stride-1 2-D f32 convolutions, a third path of
    #: the cost model (stagegraph.stages.x86.conv.winograd; off: never). Tile 4 by default:
    #: F(4, 3) errs about 5x more than F(2, 3) against a float64 reference, but stays 100x
    #: inside the verifier's normwise and 45x inside its elementwise tolerance up to 512
    #: channels, and ran 1.2-2.1x faster than the old paths on ResNet-18/VGG-16/UNet 3x3
    #: layers with 64-512 channels, where F(2, 3) ran 0.6-1.7x (docs/measurements.md,
    #: "Winograd convolutions"). The estimate's constants (winograd_cycles) were fitted
    #: there, on an AVX-512 Xeon, one thread, under load: winograd_transform_cycles per
    #: element the transforms write or read (alpha^2 per tile, channels plus filters), the
    #: matmuls' efficiency halved at winograd_columns_half filters and channels and at
    #: winograd_rows_half tile positions, the transformed filters past L2 streamed at
    #: winograd_weight_bytes_per_cycle.
    winograd: bool = True
    winograd_tile: Literal[2, 4] = 4
    winograd_transform_cycles: float = Field(1.5, ge=0.0)
    winograd_columns_half: float = Field(32.0, ge=0.0)
    winograd_rows_half: float = Field(8.0, ge=0.0)
    winograd_weight_bytes_per_cycle: float = Field(32.0, gt=0.0)
    #: Winograd is chosen only where its estimate beats the best other path's by this
    #: factor: the layer measurements it was fitted to ran warm (the transformed filters,
    #: alpha^2/9 times the weights, stayed in cache between calls), a model streams them.
    #: KernelBench's RegNet (l3_027: 64 channels, 7x14, 8 images, estimated 1.11x faster)
    #: ran 0.97 [0.93, 1.00] with it at 1.0.
    winograd_margin: float = Field(1.2, ge=0.0)
    #: The alpha^2 matmuls of a layer as one matmul in a loop over the taps
    #: (stagegraph.stages.x86.conv.winograd_loop): one kernel to compile instead of 36,
    #: but constant filters are packed per call.
    winograd_loop: bool = False
