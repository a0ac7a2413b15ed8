"""The conv2d schedule: NCHW conv2d (any kernel, stride, padding, dilation; groups=1) + injective epilogue.

Recognised from the blocks: one reduction block ``C[n, f, y, x] += D[n, c, ..y.., ..x..] * W[f, c, r, s]``
(casts allowed) whose output and weight indices are bare iterators in NCHW / OIHW order. Its padding
prologue (``pad_temp``, with whatever injective ops feed it inlined, e.g. the Focus slicing) is computed
inside the one parallel loop when that loop runs over blocks of output rows (each task pads the input rows
of its block, halo rows twice: no second fork/join, the rows stay in the core's cache; measured faster with
two threads, the same with one), else once at the root, parallel over channels. Epilogue ops (folded-BN
bias, activation, residual add) are fused into the store of each output tile, which reaches NCHW through a
register transpose where the tile has its shape (``transpose.py``; measured faster on one core, most on
strided and pointwise convs). Where the NCHW-order epilogue would read the accumulator lane-strided in
vectors of 1-2 columns (7/14-wide planes), it runs on channel vectors instead and the output-side register
transpose stores its result (``_lane_epilogue_columns``). Grouped and depthwise convs have another index
structure and are left to the fallback rule.

Tiling: the accumulator tile (ocb output channels x owr output columns of one row) lives in ``local.UB``
in an NCHW[vl]c layout, so the vector axis (output channels) is innermost; each FMA multiplies vl output
channels by one broadcast input pixel. ocb x owr is the host's register block (AVX-512: 32 x 8 fp32 =
16 zmm accumulators), which on the NPU is a small UB tile (1 KiB) well inside usable UB for any conv. The
weight is re-laid out to (OC/ocb, IC, KH, KW, ocb) when it is a compile-time constant (``layout.py``).
A pointwise conv's NCHW input staged NCHW[16]c (``_wants_nchwc``) is copied through the input-side register
transpose (16 channels x 8 columns, ``transpose.py``) where the width is a multiple of 8, else gathered lane
by lane (the transpose measured faster on every pointwise shape tried, most where the input has few
channels per output).

A row whose only tail-free register block is one column wide, or which has none (prime widths: 71, 73,
149; 17 on AVX2), is padded to whole blocks instead (``column_pad.py``, a rewrite into a new schedule: the
conv2d rule's option ``column_pad``; the pool rule pads the conv in front of its pool itself).

Tuning: with a ``tiles`` chooser the register block and the blocks of output rows become one sampled
decision over ``conv_candidates`` (``tunable.py``), the schedule's own choice first; without one the schedule
makes its own.

A function, not a rule: the conv2d rule applies it to a conv kernel, the pool rule to the conv in front of a
pool (ResNet's stem conv + max-pool) in the same kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import ScheduleError

from ..ir import dtype_bytes
from ..target import AscendTarget
from .analysis import LOAD, ConvBlock, match_conv2d, strip_cast
from .base import UB_SCOPE
from .concat_staging import channel_parts, partition_channels
from .column_pad import pad_conv_columns, padded_columns
from .common import (as_target, extent, is_output_block, new_schedule, ok, on_copy_first, parallel_vector,
                     root_blocks, still_exists, tile_local, try_, unwritten_output, vector_width_for,
                     vectorize_inner)
from .hostvec import HostVector
from .layout import mark_prepack, packable_param
from .row_blocks import loop_tiles, runs_each_point_once, tiles_are_boxes
from .transpose import out_transpose_intrin, transpose_intrin, transpose_load, transpose_store, transpose_to_nchw

_SUBSAMPLE = "ascendfuse.conv_subsample"   # marks the gathered input of a strided 1x1 conv
NOTE = "ascendfuse.schedule"               # the block annotation that says how the conv was scheduled
# vector ops per output vector of the epilogue's own pass through the UB tile on channel vectors (store,
# load, the share of the shuffle network): the arithmetic it saves must exceed it (_lane_epilogue_columns)
LANE_PASS_OPS = 4
# rows per core from which a concat's input staged at the root is split per part (_stage_parts_by_rows)
STAGE_MIN_ROWS_PER_CORE = 4
# pixel blocks per core a pointwise conv on pixel vectors needs (_pixel_vector_plan): fewer leave a core idle
# at the end of the parallel loop, and the plane is small enough for the channel chunks
PIXEL_TASKS_PER_CORE = 4
# pixels of the smallest plane a pointwise conv runs on pixel vectors over (_pixel_vector_plan): smaller ones
# keep the channel-vector path, whose channel chunks reuse weights across the plane
PIXEL_MIN_PLANE = 32 * 32


@dataclass(frozen=True)
class ConvTiles:
    vl: int     # lanes along output channels
    ocr: int    # vectors along output channels: ocb = ocr * vl
    owr: int    # output columns of the register block

    @property
    def ocb(self) -> int:
        return self.ocr * self.vl


@dataclass(frozen=True)
class ConvChoice:
    """One point of the tunable space: the register block and the blocks of output rows of the parallel
    loop when each task pads its own rows (None: the rule's path has no such blocks)."""

    tiles: ConvTiles
    row_blocks: int | None


def conv_candidates(default: ConvChoice, oc: int, ow: int, dtype: str, hv: HostVector, target: AscendTarget,
                    accept=None, row_blocks=()) -> list[ConvChoice]:
    """Choices a tuner may try: the default first, then every register block of ``ocr`` vectors (dividing
    OC) x ``owr`` columns (dividing OW, or the most the accumulators allow) that keeps at least a quarter of
    the host's accumulator registers busy and fits the rule's UB checks (double-buffered accumulator tile
    within usable UB; ``accept(tiles)``: the path's own check, e.g. the channel chunks of a small plane),
    each with every block count of ``row_blocks`` (already L1-checked by the caller)."""
    vl, acc = default.tiles.vl, hv.accumulators
    nbytes = target.element_bytes(dtype)
    copies = 2 if target.double_buffer else 1
    blocks = [default.row_blocks] + [b for b in row_blocks if b != default.row_blocks]
    out = [default]
    for ocr in range(1, acc + 1):
        if oc % (ocr * vl):
            continue
        cap = min(ow, acc // ocr)
        for owr in sorted({d for d in range(1, cap + 1) if ow % d == 0} | {cap}):
            if 4 * ocr * owr < min(acc, oc // vl * ow):
                continue
            if copies * target.align_up(ocr * vl * owr * nbytes) > target.ub_usable:
                continue
            if accept is not None and not accept(ConvTiles(vl, ocr, owr)):
                continue
            for rb in blocks:
                c = ConvChoice(ConvTiles(vl, ocr, owr), rb)
                if c not in out:
                    out.append(c)
    return out


def choose_conv_tiles(oc: int, ow: int, dtype: str, hv: HostVector, target: AscendTarget,
                      columns_first: bool = False, pointwise: bool = False, ic: int | None = None,
                      pad_columns: bool = False) -> ConvTiles:
    """Register block from the host's vector file, capped so the accumulator tile fits usable UB.

    Default: two vectors of output channels (fewest loads per FMA), as many columns as the accumulators
    allow. ``columns_first`` (a conv with KW > 1 whose every register block re-reads all its weights from
    L2): each weight vector feeds owr FMAs, and below half the accumulator count of columns per vector the
    weight stream outpaces the FMAs, so the column block comes first, then the accumulator count.
    With the NCHW input (``_wants_nchwc``) it measured faster on this host (one core) for 3x3 convs of 128
    and 256 channels, strided or not (1 x 14 instead of 2 x 7 at a width of 28); where the default already
    has 8 columns it keeps 2 x 8. Pointwise convs and small planes (weights cache resident) keep the default:
    1 x 14 measured slower there (one broadcast load per FMA, no sliding reuse along KW).
    ``pointwise`` (a 1x1 conv on a plane too large for ``_plane_chunk``, input staged NCHW[vl]c or read
    in place): one full vector of output channels x half the accumulator count of columns (8 on AVX-512:
    the tile of the store transpose, which 1 x 14 and 1 x 16 miss). Measured on this host (one core,
    interleaved A/B) 15-40% faster than 2 x 8, 1 x 14 or 1 x 16 for 16..64 input channels on 56x56 and
    112x112 planes (MobileNet/EfficientNet expansions, ResNet-50 stage 1), ~5% for 256 channels, neutral
    for strided ones. A host with fewer accumulators keeps the default: on 16 registers 1 x 4 holds four
    FMAs in flight, and measured 1.10 ms where 2 x 4 took 0.83 (64 -> 256 on 56x56, 2-core Zen 3, ORT 0.79).
    Narrower vectors (24, 40 channels: no store transpose) keep the default, and so do
    convs of at least ``POINTWISE_TWO_VECTOR_IC`` input channels (``ic``) on rows that block does not
    divide (14, 19, 38 wide on AVX-512: a narrower divisor such as 1 x 7, or a column tail, and no whole
    store transposes; the long reduction makes FMAs per load count): Xception's 728->728 (padded to 736)
    took 1.06 ms with 2 x 8 on 19x19 where 1 x 8 took 1.57, 0.42 with 2 x 7 on 14x14 where 1 x 7 took
    0.56 (2-core Zen 5, own processes); 128->128 on 150x150 stayed faster with 1 x 8 (4.0 vs 5.1 ms).
    Whichever block leaves a column tail gives way to one whose columns divide OW (``_tail_free_block``).
    With ``pad_columns`` (the caller pads the row to whole blocks, ``column_pad.py``) the block is kept, to
    be padded, where no tail-free block exists or the only one is a single column wide: on a 16-register
    host a prime width gets 4 vectors x 1 column, each weight vector feeding one FMA. Measured on a 2-core
    Zen 3 (conv + bias + ReLU, own processes): 80->192 3x3 on 73x73 (71 columns) 18.9 -> 9.7 ms padded to
    2 x 4 over 72 columns (ORT 8.3), Inception's 160->160 1x7 on 17x17 1.18 -> 0.77 ms (ORT 0.67)."""
    lanes = hv.lanes(dtype)
    vl = 1
    while vl * 2 <= lanes and oc % (vl * 2) == 0:
        vl *= 2
    acc = hv.accumulators

    def columns(ocr, limit=acc):
        cap = max(1, min(ow, limit // ocr))
        # prefer a column block dividing OW (no predicated tail) if one is at least half the cap
        owr = next((d for d in range(cap, 0, -1) if ow % d == 0), cap)
        return cap if owr * 2 <= cap else owr

    counts = (2, 1)
    if vl < lanes and not columns_first:
        # OC not a multiple of the host's full vector (24, 72, 120 channels: MobileNet/EfficientNet
        # widths that are multiples of 8, not 16): narrower vectors, so take as many of them as cover the
        # channels two full vectors would, each broadcast input pixel then feeds as many lanes
        counts = (max(r for r in range(1, 2 * lanes // vl + 1) if oc % (r * vl) == 0), 1)
    cands = [(ocr, columns(ocr)) for ocr in dict.fromkeys(counts) if oc >= ocr * vl and oc % (ocr * vl) == 0]
    if pointwise and vl == lanes and acc // 2 >= IN_TRANSPOSE_COLS and ow >= acc // 2 and (
            ow % (acc // 2) == 0 or ic is None or ic < POINTWISE_TWO_VECTOR_IC):
        ocr, owr = 1, columns(1, max(1, acc // 2))
    elif columns_first:
        ocr, owr = max(cands, key=lambda c: (c[1] * 2 >= acc, c[0] * c[1], c[0]))
    else:
        ocr, owr = cands[0]
    if ow % owr:
        # full vectors: one or two of them, else four (a row only 3 columns divide); narrower ones keep the
        # count that covers the channels
        counts = ((1, 2), (4,)) if vl == lanes else ((ocr,),)
        free = next((b for b in (_tail_free_block(oc, ow, vl, acc, c) for c in counts) if b), None)
        if free is not None and not (pad_columns and ow > owr and free[1] == 1):
            ocr, owr = free
    nbytes = target.element_bytes(dtype)
    copies = 2 if target.double_buffer else 1
    while owr > 1 and copies * target.align_up(ocr * vl * owr * nbytes) > target.ub_usable:
        owr //= 2
    return ConvTiles(vl, ocr, owr)


# input channels from which a pointwise conv whose row the one-vector block does not divide takes two vectors
POINTWISE_TWO_VECTOR_IC = 256
# columns of the input-side register transpose (transpose.transpose_load): a row it does not divide is staged
# NCHW[vl]c lane by lane
IN_TRANSPOSE_COLS = 8


def _prime_row_block(t: ConvTiles, ow: int, dtype: str, hv: HostVector) -> ConvTiles | None:
    """One full vector x 11 or 13 columns for a pointwise conv whose one-vector block has fewer columns than
    half the accumulators because OW's divisors skip from a few to 11 or 13 (55 = 5 x 11; 13x13 planes take
    the channel chunks instead), else None. Such a row block stores through one transpose of two 8-column
    halves (``transpose.py``), and the conv then reads its NCHW input in place: no 8-column input transpose
    divides such a row, so staging it NCHW[vl]c was a lane-by-lane gather of the whole input. Measured on a
    2-core Zen 5 (one thread, own processes alternating, loaded machine): SqueezeNet's 1x1 16->64 and 64->16
    on 55x55 0.063 -> 0.043 and 0.074 -> 0.031 ms against 1 x 5 columns on the staged input."""
    if t.ocr != 1 or t.vl != hv.lanes(dtype) or 2 * t.owr >= hv.accumulators:
        return None
    owr = next((p for p in (13, 11) if ow % p == 0 and p <= hv.accumulators), None)
    return None if owr is None else ConvTiles(t.vl, 1, owr)

# accumulators a register block without a column tail may hold beyond ``HostVector.accumulators``: with 32
# zmm registers, 2 x 9 (18) still left the weight vectors and the broadcast in registers (measured fastest
# at a width of 27), 2 x 13 (26) was slower than 1 x 13
TAIL_FREE_EXTRA = 2


def _tail_free_block(oc: int, ow: int, vl: int, acc: int, counts) -> tuple[int, int] | None:
    """(ocr, owr) of a register block whose columns divide OW, for a row the chosen block would leave a
    tail of (13, 17, 27, 35 and 55 columns: SqueezeNet, Inception), else None.

    A tail puts every column of the unrolled block (its FMAs, its init and its store) under a condition on
    the column: measured on a 2-core Zen 5 (one conv + bias + ReLU, interleaved) 1.5-2.4x
    slower than a tail-free block, 3x3 and 1x1 alike (96->96 at 35 wide: 1 x 16 104 GFLOP/s, 2 x 7 253;
    32->128 at 27: 2 x 8 127, 2 x 9 239; 256->64 1x1 at 13: 1 x 8 46, 1 x 13 91). Blocks of ``counts``
    vectors, at least half the accumulators busy and at most ``TAIL_FREE_EXTRA`` more than them; the most
    accumulators, then more vectors. Four vectors are asked for only when one or two leave no such block:
    SqueezeNet's stem (3x3/2 conv 3->64, 111 columns = 3 x 37) took 0.30 ms with 4 x 3 where its 2 x 8
    block with a 7-column tail took 0.54 (2-core Zen 5, interleaved)."""
    best = None
    for ocr in counts:
        if oc % (ocr * vl):
            continue
        for owr in range(1, ow + 1):
            used = ocr * owr
            if ow % owr or used * 2 < acc or used > acc + TAIL_FREE_EXTRA:
                continue
            if best is None or (used, ocr) > (best[0] * best[1], best[0]):
                best = (ocr, owr)
    return best


@dataclass(frozen=True)
class ConvOptions:
    """How the conv2d schedule may shape a kernel; the defaults are the measured recipe."""

    prepack: bool = True             # re-lay a constant weight out (OC/ocb, IC, KH, KW, ocb) at compile time
    # 0: no channel chunks (the measured recipe); None: chunk from the target's UB (measured faster on a
    # strided 3x3 conv, slower on a 14x14 plane on this host, so not the default); n: n channels (tuning)
    channel_chunk: int | None = 0
    nchwc_min_ic: int | None = None  # see _wants_nchwc; 0: never re-lay the input out
    nchwc_min_plane: int = 2048
    plane_chunks: bool = True        # small output planes: channel chunks outside the pixel loops (_plane_chunk)
    chunk_one_block_rows: bool = False  # also a pointwise conv whose output row is one register block
    row_block_max_plane: int = 4096
    subsample_strided: bool = True   # a strided 1x1 conv gathers its input pixels first
    pixel_vectors: bool = True       # stride-1 1x1 convs on large planes on pixel vectors (_pixel_vector_plan)
    flat_plane: bool = True          # one kernel row/column, rows no block fits: one pixel axis (_flat_plane_plan)
    pad_in_task: bool = True         # see _row_blocks
    row_blocks: int | None = None    # None: from the core count (_row_blocks); n: n blocks (tuning)
    transpose: bool = True           # NCHW[vl]c -> NCHW store through register shuffles (transpose.py)
    transpose_input: bool = True     # NCHW -> NCHW[icb]c input staging through register shuffles
    concat_parts: bool = True        # a concat's staged input copied one loop per part (concat_staging.py)
    # epilogue on channel vectors, stored through the output transpose (_lane_epilogue_columns): True where
    # the NCHW-order epilogue would read the accumulator lane-strided, "always" also for 8-column blocks
    lane_epilogue: bool | str = True
    # the parallel loop over (batch, output channel blocks) only, every task computing whole planes of its
    # channels (rows stay in the task): a pool over the plane behind the conv sums them in the same task
    whole_planes: bool = False
    # a row the register block leaves a tail of is padded to whole blocks (``column_pad.py``): a rewrite into
    # a new schedule, so only for a caller that takes the returned schedule (the conv2d rule)
    column_pad: bool = False
    columns: int | None = None       # the row's own width when the conv computes it padded (column_pad)
    # ``tiles(sch, default, candidates)``, when given, picks the ConvChoice to use (a tuner samples one of
    # ``candidates()``, see ``tunable.py``); without it the schedule makes its own choice
    tiles: object = None


DEFAULT_OPTIONS = ConvOptions()


def _wants_nchwc(opts: ConvOptions, sch, conv, info, ic, icb) -> bool:
    """Re-lay the input out NCHW[icb]c when the channel planes are far apart (a plane of at least
    ``nchwc_min_plane`` bytes: every channel of a register block's reads is another line and page) and
    the conv is pointwise, or (``nchwc_min_ic`` set) reads at least that many channels per output.
    Measured much faster on this host for wide pointwise convs on large planes. Convs with a larger kernel
    keep NCHW (read in place, padded per task): with the column-first register blocks of
    ``choose_conv_tiles`` NCHW measured faster than NCHW[16]c on 3x3 convs, strided or not (one core)."""
    if ic is None or ic % icb:
        return False
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    if None in d_shape or None in w_shape:
        return False
    plane = d_shape[2] * d_shape[3] * dtype_bytes(info.out_dtype)     # host memory: the bytes computed in
    wide = opts.nchwc_min_ic is not None and ic >= opts.nchwc_min_ic
    return plane >= opts.nchwc_min_plane and (w_shape[2] * w_shape[3] == 1 or wide)


def _channel_chunk(opts: ConvOptions, ic, sch, conv, ow, target, info) -> int | None:
    """Input channels per chunk when the input rows one output row needs (KH rows of the padded input,
    every channel) exceed a quarter of usable UB (double-buffered input, weights, accumulator), else
    None. 1x1 convs are not chunked: their accumulator row would leave the registers for one FMA per
    channel (measured slower)."""
    if opts.channel_chunk is not None:
        return opts.channel_chunk or None
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    if ic is None or None in w_shape or None in d_shape or w_shape[2] * w_shape[3] == 1:
        return None
    per_channel = w_shape[2] * d_shape[3] * target.element_bytes(info.out_dtype)
    budget = target.ub_usable // 4
    if ic * per_channel <= budget:
        return None
    chunk = max(1, budget // per_channel)
    while ic % chunk:
        chunk -= 1
    return chunk if chunk < ic else None


def _reduction_chunk(ic: int, per_channel: int, budget: int, lo: int, hi: int) -> int | None:
    """Input channels per chunk of the reduction: the largest multiple of 8 in [lo, hi] that divides IC into
    at least two chunks whose working set (``per_channel`` bytes a channel) fits ``budget``, else None (144,
    240, 480, 672 channels take 48, not only powers of two)."""
    return next((c for c in range(hi - hi % 8, lo - 1, -8)
                 if ic % c == 0 and 2 * c <= ic and c * per_channel <= budget), None)


def _plane_chunk(opts: ConvOptions, ic, out_dims, sch, conv, info, t: ConvTiles, target, hv: HostVector):
    """(input channels per chunk, output rows per block) for a small output plane, else None.

    With the reduction innermost, every register block streams the weights of all IC channels
    (IC x KH x KW x ocb) from L2 and reuses them for one block only. On a small plane (7x7, 14x14) the
    accumulator of a whole block of output rows fits UB, so the channel chunk loop goes outside the
    pixel loops and one chunk of weights plus its input planes is reused by every block of the plane.
    A pointwise stride-1 conv whose input planes are at most ``row_block_max_plane`` bytes (one page)
    may use a block of output rows instead of the whole plane when the plane's accumulator is too big;
    it then reads the input in place instead of re-laying it out NCHW[vl]c (a full copy per call).
    Sizes: accumulator and the chunk's working set (weights + input rows) each within a quarter of
    usable UB, chunks of 16..64 channels (a multiple of 8 dividing IC); the rows are split further only to
    give every core two tasks.
    Measured on this host, one core (ResNet-50 shapes): faster for 3x3 and 1x1 convs on 7x7 and 14x14
    planes and for 1x1 convs on 28x28 (row blocks); neutral for 3x3 on 28x28 and 56x56; slower than the
    NCHW[vl]c input for 1x1 on 56x56 and strided 1x1, and with 8-channel chunks: those keep the
    register-resident reduction. So does a pointwise conv whose output row is one pointwise register block
    (``choose_conv_tiles(pointwise=True)``, 7 columns on a 7x7 plane): measured 5-30% faster than the
    chunks with 160..960 input channels, neutral with 512 (one core, interleaved; MobileNet/EfficientNet
    expansions on 7x7)."""
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    oc, oh, ow = out_dims
    if ic is None or None in w_shape or None in d_shape or None in (oh, ow, oc):
        return None
    if not opts.chunk_one_block_rows and w_shape[2] == w_shape[3] == 1 and ow <= max(1, hv.accumulators // 2):
        return None
    nbytes = target.element_bytes(info.out_dtype)
    budget = target.ub_usable // 4
    fit = oh
    while fit > 1 and (oh % fit or fit * ow * t.ocb * nbytes > budget):
        fit -= 1
    pointwise = w_shape[2] == w_shape[3] == 1 and d_shape[2:] == [oh, ow]
    row_blocks_ok = pointwise and d_shape[2] * d_shape[3] * nbytes <= opts.row_block_max_plane
    if fit * ow * t.ocb * nbytes > budget or (fit < oh and not row_blocks_ok):
        return None
    in_rows = min(d_shape[2], -(-d_shape[2] * fit // oh) + w_shape[2])
    per_channel = (w_shape[2] * w_shape[3] * t.ocb + in_rows * d_shape[3]) * nbytes
    chunk = _reduction_chunk(ic, per_channel, budget, 16, 64)
    if chunk is None:
        return None
    tasks_per_row = -(-oc // t.ocb)
    row_blocks = max(1, -(-2 * hv.cores // tasks_per_row))
    rows = min(fit, -(-oh // row_blocks))
    while oh % rows:
        rows += 1
    if tasks_per_row * (oh // rows) < 2 * hv.cores:
        return None      # too few parallel tasks left (few output channels, prime row count)
    return chunk, rows


def schedule_conv2d(sch, blocks, ci, info: ConvBlock, target, hv: HostVector, opts: ConvOptions = DEFAULT_OPTIONS):
    """Schedule the conv2d ``info`` (block ``ci`` of ``blocks``, the function's root blocks; the blocks after
    it are its injective epilogue) in place; None when its output channels or columns are symbolic. Used by
    the conv2d rule, and by the pool rule for the conv in front of a pool."""
    conv = info.block
    lanes = hv.lanes(info.out_dtype)
    # prologue: everything inlined into the block the conv reads (pad_temp), materialised at the root
    pro = blocks[:ci]
    for b in pro:
        if not any(sch.get(c).same_as(sch.get(conv)) for c in sch.get_consumers(b)):
            ok(sch.compute_inline, b)
    loops = sch.get_loops(conv)
    ic = extent(sch, loops[4])
    oc, oh, ow = extent(sch, loops[1]), extent(sch, loops[2]), extent(sch, loops[3])
    if oc is None or ow is None:
        return None
    pads = [b for b in pro if still_exists(sch, b)]
    plan = _pixel_vector_plan(opts, sch, conv, info, pads, (oc, oh, ow), hv)
    if plan is not None:
        if on_copy_first(sch, lambda s: _pixel_vectors(s, conv, info, pads, blocks[ci + 1:], ow, plan, lanes, opts)):
            return sch
    # (a caller that needs whole planes per task, a pool summed from the conv's tiles, keeps the row form)
    flat = None if opts.whole_planes else _flat_plane_plan(opts, sch, conv, info, pads, (oc, oh, ow), ic, hv,
                                                           as_target(target))
    if flat is not None:
        if on_copy_first(sch, lambda s: _flat_plane(s, conv, info, pads, blocks[ci + 1:], (oc, oh, ow), flat, hv,
                                                   opts) and unwritten_output(s.mod["main"]) is None):
            return sch
    if opts.subsample_strided:
        sub = _subsample_strided_pointwise(sch, conv, info, pro, (oh, ow))
        if sub is not None:
            pro, info = sub
    pad_columns = opts.column_pad and opts.tiles is None
    t = choose_conv_tiles(oc, ow, info.out_dtype, hv, as_target(target), pad_columns=pad_columns)
    icb = hv.lanes(info.out_dtype)
    pad_blocks = [b for b in pro if still_exists(sch, b)]
    plane = None
    if opts.plane_chunks and opts.channel_chunk == 0 and len(pad_blocks) <= 1:
        plane = _plane_chunk(opts, ic, (oc, oh, ow), sch, conv, info, t, as_target(target), hv)
    if plane is not None or not (opts.nchwc_min_ic != 0 and len(pad_blocks) == 1
                                 and _wants_nchwc(opts, sch, conv, info, ic, icb)):
        icb = None
    kw = extent_of(info.weight_buf.ty.shape[3])
    if plane is None and icb is None and opts.channel_chunk == 0 and kw is not None and kw > 1:
        t = choose_conv_tiles(oc, ow, info.out_dtype, hv, as_target(target), columns_first=True,
                              pad_columns=pad_columns)
    elif plane is None and kw == 1 and extent_of(info.weight_buf.ty.shape[2]) == 1:
        t = choose_conv_tiles(oc, ow, info.out_dtype, hv, as_target(target), pointwise=True, ic=ic,
                              pad_columns=pad_columns)
        prime = _prime_row_block(t, ow, info.out_dtype, hv) if opts.transpose and opts.transpose_input else None
        if prime is not None and len(pad_blocks) == 1 and (icb is None or ow % IN_TRANSPOSE_COLS):
            t, icb = prime, None
    for b in pro:
        if icb is None and still_exists(sch, b) and _is_plain_copy(sch, b) and \
                _SUBSAMPLE not in sch.get(b).annotations:
            ok(sch.compute_inline, b)     # a "pad" of zero width (1x1 convs): read the input directly
    rci = _channel_chunk(opts, ic, sch, conv, ow, as_target(target), info) if icb is None else None
    rows = 1
    if plane is not None:
        rci, rows = plane
    blocks_of_rows, fits = None, None
    pads_left = [b for b in pro if still_exists(sch, b)]
    # (a prologue that is also a kernel output, e.g. ShuffleNetV2's channel shuffle, cannot move into the
    # parallel loop: it stays at the root)
    if opts.pad_in_task and icb is None and rci is None and len(pads_left) == 1 and oh is not None \
            and not is_output_block(sch, pads_left[0]):
        fits = _padded_rows_fit(sch, pads_left[0], oh, info, as_target(target))
        blocks_of_rows = opts.row_blocks if opts.row_blocks and oh % opts.row_blocks == 0 \
            else _row_blocks(oh, hv.cores, fits)
    chosen = default = ConvChoice(t, blocks_of_rows)
    if opts.tiles is not None:
        # a small plane's channel chunk and rows follow the register block, as the rule derives them
        replan = (lambda tiles: _plane_chunk(opts, ic, (oc, oh, ow), sch, conv, info, tiles,
                                                  as_target(target), hv)) if plane is not None else None
        more = [] if blocks_of_rows is None else _row_block_choices(oh, hv.cores, fits)
        chosen = opts.tiles(sch, default, lambda: conv_candidates(
            default, oc, ow, info.out_dtype, hv, as_target(target),
            replan and (lambda tiles: replan(tiles) is not None), more))
        t, blocks_of_rows = chosen.tiles, chosen.row_blocks
        if replan is not None and chosen != default:
            rci, rows = replan(t)
    if pad_columns and padded_columns(ow, t.owr) is not None:
        padded = _pad_columns(sch, blocks, ci, t, target, hv, opts)
        if padded is not None:
            return padded
    packed = False
    if opts.prepack and oc % t.ocb == 0 and packable_param(sch, info.weight_buf) is not None:
        ocb = t.ocb
        mark_prepack(sch, conv, info.weight_read, lambda f, c, r, s: (f // ocb, c, r, s, f % ocb))
        packed = True
    epi = epi_blocks = list(blocks[ci + 1:])
    out_shape = sch.get(conv).writes[0].source.ty.shape
    if opts.columns is not None:         # the epilogue covers the row's own columns, not the padded ones
        out_shape = [*out_shape[:3], tirx.IntImm(str(out_shape[3].ty.dtype), opts.columns)]
    tiled_epi = all(tile_local(sch, b, out_shape) for b in epi)
    if epi and tiled_epi:
        sch.set_scope(conv, 0, UB_SCOPE)
    else:
        # No epilogue, or one that changes the shape (e.g. a concatenate the grouping merged in): it
        # cannot run per conv tile, so the accumulator tile goes through UB and the epilogue runs after.
        rest, epi = epi, [sch.cache_write(conv, 0, UB_SCOPE)]
        if rest:
            *before, after = rest
            for b in before:
                ok(sch.compute_inline, b)
            parallel_vector(sch, after, lanes)
    *inner, last = epi
    for b in inner:
        ok(sch.compute_inline, b)
    n, ff, yy, xx, rc, ry, rx = sch.get_loops(conv)
    f0, f1, f2 = sch.split(ff, [None, t.ocr, t.vl])
    x0, x1 = sch.split(xx, [None, t.owr])
    if icb is not None:
        # many input channels: the (padded) input is re-laid out NCHW[icb]c once, so the channels one
        # register block reads are contiguous (few pages and lines per tile instead of one per channel)
        pad = pad_blocks[0]
        parts = channel_parts(sch, pad) if opts.concat_parts else None
        sch.transform_layout(pad, ("write", 0), lambda a, c, h, w: (a, c // icb, h, w, c % icb))
        pn, pc, ph, pw = sch.get_loops(pad)
        pco, pci = sch.split(pc, [None, icb])
        staged = None
        if parts is not None and all(b % icb == 0 for b in parts):
            # a concat: parallel over rows, each row's channel chunks one loop per part (no select)
            sch.reorder(pn, ph, pco, pw, pci)
            staged = partition_channels(sch, pco, parts, icb)
            if staged is not None:
                try_(sch.parallel, sch.fuse(pn, ph))
        if staged is None:
            sch.reorder(pn, pco, ph, pw, pci)
            try_(sch.parallel, sch.fuse(pn, pco, ph))
            staged = [pad]
        for part in staged:
            if not (opts.transpose_input and transpose_load(sch, part, icb)):
                try_(sch.vectorize, sch.get_loops(part)[-1])      # one scalar load and insert per element
        rco, rc = sch.split(rc, [None, icb])
        sch.reorder(n, f0, yy, x0, rco, ry, rx, rc, x1, f1, f2)
        red_outer, epi_at = rco, x0
    elif rci is not None:
        # input channels in chunks whose input rows (one output row) or whole input planes (a block of
        # output rows) stay cache/UB resident; the accumulator holds those output rows across chunks
        rco, rc = sch.split(rc, [None, rci])
        if rows > 1:
            yy, yi = sch.split(yy, [None, rows])
            sch.reorder(n, f0, yy, rco, yi, x0, rc, ry, rx, x1, f1, f2)
        else:
            sch.reorder(n, f0, yy, rco, x0, rc, ry, rx, x1, f1, f2)
        red_outer, epi_at = rco, yy
    else:
        sch.reorder(n, f0, yy, x0, rc, ry, rx, x1, f1, f2)
        red_outer, epi_at = rc, x0
    if oc % t.vl == 0:
        vl = t.vl
        sch.transform_layout(conv, ("write", 0), lambda a, f, y, x: (a, f // vl, y, x, f % vl))
    acc = sch.get(conv).writes[0].source
    # an epilogue follows each tile only where it reads the tile as a box of its own iterations: a reshape
    # that cuts tiles apart (MobileViT's unfold of 2x2 patches under 7-row tiles) would be given rows the
    # tile did not compute (row_blocks.tiles_are_boxes); it then runs after the conv, over the whole result
    tiles = loop_tiles(sch, conv, epi_at)
    if tiles is None or not tiles_are_boxes(sch.get(last), acc, tiles):
        try_(sch.set_scope, conv, 0, "global")       # the accumulator is the whole result now, not a tile
        parallel_vector(sch, last, lanes)
        last = None
    cols = _lane_epilogue_columns(opts, sch, last, acc, out_shape, epi_at is x0, t, ow) \
        if oc % t.vl == 0 and last is not None else None
    lane_note = ""
    if last is None:
        pass
    elif cols is not None and _if_it_applies(
            sch, lambda s: _epilogue_on_lanes(s, last, epi_at, t.vl, cols, copy=not (epi_blocks and tiled_epi))
            and unwritten_output(s.mod["main"]) is None):
        lane_note = f" epilogue on {t.vl}-lane channel vectors, {cols}-column store transposes"
    elif _if_it_applies(sch, lambda s: ok(s.reverse_compute_at, last, epi_at)
                        and unwritten_output(s.mod["main"]) is None
                        and runs_each_point_once(s, last) is not False):
        if opts.transpose and epi_at is x0 and oc % t.vl == 0:
            transpose_store(sch, last, acc, t.owr, t.vl)
        vectorize_inner(sch, last, lanes)
    else:
        parallel_vector(sch, last, lanes)
    sch.vectorize(f2)
    try_(sch.unroll, f1)
    try_(sch.unroll, x1)
    try_(sch.unroll, rx)
    if blocks_of_rows is not None:
        # one parallel region: each task pads the input rows of its block of output rows itself (no
        # separate fork/join, and the padded rows stay in the cache of the core that reads them)
        yb, yi = sch.split(yy, [blocks_of_rows, None])
        sch.reorder(yb, f0)
        task = sch.fuse(n, yb)
        sch.parallel(task)
        sch.compute_at(pads_left[0], task)
    else:
        sch.parallel(sch.fuse(n, f0) if opts.whole_planes else sch.fuse(n, f0, yy))
        for b in pro:
            if icb is None and still_exists(sch, b):   # the padded input, once at the root: parallel
                if not (opts.concat_parts and _stage_parts_by_rows(sch, b, lanes, hv.cores)):
                    pl = sch.get_loops(b)
                    try_(sch.parallel, sch.fuse(*pl[:2]) if len(pl) > 2 else pl[0])
    init = sch.decompose_reduction(conv, red_outer)
    il = sch.get_loops(init)
    try_(sch.vectorize, il[-1])
    try_(sch.unroll, il[-2])
    try_(sch.unroll, il[-3])
    rows_note = f" row_blocks={blocks_of_rows}" if chosen.row_blocks != default.row_blocks else ""
    pad_note = f", {opts.columns} columns padded to {ow}" if opts.columns is not None else ""
    sch.annotate(conv, NOTE, f"{'packed ' if packed else ''}{t}{rows_note}{lane_note}{pad_note}")
    return sch


def _pad_columns(sch, blocks, ci, tiles: ConvTiles, target, hv: HostVector, opts: ConvOptions):
    """The kernel rewritten to compute its rows padded to whole register blocks of ``tiles.owr`` columns
    (``column_pad.py``) and scheduled with the block ``tiles``: a new schedule, or None to keep the kernel as
    it is (an epilogue that does not run per tile, a form the rewrite does not know, or a padded kernel the
    schedule declines)."""
    conv = blocks[ci]
    epi = list(blocks[ci + 1:])
    out_shape = sch.get(conv).writes[0].source.ty.shape
    width = extent_of(out_shape[3])
    if not epi or width is None or not all(tile_local(sch, b, out_shape) for b in epi):
        return None
    name = sch.get(conv).name_hint
    new = pad_conv_columns(sch.mod["main"], name, padded_columns(width, tiles.owr))
    if new is None:
        return None
    s = new_schedule(tvm.IRModule({"main": new}))
    conv = s.get_sblock(name)
    info = match_conv2d(s, conv)
    if info is None:
        return None
    rb = list(root_blocks(s))
    at = next(i for i, b in enumerate(rb) if s.get(b).same_as(s.get(conv)))
    try:
        # the padded kernel keeps the register block chosen for the row (its other paths, pixel vectors and
        # the flat plane, already declined the row)
        keep = lambda _s, default, _candidates: ConvChoice(tiles, default.row_blocks)  # noqa: E731
        done = schedule_conv2d(s, rb, at, info, target, hv, dataclasses.replace(
            opts, column_pad=False, columns=width, tiles=keep, pixel_vectors=False, flat_plane=False))
    except (ScheduleError, tvm.error.TVMError):
        return None
    if done is None or unwritten_output(done.mod["main"]) is not None:
        return None
    return done


def pixel_vector_plan(opts: ConvOptions, sch, conv, info: ConvBlock, pro, out_dims, hv: HostVector):
    """Whether (and how) this schedule would run the pointwise conv on pixel vectors; for the rules that
    choose between it and their own form of the conv (``_pixel_vector_plan``)."""
    return _pixel_vector_plan(opts, sch, conv, info, pro, out_dims, hv)


def _pixel_vector_plan(opts: ConvOptions, sch, conv, info: ConvBlock, pro, out_dims, hv: HostVector):
    """(output channels, pixel vectors) of the register block when a pointwise conv runs on pixel vectors,
    else None.

    A stride-1 1x1 conv over an NCHW input is a GEMM whose input rows (one channel plane) and output rows
    are contiguous along the pixels: with the pixels on the lanes, each FMA multiplies a vector of pixels of
    one input channel by one broadcast weight, with no input staging (NCHW[vl]c) and no store transpose, and
    the parallel loop runs over blocks of pixels, each doing every output channel block in turn while its
    input pixels stay in L1. Measured on this host against the channel-vector register block (interleaved in
    one process, the other core busy): 2-28% faster on every pointwise conv of a 56x56 or 112x112 plane tried
    (16..256 input channels, 16..256 outputs: MobileNet expansions and projections, ResNet-50 stage 1), most
    on 24-channel outputs (8-lane channel vectors there) and few input channels; with both cores free the
    staged path scaled worse still (MobileNetV2's 144 -> 24 projection 2.7x faster in its model profile).
    The register block: ocr channels x pv vectors, the most accumulators (``hv.accumulators``) with ocr
    dividing OC and pv vectors dividing the plane, at most one load (a pixel vector or a broadcast weight)
    per two FMAs, the more balanced one on a tie, then more channels, and at least PIXEL_TASKS_PER_CORE pixel
    blocks per core. A host whose accumulators no block reaches that ratio with (16 registers: 8
    accumulators, 6 loads per 8 FMAs at best) takes the fewest loads its accumulators allow: 4 channels x 2
    vectors on AVX2. Measured on a 2-core Zen 3 (conv + bias + ReLU, own processes) against the channel
    vectors' 1 x 4 block: 144 -> 24 on 56x56 0.28 -> 0.13-0.15 ms (ORT 0.18), 24 -> 144 0.29 -> 0.13-0.17
    (ORT 0.24), 16 -> 96 on 112x112 0.51 -> 0.28 (ORT 0.43), 256 -> 64 on 56x56 1.31 -> 0.60-0.67 (ORT 0.79).
    Other planes (7x7, 14x14; 28x28 and any other plane under ``PIXEL_MIN_PLANE`` pixels) keep the
    channel-vector path and its channel chunks, which reuse a chunk of weights across the whole plane (28x28
    on pixel vectors measured the same or up to 12% slower on that Zen 3). Applies where the conv reads an
    input of the function itself (a prologue like a BN + ReLU is applied once per element in the staged
    input instead; an SE gate reaches the conv on its weight, ``gated_weight.py``) and no tuner chooses the
    register block."""
    oc, oh, ow = out_dims
    if not opts.pixel_vectors or opts.tiles is not None or None in (oc, oh, ow):
        return None
    lanes = hv.lanes(info.out_dtype)
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    if w_shape[2:] != [1, 1] or d_shape[2:] != [oh, ow] or len(pro) > 1:
        return None
    if pro and not (_is_plain_copy(sch, pro[0]) and _reads_param(sch, pro[0])):
        return None
    hw = oh * ow
    if hw < PIXEL_MIN_PLANE:
        return None
    acc = hv.accumulators
    # loads per FMA of the block: (ocr + pv) / (ocr * pv); the bound is 1/2, or the least any block of the
    # accumulators reaches where that is more
    least = min(Fraction(a + b, a * b) for a in range(1, acc + 1) for b in range(1, acc // a + 1))
    bound = max(Fraction(1, 2), least)
    best = None
    for pv in range(1, acc + 1):
        if hw % (pv * lanes):
            continue
        for ocr in range(1, acc // pv + 1):
            if oc % ocr == 0 and Fraction(ocr + pv, ocr * pv) <= bound:
                key = (ocr * pv, min(ocr, pv), ocr)
                if hw // (pv * lanes) >= PIXEL_TASKS_PER_CORE * max(1, hv.cores) and (
                        best is None or key > best[0]):
                    best = (key, ocr, pv)
    return None if best is None else best[1:]


def _reads_param(sch, block) -> bool:
    params = sch.mod["main"].params
    return all(any(p.same_as(r.source) for p in params) for r in sch.get(block).reads)


def _pixel_vectors(sch, conv, info: ConvBlock, pro, epi, ow: int, plan, lanes: int, opts: ConvOptions) -> bool:
    """Schedule the pointwise conv on pixel vectors (``_pixel_vector_plan``): the conv and its last epilogue
    block iterate the flattened plane (the accumulator is (N, OC, H*W), per register block in registers),
    parallel over the pixel blocks, every output channel block of a pixel block in turn (its input pixels
    stay in L1 for all of them), the epilogue per register block on the same vectors. False when a step
    does not apply (called on a copy first: ``_if_it_applies``)."""
    ocr, pv = plan
    for b in pro:
        if not ok(sch.compute_inline, b):
            return False
    out_shape = sch.get(conv).writes[0].source.ty.shape
    if not epi:
        epi = [sch.cache_write(conv, 0, "global")]
    *inner, last = epi
    for b in inner:
        if not ok(sch.compute_inline, b):
            return False
    if not _writes_like(sch, last, out_shape):
        return False
    packed = False
    if opts.prepack and packable_param(sch, info.weight_buf) is not None:
        mark_prepack(sch, conv, info.weight_read, lambda f, c, r, s: (f // ocr, c, r, s, f % ocr))
        packed = True
    sch.transform_layout(conv, ("write", 0), lambda n, f, y, x: (n, f, y * ow + x))
    sch.transform_block_layout(conv, lambda n, f, y, x, rc, ry, rx: (n, f, y * ow + x, rc, ry, rx))
    sch.transform_block_layout(last, lambda n, f, y, x: (n, f, y * ow + x))
    sch.set_scope(conv, 0, "local")
    n, f, p, rc, ry, rx = sch.get_loops(conv)
    f0, f1 = sch.split(f, [None, ocr])
    p0, p1, p2 = sch.split(p, [None, pv, lanes])
    sch.reorder(n, p0, f0, rc, ry, rx, f1, p1, p2)
    sch.vectorize(p2)
    sch.unroll(p1)
    sch.unroll(f1)
    sch.reverse_compute_at(last, f0)
    _, vi = sch.split(sch.get_loops(last)[-1], [None, lanes])
    sch.vectorize(vi)
    sch.parallel(sch.fuse(n, p0))
    init = sch.decompose_reduction(conv, rc)
    il = sch.get_loops(init)
    sch.vectorize(il[-1])
    sch.unroll(il[-2])
    sch.unroll(il[-3])
    sch.annotate(conv, "ascendfuse.schedule",
                 f"{'packed ' if packed else ''}pixel vectors: {ocr} channels x {pv} x {lanes} pixels")
    return True


def _lane_epilogue_columns(opts: ConvOptions, sch, last, acc, out_shape, per_register_block: bool,
                           t: ConvTiles, ow: int) -> int | None:
    """Output columns per store transpose when the epilogue runs on channel vectors (``_epilogue_on_lanes``),
    else None (the epilogue keeps the NCHW order it has).

    The accumulator tile is NCHW[vl]c; an epilogue run in NCHW order reads it with the columns on the lanes:
    a whole-register-block transpose first where there is one (``transpose_store``: 8 columns x 16 lanes),
    else lane-strided reads and vectors of the largest power of two dividing the columns, which is 1 or 2
    lanes for the 7- and 14-wide planes of MobileNet/EfficientNet (7 columns per register block, or the
    rows of a small plane's channel chunks): there an activation like SiLU (an exp and a divide) ran nearly
    scalar. On channel vectors it runs on full host vectors (the bias is one vector load per channel
    block), and the result reaches NCHW through the output-side register transpose (the largest divisor of
    the register block's or the row's columns up to 8; a prime width of 11 or 13, SqueezeNet's 13x13 planes
    and 55 = 5 x 11, all its columns in two 8-column halves).
    Applies when that transpose exists for the tile, the last epilogue block writes the accumulator's
    element at the same NCHW indices, and the epilogue reads no other tensor along the columns (a residual
    read on channel vectors is a lane-strided gather: those keep the NCHW order) unless the NCHW order would
    run on single columns (an odd width: ``_scalar_columns``). A register block that
    ``transpose_store`` covers (its columns contiguous, in vectors of owr < vl lanes) keeps it unless the
    epilogue's arithmetic is heavy: on channel vectors each op runs vl / owr times fewer vector
    instructions, against a pass of its own through the UB tile (``LANE_PASS_OPS``): measured faster for
    SiLU (a fast-math exp and a divide), slower for a bias + ReLU6 (one core, interleaved).
    ``opts.lane_epilogue`` "always" drops these exceptions (tuning and measurements)."""
    if not (opts.lane_epilogue and opts.transpose):
        return None
    width = t.owr if per_register_block else ow
    if per_register_block and opts.lane_epilogue != "always" and transpose_intrin(str(acc.ty.dtype), width, t.vl) \
            and _arith_ops(sch, last) * (t.vl // width - 1) <= LANE_PASS_OPS:
        return None
    cols = next((d for d in range(min(width, 8), 1, -1) if width % d == 0), None)
    if cols is None and 8 < width <= 16:
        cols = width        # a prime width (11, 13): one transpose of two 8-column halves
    if cols is None or out_transpose_intrin(str(acc.ty.dtype), cols, t.vl) is None:
        return None
    if not _writes_like(sch, last, out_shape) or (opts.lane_epilogue != "always"
                                                  and _reads_along_columns(sch, last, acc)
                                                  and not _scalar_columns(width, t.vl)):
        return None
    return cols


def _scalar_columns(width: int, vl: int) -> bool:
    """Would the NCHW-order epilogue over ``width`` columns run on single-column vectors (no power of two
    above 1 divides an odd width, ``vector_width_for``)? Then it reads every accumulator element lane-strided
    and stores it alone (LLVM: a gather and a scatter per vector of channels), which costs more than the
    residual's lane-strided gather on channel vectors plus the output transpose: measured faster for a 1x1
    conv + residual on a 7x7 plane (one 7-column register block a row), warm and after a cache flush; the
    two-column vectors of a 14-wide plane measured slower on channel vectors, so even widths keep the
    NCHW order."""
    return vector_width_for(width, vl) == 1


def _arith_ops(sch, block) -> int:
    """Arithmetic operations the block computes per element (its stored value's nodes; a let-bound value once)."""
    count = [0]
    kinds = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Min, tirx.Max, tirx.Select, tirx.FloorDiv,
             tirx.FloorMod, tirx.Cast)
    store = sch.get(block).body
    if isinstance(store, tirx.BufferStore):
        tvm_ffi.structural_walk(store.value, [(k, lambda _: count.__setitem__(0, count[0] + 1)) for k in kinds])
    return count[0]


def _writes_like(sch, block, out_shape) -> bool:
    """Does ``block`` store one 4-d element per iteration at its own four iterators (n, c, y, x), into a
    buffer of the conv output's shape (the batch may differ in name)?"""
    stmt = sch.get(block)
    store = stmt.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) != 4 or len(stmt.iter_vars) != 4:
        return False
    shape = [extent_of(d) for d in store.buffer.ty.shape]
    want = [extent_of(d) for d in out_shape]
    if None in shape[1:] or shape[1:] != want[1:]:
        return False
    return all(isinstance(i, tirx.Var) and i.same_as(iv.var) for i, iv in zip(store.indices, stmt.iter_vars))


def _reads_along_columns(sch, block, acc) -> bool:
    """Does ``block`` read a tensor other than the accumulator whose elements change along the columns (a
    residual input), rather than per channel (a bias)?"""
    for region in sch.get(block).reads:
        buf = region.source
        if buf.same_as(acc):
            continue
        dims = [extent_of(d) for d in buf.ty.shape]
        if dims and (dims[-1] is None or dims[-1] > 1):
            return True
    return False


def _epilogue_on_lanes(sch, last, at, vl: int, cols: int, copy: bool) -> bool:
    """Compute the epilogue ``last`` under loop ``at`` on channel vectors: it writes an NCHW[vl]c tile in UB
    (vl channels innermost, vectorised) that a register transpose stores to NCHW ``cols`` columns at a time
    (``transpose.transpose_to_nchw``). ``copy``: ``last`` only copies the accumulator out (no epilogue),
    then it is the transposed store itself. False when a step does not apply (the schedule is then
    partly changed: call it on a copy first, ``_if_it_applies``)."""
    store = last if copy else sch.cache_write(last, 0, UB_SCOPE)
    if not copy:
        sch.transform_layout(last, ("write", 0), lambda a, c, h, w: (a, c // vl, h, w, c % vl))
    sch.reverse_compute_at(last, at, preserve_unit_loops=True)
    n, c, y, x = sch.get_loops(last)[-4:]
    co, ci = sch.split(c, [None, vl])
    xo, xi = sch.split(x, [None, cols])
    if copy:
        sch.reorder(n, co, y, xo, ci, xi)
        return transpose_to_nchw(sch, last, vl)
    sch.reorder(n, co, y, xo, xi, ci)
    sch.vectorize(ci)
    sch.reverse_compute_at(store, xo)
    return transpose_to_nchw(sch, store, vl)


def _if_it_applies(sch, apply) -> bool:
    """``apply(sch)`` when it succeeds on a copy of ``sch`` (returns True, raises no ScheduleError); else
    False with ``sch`` untouched."""
    try:
        if not apply(sch.copy()):
            return False
    except ScheduleError:
        return False
    return apply(sch)


def _subsample_strided_pointwise(sch, conv, info: ConvBlock, pro, out_hw):
    """A strided 1x1 conv reads every s-th pixel of its input: gather those pixels once into an NCHW buffer
    of the output's size (``reindex`` of the data read, the zero-width pad inlined into it), so the conv
    becomes a stride-1 pointwise conv on a plane s*s times smaller instead of re-laying out (or striding
    through) the whole input. Returns (prologue blocks, re-matched conv) or None when not applicable."""
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    pads = [b for b in pro if still_exists(sch, b)]
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    if w_shape[2:] != [1, 1] or len(pads) != 1 or None in d_shape or d_shape[2:] == list(out_hw):
        return None
    # the gathered buffer is laid out (n, y, x, c) below: reindex folds the unit kernel-window iterators into
    # y and x only when those are not unit too (a one-pixel output row or column keeps them as axes of their
    # own), so such an output is left strided (it is a few pixels)
    if min(out_hw) < 2:
        return None
    rb = sch.reindex(conv, ("read", info.data_read))
    sch.transform_layout(rb, ("write", 0), lambda n, y, x, c: (n, c, y, x))
    ok(sch.compute_inline, pads[0])
    rn, ry, rx, rc = sch.get_loops(rb)
    sch.reorder(rn, rc, ry, rx)          # parallelised over (n, c) with the other prologue blocks
    sch.annotate(rb, _SUBSAMPLE, 1)
    info = match_conv2d(sch, conv)
    return ([rb], info) if info is not None else None


def _row_splits(oh: int, cores: int) -> list[int]:
    """Block counts of output rows for the parallel loop when each task pads its own input rows: multiples
    of the core count (equal static shares: TVM splits a parallel loop into one contiguous range per thread),
    dividing OH, each block at least 4 rows (the KH-1 halo rows padded twice stay a small fraction)."""
    cores = max(1, cores)
    return [nb for nb in range(cores, oh // 4 + 1, cores) if oh % nb == 0]


def _row_blocks(oh: int, cores: int, fits=None) -> int | None:
    """The fewest ``_row_splits`` whose padded input rows fit (``fits(rows)``, default at most 16 rows), so
    they stay cache resident, else the most. None when OH has no such split (odd or short): the pad runs at
    the root."""
    splits = _row_splits(oh, cores)
    return next(iter(_row_block_choices(oh, cores, fits)), splits[-1] if splits else None)


def _row_block_choices(oh: int, cores: int, fits=None) -> list[int]:
    """Every ``_row_splits`` count whose padded input rows fit (``fits``): the tuner's choices."""
    fits = fits or (lambda rows: rows <= 16)
    return [nb for nb in _row_splits(oh, cores) if fits(oh // nb)]


def _padded_rows_fit(sch, pad, oh: int, info: ConvBlock, target: AscendTarget):
    """``fits(rows)`` for _row_blocks: the padded input rows a block of ``rows`` output rows reads (all
    channels) within the target's L1, the buffer that stages a feature-map block for the cube unit (on
    this host: the core's L2). A 64-channel 56x56 conv then takes 2 blocks of 28 rows (445 KiB) instead of
    4 of 14, one per core: measured slightly faster with two threads (interleaved runs), within noise on
    other shapes, the same with one thread."""
    shape = [extent_of(d) for d in sch.get(pad).writes[0].source.ty.shape]
    kh = extent_of(info.weight_buf.ty.shape[2])
    if len(shape) != 4 or None in shape or kh is None:
        return None
    _, c, ph, pw = shape
    nbytes = target.element_bytes(sch.get(pad).writes[0].source.ty.dtype, "l1")
    return lambda rows: min(ph, -(-rows * ph // oh) + kh - 1) * c * pw * nbytes <= target.l1_bytes


def _stage_parts_by_rows(sch, block, lanes: int, cores: int) -> bool:
    """Stage a concat's (padded) input at the root one loop per part (``concat_staging.py``): parallel over
    one block of rows per core (one fork/join for all parts; a task's rows are contiguous in every channel
    plane, so the cores share cache lines only at the block edges), in each block every part's channels in a
    loop of their own. False (schedule untouched) when ``block`` is not an NCHW concat staging, or its
    plane has fewer than ``STAGE_MIN_ROWS_PER_CORE`` rows per core: there the select chain, parallel over
    the channels, stays faster.

    Measured on a 2-core Zen 5 (kernels of one model interleaved, other processes running): DenseNet's
    dense layers 0.28-0.72x the time with 14x14 planes and 9-25 parts, 0.73-0.84x on 28x28; SqueezeNet's
    13x13 squeeze convs over two parts 0.92x; 7x7 planes 1.25-1.4x slower (4 rows a task), one row a task
    on 13x13 1.4-1.8x slower (both cores writing the same lines)."""
    parts = channel_parts(sch, block)
    loops = sch.get_loops(block)
    if parts is None or len(loops) != 4:
        return False
    pn, pc, ph, pw = loops
    rows = extent(sch, ph)
    if rows is None or rows < STAGE_MIN_ROWS_PER_CORE * cores:
        return False
    yb, yi = sch.split(ph, [cores, None])
    sch.reorder(pn, yb, pc, yi, pw)
    staged = partition_channels(sch, pc, parts)
    if staged is None:
        return False
    try_(sch.parallel, sch.fuse(pn, yb))
    for part in staged:
        vectorize_inner(sch, part, lanes)
    return True


def extent_of(dim) -> int | None:
    return int(dim) if isinstance(dim, tirx.IntImm) else None


def _is_plain_copy(sch, block) -> bool:
    """A block that stores one load of another buffer unchanged (no padding select)."""
    body = sch.get(block).body
    return isinstance(body, tirx.BufferStore) and isinstance(strip_cast(body.value), LOAD)


# loads per FMA a flat-plane register block takes at most where the registers allow it (_flat_plane_plan)
FLAT_LOADS_PER_FMA = 0.6
# input channels per chunk of a flat plane's reduction (_flat_plane_plan): below the minimum, reloading the
# accumulators once a chunk costs more than the chunk's cache reuse gains
FLAT_CHUNK_MIN, FLAT_CHUNK_MAX = 64, 128


def _flat_plane_plan(opts: ConvOptions, sch, conv, info: ConvBlock, pro, out_dims, ic, hv: HostVector,
                     target) -> tuple[int, int, bool, int | None] | None:
    """(ocr vectors of output channels, pv pixels, column-major, input channels per reduction chunk or None)
    of a register block over the flattened output plane, else None.

    A stride-1 conv whose kernel has one column (1x1, 7x1, 3x1) and whose input is not padded along W reads,
    for output pixel p = y * OW + x, input pixel p + ry * OW of each channel plane: the plane is one axis
    and the register block need not fit the row. A kernel with one row (1x7, 1x3) over an input padded
    along W only does the same column-major (p = x * OH + y, the padded input staged so, read at
    p + rx * OH). Inception's 17-wide rows get a row block of one vector x 17 columns
    (``choose_conv_tiles``: nothing else divides 17), one broadcast load per FMA; over the flattened plane
    a block of ``ocr`` >= 2 vectors x ``pv`` pixels takes about 0.6 loads per FMA, and the P % pv leftover
    pixels run as a loop of their own (``_flat_plane``). Measured on a 2-core Zen 5 (conv + bias + ReLU,
    one thread, own processes): 768->192 1x1 on 17x17 0.40 -> 0.33 ms, 192->192 7x1 0.61 -> 0.56, 1x7
    0.66 -> 0.60 (loaded machine); 2x12, 3x8, 4x6, 6x4 and 2x9 within 4% of each other (near the FMA
    peak). So the block is the fewest vectors with at most 0.6 loads per FMA in three quarters of the
    vector registers, no more vectors than pixels, whose channel blocks split evenly over the cores (or
    give each at least four). 160 channels (10 vectors) have none: 2 x 12 leaves 5 channel blocks for 2
    cores, and 5 x 4 measured 1.09x the row block's time for a 160->160 7x1 conv (two threads,
    interleaved in one process), so they keep the row.

    Applies where the row's own block takes a load or more per FMA (1 x 17 on AVX-512, 4 x 1 on AVX2) or
    leaves a column tail. Rows a block fits keep it (2 x 8 on 8 wide, 2 x 7 on 35 or 7 wide, 2 x 6 on 12
    wide: a 64->64 1x1 conv on 12x12 took 0.0069 ms with its plane chunks, 0.0081 on the flat plane), and
    so does a pointwise conv that takes ``choose_conv_tiles(pointwise=True)``'s one vector x half the
    accumulators (large planes, 56 or 58 wide: a measured recipe, not compared with this one).
    SqueezeNet's 13-wide 1x1 convs (1 x 13) gain: 256->64 0.031 -> 0.025 ms, 512->128 0.108 -> 0.092
    (one thread).

    With 16 registers (AVX2: 12 accumulators) no block reaches 0.6 unless 3 divides the channel vectors, so
    the bound is the least loads per FMA the admissible blocks reach where that is more: 2 x 6 (0.67)
    rather than the row's 1 x 7 on 14- and 7-wide rows, or 2 x 4 padded from 17 to 20 columns (Inception).
    Measured on a 2-core Zen 3 (conv + bias + ReLU, own processes, min of 3-4 alternating rounds):
    1024->256 on 14x14 0.87-1.0 -> 0.58-0.62 ms (ORT 0.61-0.70), 320->320 on 14x14 0.35 -> 0.26 (ORT 0.26),
    784->784 on 7x7 0.43-0.54 -> 0.39-0.43 (ORT 0.36), 160->160 1x7 on 17x17 0.72 -> 0.58 (ORT 0.63).

    On a 7x7 plane every pixel block streams the whole reduction's weights (IC x ocb) and input lines from
    L2. The chunk (``_reduction_chunk``: 64..128 channels whose weights and input planes fit a quarter of
    usable UB) keeps them in L1 across the plane's pixel blocks, the accumulators reloaded once a chunk:
    2048->512 0.75 -> 0.65 ms (ORT 0.65), 512->2048 0.78 -> 0.64 (ORT 0.65), where unchunked 2 x 6 took
    0.89 and 0.80. 14x14 planes take no chunk: 32 channels (what fits) measured 8-15% slower than none."""
    oc, oh, ow = out_dims
    if not opts.flat_plane or opts.tiles is not None or None in (oc, oh, ow, ic) or len(pro) > 1:
        return None
    lanes = hv.lanes(info.out_dtype)
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    if None in w_shape or None in d_shape or oc % lanes:
        return None
    if w_shape[3] == 1 and d_shape[3] == ow and d_shape[2] == oh + w_shape[2] - 1:
        columns = False
    elif w_shape[2] == 1 and d_shape[2] == oh and d_shape[3] == ow + w_shape[3] - 1 and len(pro) == 1:
        columns = True       # a kernel along W over an input padded along W only: the plane column-major
    else:
        return None
    stmt = sch.get(conv)
    region = stmt.reads[info.data_read].region
    iv = [v.var for v in stmt.iter_vars]
    ana = tvm.sym.Analyzer()
    if not (ana.can_prove_equal(region[2].min, iv[2] + iv[5]) and ana.can_prove_equal(region[3].min, iv[3] + iv[6])):
        return None          # strided or dilated: the pixels a block reads are not one run
    row = choose_conv_tiles(oc, ow, info.out_dtype, hv, as_target(target), columns_first=columns)
    if not (ow % row.owr or row.ocr + row.owr >= row.ocr * row.owr):
        return None
    if w_shape[2] == w_shape[3] == 1:
        pw = choose_conv_tiles(oc, ow, info.out_dtype, hv, as_target(target), pointwise=True, ic=ic)
        if pw.ocr == 1 and pw.owr == hv.accumulators // 2:
            return None      # a large plane's measured pointwise block (store-transpose tiles), tail or not
    budget = 3 * hv.registers // 4
    vectors, cores = oc // lanes, max(1, hv.cores)
    fit = []                 # (ocr, pv) blocks that fit the registers and split over the cores
    for ocr in range(2, vectors + 1):
        pv = min(oh * ow, budget // ocr)
        blocks = vectors // ocr
        if vectors % ocr == 0 and pv >= ocr and (blocks % cores == 0 or blocks >= 4 * cores):
            fit.append((ocr, pv))
    # loads per FMA: at most FLAT_LOADS_PER_FMA, or the least these blocks reach where that is more (12 of 16
    # registers: 2 x 6 where 3 x 4 does not divide the channels)
    if not fit:
        return None
    bound = max(FLAT_LOADS_PER_FMA, min((a + b) / (a * b) for a, b in fit))
    ocr, pv = next((a, b) for a, b in fit if (a + b) / (a * b) <= bound + 1e-9)
    per_channel = (w_shape[2] * w_shape[3] * ocr * lanes + d_shape[2] * d_shape[3]) * target.element_bytes(
        info.out_dtype)
    chunk = _reduction_chunk(ic, per_channel, target.ub_usable // 4, FLAT_CHUNK_MIN, FLAT_CHUNK_MAX)
    return ocr, pv, columns, chunk


def _flat_plane(sch, conv, info: ConvBlock, pro, epi, out_dims, plan, hv: HostVector, opts: ConvOptions) -> bool:
    """Schedule the conv over one pixel axis p = y * OW + x (``_flat_plane_plan``): the padded input (padded
    along H only, or a concat's staging) is laid out flat, the accumulator (N, OC/vl, H*W, vl); parallel over
    blocks of ocr * vl output channels, each computing its whole plane in register blocks of pv pixels and
    the P % pv leftover pixels in a loop of their own (``loop_partition``: no condition on any FMA), then the
    epilogue on channel vectors (measured 0-2% faster there than in a parallel loop of its own after the
    conv). False when a step does not apply (called on a copy first)."""
    oc, oh, ow = out_dims
    ocr, pv, columns, chunk = plan
    vl = hv.lanes(info.out_dtype)
    hw = oh * ow
    pads = [b for b in pro if still_exists(sch, b)]
    for b in pads:
        if _is_plain_copy(sch, b):
            ok(sch.compute_inline, b)      # a pad of zero width (1x1 convs): read the input in place
    pads = [b for b in pads if still_exists(sch, b)]
    if any(is_output_block(sch, b) for b in pads):
        return False
    packed = False
    if opts.prepack and packable_param(sch, info.weight_buf) is not None:
        ocb = ocr * vl
        mark_prepack(sch, conv, info.weight_read, lambda f, c, r, s: (f // ocb, c, r, s, f % ocb))
        packed = True
    out_shape = sch.get(conv).writes[0].source.ty.shape
    epi = list(epi)
    if epi and all(tile_local(sch, b, out_shape) for b in epi):
        rest = []
    else:
        # no epilogue, or one that changes the shape (a concat, slices): a copy to NCHW first, it after
        rest, epi = epi, [sch.cache_write(conv, 0, "global")]
    *inner, last = epi
    for b in inner:
        if not ok(sch.compute_inline, b):
            return False
    if not _writes_like(sch, last, out_shape):
        return False
    if columns and len(pads) != 1:
        return False
    # pixel p = y * OW + x, or x * OH + y (``columns``: the kernel runs along W, the input is staged
    # column-major, so output pixel p reads staged pixel p + rx * OH as a kernel along H reads p + ry * OW)
    flat = (lambda y, x: x * oh + y) if columns else (lambda y, x: y * ow + x)
    if pads:
        sch.transform_layout(pads[0], ("write", 0), lambda n, c, h, w: (n, c, flat(h, w)))
    sch.transform_layout(conv, ("write", 0), lambda n, f, y, x: (n, f // vl, flat(y, x), f % vl))
    sch.transform_block_layout(conv, lambda n, f, y, x, rc, ry, rx: (n, f, flat(y, x), rc, ry, rx))
    sch.transform_block_layout(last, lambda n, f, y, x: (n, f, flat(y, x)))
    n, f, p, rc, ry, rx = sch.get_loops(conv)
    f0, f1, f2 = sch.split(f, [None, ocr, vl])
    sch.reorder(n, f0, p, rc, ry, rx, f1, f2)
    task = sch.fuse(n, f0)
    sch.parallel(task)
    # the epilogue inside each task on its channel block's plane (in UB, still in the core's cache), placed
    # before the partition: its wrapper blocks declare no regions, so afterwards the epilogue would be given
    # every channel
    sch.set_scope(conv, 0, UB_SCOPE)
    sch.reverse_compute_at(last, task)
    ef, ep = sch.get_loops(last)[-2:]
    sch.reorder(ep, ef)
    sch.vectorize(sch.split(ef, [None, vl])[1])
    name, var = sch.get(conv).name_hint, sch.get(p).loop_var.name
    parts = [conv]
    if hw % pv:
        sch.loop_partition(p, [hw - hw % pv, None])
        parts = [sch.get_sblock(f"{name}_{var}0"), sch.get_sblock(f"{name}_{var}1")]
    for k, part in enumerate(parts):
        pp, rc, ry, rx, f1, f2 = sch.get_loops(part)[-6:]
        red = rc
        if k == 0:
            p0, p1 = sch.split(pp, [None, pv])
            if chunk is not None:
                red, rci = sch.split(rc, [None, chunk])
                sch.reorder(red, p0, rci, ry, rx, p1, f1, f2)
            else:
                sch.reorder(p0, rc, ry, rx, p1, f1, f2)
            sch.unroll(p1)
        else:
            sch.reorder(rc, ry, rx, pp, f1, f2)
        sch.vectorize(f2)
        sch.unroll(f1)
        init = sch.decompose_reduction(part, red)
        il = sch.get_loops(init)
        sch.vectorize(il[-1])
        sch.unroll(il[-2])
        if k == 0:
            sch.unroll(il[-3])
    for b in pads:
        if not (opts.concat_parts and _stage_parts_by_rows(sch, b, vl, hv.cores)):
            pl = sch.get_loops(b)
            try_(sch.parallel, sch.fuse(*pl[:2]))
    if rest:
        *before, after = rest
        for b in before:
            ok(sch.compute_inline, b)
        parallel_vector(sch, after, vl)
    sch.annotate(parts[0], "ascendfuse.schedule",
                 f"{'packed ' if packed else ''}flat plane{' (column-major)' if columns else ''}: "
                 f"{ocr} x {vl} channels x {pv} pixels"
                 f"{f' + {hw % pv}' if hw % pv else ''}{f', {chunk}-channel chunks' if chunk else ''}")
    return True
