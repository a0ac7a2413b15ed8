"""PoolRule: a window reduction over the H, W planes of an NCHW tensor (max/min/avg pooling, global mean),
alone or as the tail of a conv2d kernel (ResNet's stem conv + max-pool, last conv + global average pool).

Recognised from the blocks: the last reduction block is ``P[n, c, y, x] = max|min|+(P[..], X[n, c, h, w])``
reading one buffer whose first two indices are the pool's own N, C iterators and whose H and W indices each
use one of its two reduction iterators (a window or a whole plane; ``analysis.match_pool``); only injective
blocks follow it. Before it there may be one conv2d (``analysis.match_conv2d``) with its injective epilogue
and the pool's own padding/prologue.

Why a rule: the grouping fuses a pool into the conv that feeds it (it saves the conv output's round trip),
but no single-reduction rule takes the kernel, and the generic fallback ran ResNet's stem kernel at
1.6 GFLOP/s (64% of the model). Here the conv part gets the conv2d schedule
(``conv_schedule.schedule_conv2d``, its output kept in a kernel-local buffer; output channels no full vector
divides padded to one, as the conv2d-padded rule does: ``channel_pad.py``), and the pool runs tile by
tile: a tile is ``cb`` channels x ``rb`` output rows; the input window rows it needs (with the padding) are
staged in ``local.UB``, its outputs are produced in ``local.UB`` and written back with the epilogue (divide,
reshape). Tiles are sized from the target's usable UB (double-buffered) and spread over the host cores;
staging and write-back are vectorised, the window is reduced innermost per output. Tunable: the tile is a
sampled decision over the tiles within the same UB budget (``pool_tile_candidates``). Output rows shorter
than a host vector are pooled with a channel vector innermost instead (``lane_pool.py``), and so is a pool
behind a conv, which then reads the conv part's result in the accumulator's channel-vector layout
(``PoolRule._schedule_blocked``). A pool over whole planes behind a conv (a network's head: conv + bias +
activation + global mean) is summed in the conv's own tasks from its accumulator tile instead, the conv's
result never stored (``PoolRule._schedule_conv_plane_pool``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from ..target import AscendTarget
from .analysis import PoolBlock, has_reduce, match_conv2d, match_pool
from .base import UB_SCOPE, ScheduleRule
from .channel_pad import WEIGHT_PAD_BLOCK, pack_padded_weight, pad_conv_output_channels, padding_pays
from .common import (new_schedule,
    on_copy_first,
    as_target,
    blocks_under,
    get_realize,
    is_output_block,
    still_exists,
    unwritten_output,
    buffer_bytes,
    on_chip_bytes,
    extent,
    num_cores,
    ok,
    parallel_vector,
    root_blocks,
    tile_local,
    try_,
    vector_lanes,
    vectorize_inner,
)
from .column_pad import pad_conv_columns, padded_columns
from .conv_schedule import DEFAULT_OPTIONS, ConvOptions, choose_conv_tiles, extent_of, schedule_conv2d
from .hostvec import host_vector
from .lane_pool import channel_lanes, schedule_lane_pool
from .row_blocks import loop_tiles
from .plane_pool import schedule_plane_pool

# Columns of a conv epilogue on channel vectors unrolled (a register block's or a short row's).
MAX_UNROLLED_COLUMNS = 16
# Enough tiles that every core gets several (a tile's rows differ in cost at the padded border).
TILES_PER_CORE = 4


def choose_pool_tile(channels: int, out_rows: int, out_cols: int, info: PoolBlock, nbytes: int,
                     target: AscendTarget, cores: int, step: int = 1) -> tuple[int, int]:
    """(channels, output rows) per tile: the staged input rows + the output tile, double-buffered and 32 B
    aligned, fit usable UB; then the tile shrinks (channels first) until every core gets several tiles.
    The channel count is a multiple of ``step`` (which divides ``channels``): whole channel vectors."""
    budget = _pool_budget(target)
    tile_bytes = lambda cb, rb: pool_tile_bytes(cb, rb, out_rows, out_cols, info, nbytes, target)  # noqa: E731
    divisors = lambda n, s=1: [d for d in range(n, 0, -1) if n % d == 0 and d % s == 0]   # noqa: E731
    rb = next((d for d in divisors(out_rows) if tile_bytes(step, d) <= budget), 1)
    cb = next((d for d in divisors(channels, step) if tile_bytes(d, rb) <= budget), step)
    want = cores * TILES_PER_CORE
    while cb > step and (channels // cb) * (out_rows // rb) < want:
        cb = next(d for d in divisors(channels, step) if d < cb)
    while rb > 1 and (channels // cb) * (out_rows // rb) < want:
        rb = next(d for d in divisors(out_rows) if d < rb)
    return cb, rb


def _pool_budget(target: AscendTarget) -> int:
    return target.ub_usable // (2 if target.double_buffer else 1)


def pool_tile_bytes(cb: int, rb: int, out_rows: int, out_cols: int, info: PoolBlock, nbytes: int,
                    target: AscendTarget) -> int:
    """UB bytes of one pool tile (one copy): its staged input window rows and its output tile, 32 B aligned."""
    in_rows = min(info.rows_in, math.ceil(info.rows_in * rb / max(out_rows, 1)) + info.kernel_rows)
    return target.align_up(cb * in_rows * info.cols_in * nbytes) + target.align_up(cb * rb * out_cols * nbytes)


MAX_POOL_CANDIDATES = 8


def pool_tile_candidates(default: tuple[int, int], channels: int, out_rows: int, out_cols: int, info: PoolBlock,
                         nbytes: int, target: AscendTarget, cores: int) -> list[tuple[int, int]]:
    """(channels, output rows) per tile a tuner may try: the default first, then tiles of power-of-two channel
    counts and any row count (each dividing its axis) that fit the rule's UB budget and give every core a tile,
    the ones nearest the default in size first (at most MAX_POOL_CANDIDATES)."""
    budget = _pool_budget(target)
    cbs = [d for d in range(1, channels + 1) if channels % d == 0 and d & (d - 1) == 0]
    rbs = [d for d in range(1, out_rows + 1) if out_rows % d == 0]
    size = lambda t: abs(math.log2(t[0] * t[1]) - math.log2(default[0] * default[1]))  # noqa: E731
    others = sorted(((cb, rb) for cb in cbs for rb in rbs if (cb, rb) != default
                     and (channels // cb) * (out_rows // rb) >= cores
                     and pool_tile_bytes(cb, rb, out_rows, out_cols, info, nbytes, target) <= budget),
                    key=lambda t: (size(t), t))
    return [default, *others[:MAX_POOL_CANDIDATES - 1]]


def _conv_before_pool(func):
    """(schedule, root blocks, index of the conv, its ConvBlock) of a kernel that is a conv2d and a pool (with
    injective blocks around them), else None: what the rule's rewrites of the conv start from."""
    sch = new_schedule(tvm.IRModule({"main": func}))
    blocks = list(root_blocks(sch))
    reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
    if len(reductions) != 2 or match_pool(sch, blocks[reductions[1]]) is None:
        return None
    info = match_conv2d(sch, blocks[reductions[0]])
    return None if info is None else (sch, blocks, reductions[0], info)


class PoolRule(ScheduleRule):
    """Pooling over NCHW planes, alone or after a conv2d in the same kernel (see module docstring)."""

    name = "pool"
    tunable = True      # channels x output rows per tile: ``tiles`` chooser (base.ScheduleRule)

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        found = _conv_before_pool(func)
        padded = None if found is None else \
            self._with_padded_conv(func, found, target, host) or self._with_padded_columns(func, found, target, host)
        if padded is not None:
            return padded
        return self.schedule(new_schedule(tvm.IRModule({"main": func})), target, host)

    def _with_padded_conv(self, func, found, target, host) -> s_tir.Schedule | None:
        """The kernel with its conv's output channels padded to the host's full vector (``channel_pad.py``)
        where that takes fewer vector FMAs (SqueezeNet's classifier: 1000 channels in 125 vectors of 8 lanes
        on AVX-512, 63 of 16 padded), else None. The padded lanes are computed on zero weights; the epilogue
        and the pool read only the first OC channels of the accumulator. ``found``: ``_conv_before_pool``."""
        sch, blocks, ci, info = found
        padded_oc = padding_pays(sch, blocks[ci], info, blocks[:ci], host_vector(host), as_target(target))
        if padded_oc is None:
            return None
        name = sch.get(blocks[ci]).name_hint
        padded = pad_conv_output_channels(func, name, info.weight_buf, padded_oc)
        if padded is None:
            return None
        sch = new_schedule(tvm.IRModule({"main": padded}))
        blocks = [b for b in root_blocks(sch) if sch.get(b).name_hint != WEIGHT_PAD_BLOCK]
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        pool = match_pool(sch, blocks[reductions[1]]) if len(reductions) == 2 else None
        sch.annotate(sch.get_sblock(name), "ascendfuse.channel_pad",
                     f"{info.out_dtype} channels padded for {host_vector(host).bits}-bit vectors")
        chosen = []

        def keep(_sch, default, _candidates):
            chosen.append(default)         # the register block the padded weight is packed by
            return default

        if pool is None or self._schedule(sch, blocks, reductions, pool, target, host,
                                          ConvOptions(tiles=keep)) is None or not chosen:
            return None
        pack_padded_weight(sch, padded, info.weight_buf, chosen[0].tiles.ocb)
        return sch

    def _with_padded_columns(self, func, found, target, host) -> s_tir.Schedule | None:
        """The kernel with its conv's rows padded to whole register blocks (``column_pad.py``) where the conv
        schedule's block for a kernel wider than one column would leave a tail or be one column wide
        (Inception-v3's 80->192 3x3 conv on 73x73 + max-pool: 71 columns, 4 vectors x 1 column on AVX2), else
        None. The padded columns are computed and never read: the epilogue and the pool read the row's own."""
        sch, blocks, ci, info = found
        if extent_of(info.weight_buf.ty.shape[3]) in (None, 1):
            return None
        loops = sch.get_loops(blocks[ci])
        oc, ow = extent(sch, loops[1]), extent(sch, loops[3])
        if oc is None or ow is None:
            return None
        t = choose_conv_tiles(oc, ow, info.out_dtype, host_vector(host), as_target(target), columns_first=True,
                              pad_columns=True)
        padded = padded_columns(ow, t.owr)
        new = None if padded is None else pad_conv_columns(func, sch.get(blocks[ci]).name_hint, padded)
        if new is None:
            return None
        sch = new_schedule(tvm.IRModule({"main": new}))
        blocks = list(root_blocks(sch))
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        pool = match_pool(sch, blocks[reductions[1]]) if len(reductions) == 2 else None
        if pool is None:
            return None
        sch.annotate(blocks[reductions[0]], "ascendfuse.column_pad", f"{ow} columns padded to {padded}")
        try:
            return self._schedule(sch, blocks, reductions, pool, target, host, ConvOptions(columns=ow))
        except (s_tir.ScheduleError, tvm.error.TVMError):
            return None

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> s_tir.Schedule | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        blocks = list(root_blocks(sch))
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        if not reductions or len(reductions) > 2:
            return None
        pi = reductions[-1]
        pool = match_pool(sch, blocks[pi])
        if pool is None:
            return None
        if len(reductions) == 2 and match_conv2d(sch, blocks[reductions[0]]) is None:
            return None
        return self._schedule(sch, blocks, reductions, pool, target, host)

    def _schedule(self, sch, blocks, reductions, pool: PoolBlock, target, host, conv_opts=DEFAULT_OPTIONS):
        pi = reductions[-1]
        start = 0
        if len(reductions) == 2:
            if self._schedule_conv_plane_pool(sch, blocks, reductions, pool, target, host, conv_opts):
                return sch
            if self._schedule_blocked(sch, blocks, reductions, pool, target, host, conv_opts):
                return sch
            start = self._schedule_conv_part(sch, blocks, reductions, target, host, conv_opts)
            if start is None:
                return None
        prologue = [b for b in blocks[start:pi]]
        epilogue = list(blocks[pi + 1:])
        if any(has_reduce(sch, b) for b in prologue + epilogue):
            return None
        if start == 0 and self._schedule_global(sch, prologue, pool, epilogue, host):
            return sch
        return sch if self._schedule_pool(sch, prologue, pool, epilogue, target, host) else None

    @staticmethod
    def _schedule_conv_part(sch, blocks, reductions, target, host, conv_opts) -> int | None:
        """Schedule the conv and its elementwise epilogue (the conv rule's schedule, its result in a kernel
        buffer); the index of the first block after them, or None when the conv schedule declines."""
        ci, pi = reductions
        out_shape = sch.get(blocks[ci]).writes[0].source.ty.shape
        if conv_opts.columns is not None:    # a padded row (column_pad.py): the epilogue covers the row's own
            out_shape = [*out_shape[:3], tirx.IntImm(str(out_shape[3].ty.dtype), conv_opts.columns)]
        end = ci + 1
        while end < pi and tile_local(sch, blocks[end], out_shape):
            end += 1
        if schedule_conv2d(sch, blocks[:end], ci, match_conv2d(sch, blocks[ci]), target, host_vector(host),
                           conv_opts) is None:
            return None
        return end

    def _schedule_conv_plane_pool(self, sch, blocks, reductions, pool: PoolBlock, target, host,
                                  conv_opts) -> bool:
        """A pool over whole planes (a global mean) behind a conv whose epilogue reads nothing along the plane
        (bias, activation): the epilogue inlined into the pool, which runs in the conv's own parallel task on
        the channel vectors of its accumulator tile, summing each activated pixel of the tile into one
        vector of channel sums; no plane of the conv's result is stored. Needs the conv schedule's task to
        cover whole planes (a small plane's channel chunks: ``conv_schedule._plane_chunk``). False, with
        ``sch`` unchanged, when the kernel does not have that form (everything is tried on a copy first).

        Why: the conv part's result went through a transposing copy to NCHW and the epilogue through another
        (and, with channels padded to full vectors, the blocked hand-off of ``_schedule_blocked`` does not
        apply): SqueezeNet's classifier (conv 512->1000 + ReLU + global mean on 13x13) and MobileNetV2's head
        shape (conv 320->1280 + ReLU + global mean on 7x7) measured 4-6% faster without them."""
        ci, pi = reductions
        conv_block = blocks[ci]
        dims = [extent(sch, lp) for lp in sch.get_loops(pool.block)]
        out = [extent_of(d) for d in sch.get(conv_block).writes[0].source.ty.shape]
        if len(dims) != 6 or dims[2:4] != [1, 1] or len(out) != 4 or dims[4:] != out[2:] \
                or dims[4:] != [pool.rows_in, pool.cols_in]:
            return False
        between, epilogue = list(blocks[ci + 1:pi]), list(blocks[pi + 1:])
        own = {sch.get(b).writes[0].source for b in between} | {sch.get(conv_block).writes[0].source}
        if any(has_reduce(sch, b) for b in between + epilogue) \
                or not all(_per_channel_reads(sch, b, own) for b in between):
            return False
        hv = host_vector(host)
        lanes = hv.lanes(str(sch.get(pool.block).writes[0].source.dtype))
        opts = replace(conv_opts, transpose=False, lane_epilogue=False, whole_planes=True, pad_in_task=False)

        def apply(s) -> bool:
            for b in reversed(between):
                if not ok(s.compute_inline, b):
                    return False
            if schedule_conv2d(s, blocks[:ci + 1], ci, match_conv2d(s, conv_block), target, hv, opts) is None:
                return False
            producers = s.get_producers(pool.block)
            task = s.get_loops(conv_block)[0]
            if len(producers) != 1 or s.get(task).kind != tirx.ForKind.PARALLEL:
                return False
            copy = producers[0]
            acc = [extent_of(d) for d in s.get(conv_block).writes[0].source.ty.shape]
            tiles = loop_tiles(s, conv_block, task)
            # every task must compute whole planes of its channels (a row block would be summed in part),
            # held in UB (as a small plane's channel chunks are), and the cores get several tasks each
            if tiles is None or len(acc) != 5 or None in acc \
                    or any(t not in (None, n) for t, n in zip(tiles[2:4], acc[2:4])):
                return False
            tile = math.prod(n if t is None else t for t, n in zip(tiles, acc))
            npu = as_target(target)
            if tile * npu.element_bytes(str(s.get(conv_block).writes[0].source.dtype)) > npu.ub_usable // 4 \
                    or (extent(s, task) or 0) < TILES_PER_CORE * num_cores(host):
                return False
            if not ok(s.compute_inline, copy) or not ok(s.reverse_compute_at, pool.block, task,
                                                         preserve_unit_loops=True):
                return False
            *_, c, _y, _x, k2, k3 = s.get_loops(pool.block)
            channels = extent(s, c)
            if channels is None or channels % lanes:
                return False
            co, cl = s.split(c, [None, lanes])
            s.reorder(co, k2, k3, cl)
            if not ok(s.vectorize, cl):
                return False
            if epilogue:
                *inline, last = epilogue
                for b in inline:
                    if not ok(s.compute_inline, b):
                        return False
                if not ok(s.reverse_compute_at, last, task, preserve_unit_loops=True):
                    return False
                s.set_scope(pool.block, 0, "local")      # one vector of sums a task, read by its epilogue
            init = s.decompose_reduction(pool.block, k2)
            if not ok(s.vectorize, s.get_loops(init)[-1]):
                return False
            s.annotate(pool.block, "ascendfuse.schedule",
                       f"plane pool from the conv's accumulator tile, {lanes} channel lanes")
            return unwritten_output(s.mod["main"]) is None

        return on_copy_first(sch, apply)

    def _schedule_blocked(self, sch, blocks, reductions, pool: PoolBlock, target, host, conv_opts) -> bool:
        """The pool behind a conv in the same kernel on the conv's channel vectors: the conv part's result (a
        kernel buffer written by its last epilogue block) laid out as the accumulator is, (N, C // vl, H, W,
        vl), its epilogue computing whole channel vectors, and the pool reading them (``lane_pool.py``,
        ``blocked_source``); the pool's result reaches NCHW in its write-back.

        Why: the NCHW result made the epilogue read the accumulator lane-strided, and the pool then read
        it one scalar a window tap; SqueezeNet's stem (conv 3->64 + ReLU + max-pool 3x3/2 over a 111-wide
        plane) ran its pool part as long as its conv. Only the pool's result (a quarter of the conv's
        elements for a stride-2 pool) crosses lanes now. The conv's epilogue then needs no register
        transpose of its own (``ConvOptions.transpose`` off). False, with ``sch`` unchanged, when the pieces
        do not have that form (everything is tried on a copy first)."""
        n, c, y, x, *_ = sch.get_loops(pool.block)
        channels, rows, cols = extent(sch, c), extent(sch, y), extent(sch, x)
        lanes = host_vector(host).lanes(str(sch.get(pool.block).writes[0].source.dtype))
        if None in (channels, rows, cols) or channels % lanes:
            return False
        nbytes = on_chip_bytes(pool.source, target)
        cb, rb = choose_pool_tile(channels, rows, cols, pool, nbytes, target, num_cores(host), lanes)
        cb, rb = self.choose(sch, (cb, rb), lambda: [t for t in pool_tile_candidates(
            (cb, rb), channels, rows, cols, pool, nbytes, target, num_cores(host)) if t[0] % lanes == 0])
        # a window needs the conv's rows: not over a flat plane, whose accumulator would reach the pool through
        # an NCHW copy, read one scalar a tap (a whole plane's mean reads the flat accumulator's channel vectors)
        opts = replace(conv_opts, transpose=False, lane_epilogue=False,
                       flat_plane=conv_opts.flat_plane and pool.kernel_rows == pool.rows_in)

        def apply(s) -> bool:
            start = self._schedule_conv_part(s, blocks, reductions, target, host, opts)
            if start is None:
                return False
            conv, last, prologue = blocks[reductions[0]], blocks[start - 1], blocks[start:reductions[1]]
            if not still_exists(s, last) or is_output_block(s, last):
                return False
            # the accumulator NCHW[lanes]c over the planes of the result (not the pixel-vector form)
            acc = [extent_of(d) for d in s.get(conv).writes[0].source.ty.shape]
            out = [extent_of(d) for d in s.get(last).writes[0].source.ty.shape]
            if len(acc) != 5 or len(out) != 4 or acc[4] != lanes or acc[2] != out[2] or None in out \
                    or acc[1] * lanes < out[1]:
                return False
            # the accumulator's columns are the row's, or more where the row was padded (column_pad.py)
            if acc[3] != out[3] and not (conv_opts.columns == out[3] and acc[3] is not None and acc[3] > out[3]):
                return False
            if any(has_reduce(s, b) for b in prologue) or not _reads_only(s, prologue, s.get(last).writes[0].source):
                return False
            return _epilogue_on_channel_vectors(s, last, lanes) and schedule_lane_pool(
                s, prologue, pool, list(blocks[reductions[1] + 1:]), lanes, cb, rb, blocked_source=True) \
                and unwritten_output(s.mod["main"]) is None

        return on_copy_first(sch, apply)

    @staticmethod
    def _schedule_global(sch, prologue, pool: PoolBlock, epilogue, host) -> bool:
        """A pool over whole planes with no conv before it (ConvNeXt-V2's GRN: the sum of squares over each
        channel's plane; a global mean after a residual add): each plane is summed as vector partial sums,
        parallel over (batch, channel), as a conv kernel's plane-pool tail is. The window path below keeps one
        scalar accumulator per output, a chain of dependent adds as long as the plane (3.6 GFLOP/s on 56x56).
        False (nothing changed) when the pool is a window, the plane is too short for partial sums, or a
        prologue block cannot be inlined into it."""
        dims = [extent(sch, lp) for lp in sch.get_loops(pool.block)]
        lanes = vector_lanes(host, buffer_bytes(sch.get(pool.block).writes[0].source) * 8)
        if len(dims) != 6 or dims[2:] != [1, 1, pool.rows_in, pool.cols_in] or dims[4] * dims[5] < 4 * lanes:
            return False
        probe = sch.copy()          # block handles stay valid in a copy: try the inlining there first
        if not all(ok(probe.compute_inline, b) for b in reversed(prologue)):
            return False
        for b in reversed(prologue):
            sch.compute_inline(b)
        note = schedule_plane_pool(sch, [pool.block, *epilogue], lanes)
        sch.annotate(pool.block, "ascendfuse.schedule", note.replace("plane pool after it", "global pool"))
        return True

    def _schedule_pool(self, sch, prologue, pool: PoolBlock, epilogue, target, host):
        block = pool.block
        lanes = vector_lanes(host, buffer_bytes(sch.get(block).writes[0].source) * 8)
        n, c, y, x, *red = sch.get_loops(block)
        channels, rows, cols = extent(sch, c), extent(sch, y), extent(sch, x)
        if None in (channels, rows, cols):
            return False
        nbytes = on_chip_bytes(pool.source, target)
        clanes = channel_lanes(host, pool, sch, channels, cols)
        cb, rb = choose_pool_tile(channels, rows, cols, pool, nbytes, target, num_cores(host), clanes or 1)
        cb, rb = self.choose(sch, (cb, rb), lambda: [t for t in pool_tile_candidates(
            (cb, rb), channels, rows, cols, pool, nbytes, target, num_cores(host)) if t[0] % (clanes or 1) == 0])
        # channels innermost where output rows are shorter than a vector (``lane_pool.py``): tried on a copy
        # first, since a step that does not apply leaves the schedule half changed
        if clanes is not None and cb % clanes == 0 and schedule_lane_pool(sch.copy(), prologue, pool, epilogue,
                                                                           clanes, cb, rb):
            return schedule_lane_pool(sch, prologue, pool, epilogue, clanes, cb, rb)
        co, ci = sch.split(c, [None, cb])
        yo, yi = sch.split(y, [None, rb])
        # window innermost: each output accumulates in a register. (Vectorising the output columns instead
        # reads the window with stride-2 vector loads, which the host scalarises: measured several times slower.)
        sch.reorder(n, co, yo, ci, yi, x, *red)
        tile = sch.fuse(n, co, yo)

        # input window rows of the tile in UB: the padding block when there is one, else a copy
        stage = None
        if prologue:
            *inline, last = prologue
            for b in inline:
                ok(sch.compute_inline, b)
            if any(sch.get(p).same_as(sch.get(last)) for p in sch.get_producers(block)):
                sch.set_scope(last, 0, UB_SCOPE)
                stage = last
            else:
                ok(sch.compute_inline, last)
        if stage is None:
            stage = sch.cache_read(block, 0, UB_SCOPE, consumer_blocks=[block])
        sch.compute_at(stage, tile, preserve_unit_loops=True)
        vectorize_inner(sch, stage, lanes)

        # output tile in UB; the epilogue (or the write-back) runs per tile
        out_shape = sch.get(block).writes[0].source.ty.shape
        if epilogue:
            *inline, last = epilogue
            for b in inline:
                ok(sch.compute_inline, b)
            # per tile only when the pool is all it reads of the kernel: an epilogue that also reads the
            # tensor in front of the pool (PoolFormer's token mixer, pool(x) - x) would read it from a stage
            # computed outside the tile loop, which reverse_compute_at refuses
            own = all(sch.get(p).same_as(sch.get(block)) for p in sch.get_producers(last))
            if own and tile_local(sch, last, out_shape):
                sch.set_scope(block, 0, UB_SCOPE)
                writer = last
            else:
                parallel_vector(sch, last, lanes)
                writer = sch.cache_write(block, 0, UB_SCOPE)
        else:
            writer = sch.cache_write(block, 0, UB_SCOPE)
        sch.reverse_compute_at(writer, tile, preserve_unit_loops=True)
        vectorize_inner(sch, writer, lanes)

        try_(sch.parallel, tile)          # before the reduction is split into init + update (TVM's legality)
        init = sch.decompose_reduction(block, sch.get_loops(block)[1])
        vectorize_inner(sch, init, lanes)
        try_(sch.unroll, sch.get_loops(block)[-1])
        sch.annotate(block, "ascendfuse.schedule", f"pool tile {cb}ch x {rb}rows")
        return True


def _epilogue_on_channel_vectors(sch, last, vl: int) -> bool:
    """Re-lay the buffer ``last`` writes out as (N, C // vl, H, W, vl) and compute ``last`` on channel vectors:
    its channel loop split by ``vl`` and innermost (vectorised), its column loops fused outside it. ``last``
    is a conv epilogue block placed per tile (its innermost loops run over channels and columns only);
    False when it is not."""
    if not ok(sch.transform_layout, last, ("write", 0), lambda a, ch, h, w: (a, ch // vl, h, w, ch % vl)):
        return False
    realize = get_realize(sch, last)
    if len(realize.iter_values) != 4:
        return False
    uses = lambda lp, k: any(v.same_as(sch.get(lp).loop_var)    # noqa: E731
                             for v in collect_vars_used_in_prim_expr(realize.iter_values[k]))
    inner = []
    for lp in reversed(sch.get_loops(last)):
        own = len(blocks_under(sch, lp)) == 1          # not a loop of the conv's tiles as well
        if not own or not (uses(lp, 1) or uses(lp, 3)) or (uses(lp, 1) and uses(lp, 3)):
            break
        inner.insert(0, lp)
    channel = [lp for lp in inner if uses(lp, 1)]
    columns = [lp for lp in inner if uses(lp, 3)]
    if not channel:
        return False
    sch.reorder(*columns, *channel)
    # one plain loop each (a loop the conv schedule vectorised or split becomes a plain one)
    ch = sch.fuse(*(channel if len(channel) > 1 else sch.split(channel[0], [None, 1])))
    if (extent(sch, ch) or 1) % vl:
        return False
    if columns:
        col = sch.fuse(*(columns if len(columns) > 1 else sch.split(columns[0], [None, 1])))
        if (extent(sch, col) or 0) <= MAX_UNROLLED_COLUMNS:
            sch.unroll(col)
    _, ci = sch.split(ch, [None, vl])
    return ok(sch.vectorize, ci)


def _per_channel_reads(sch, block, own) -> bool:
    """Does ``block`` (a conv epilogue) read, besides the buffers in ``own``, only tensors that are constant
    over each plane (a bias (1, C, 1, 1), a scalar)? A residual read along the plane would be gathered
    channel by channel on channel vectors."""
    for region in sch.get(block).reads:
        if any(region.source.same_as(o) for o in own):
            continue
        dims = [extent_of(d) for d in region.source.ty.shape]
        if len(dims) > 2 and any(d != 1 for d in dims[2:]):
            return False
    return True


def _reads_only(sch, prologue, source) -> bool:
    """Do the blocks between the conv part and the pool read nothing but the conv part's result ``source``
    and each other's results (a padding block: yes; a concat with another input: no)?"""
    own = {sch.get(b).writes[0].source for b in prologue} | {source}
    return all(any(r.source.same_as(o) for o in own) for b in prologue for r in sch.get(b).reads)
