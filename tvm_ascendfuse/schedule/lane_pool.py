"""A window pool over NCHW planes vectorised over channels: the tile's input rows are staged in UB as
(rows, columns, channel lanes) and each output is ``lanes`` channels reduced as whole vectors.

Why: the plain window path keeps one scalar accumulator per output, its column loop vectorised by LLVM only
when an output row holds a whole vector; SqueezeNet's last max-pool (behind the concat of a fire module's
two branches, 13 output columns) ran fully scalar. With the channels innermost in the staged tile every window read is one
contiguous vector whatever the plane's width or the pool's stride; the price is the transposing copies in
and out of UB (scalar, one load and store per element, which the plain path's staging already paid for the
input).

Used by ``PoolRule`` for window pools (and whole-plane pools behind a conv) with output rows shorter than a
host vector and a channel count a vector of at least ``MIN_LANES`` lanes divides, and for any pool behind a
conv in the same kernel whose result the conv part leaves in its accumulator's channel-vector layout (no
transposing copy in: ``blocked_source``); the tile is ``cb`` channels (a multiple of the lane count) x ``rb``
output rows, chosen as the plain path chooses it.
"""

from __future__ import annotations

from tvm import tirx

from .analysis import PoolBlock
from .base import UB_SCOPE
from .common import extent, ok, on_copy_first, tile_local, try_
from .hostvec import host_vector
from .transpose import out_transpose_intrin, transpose_to_nchw

# Fewer lanes than this gain too little over the scalar window to pay for the transposing copies.
MIN_LANES = 4


def channel_lanes(host, pool: PoolBlock, sch, channels: int | None, out_cols: int | None) -> int | None:
    """Lanes of the channel vector for this pool (the widest power of two up to the host's vector that
    divides the channel count), or None when the plain window path is the better one: fewer than
    ``MIN_LANES`` lanes, or output rows at least one host vector long (LLVM then vectorises the plain path's
    column loop itself; measured on Zen 5: max-pools over 13 output columns ran 2.4x faster with channel
    lanes, over 27 and 55 columns slower, the transposing copy being scalar)."""
    if channels is None or out_cols is None:
        return None
    lanes = host_vector(host).lanes(str(sch.get(pool.block).writes[0].source.dtype))
    if out_cols >= lanes:
        return None
    v = lanes
    while v >= MIN_LANES and channels % v:
        v //= 2
    return v if v >= MIN_LANES else None


def _blocked(lanes: int):
    """NCHW -> (N, C // lanes, H, W, lanes): a channel block's lanes contiguous for every pixel."""
    return lambda n, c, h, w: (n, c // lanes, h, w, c % lanes)


def schedule_lane_pool(sch, prologue, pool: PoolBlock, epilogue, lanes: int, cb: int, rb: int,
                       blocked_source: bool = False) -> bool:
    """Schedule the pool (root blocks ``prologue`` -> ``pool`` -> ``epilogue``) with ``cb`` channels (a
    multiple of ``lanes``) x ``rb`` output rows per tile and the channel lanes innermost; False (the schedule
    left partly changed: call on a copy first) when a step does not apply. ``blocked_source``: the tensor the
    pool reads is already (N, C // lanes, H, W, lanes) (a conv's result in the same kernel, ``PoolRule``):
    the staging copy then moves whole channel vectors instead of transposing."""
    block = pool.block
    loops = sch.get_loops(block)
    if len(loops) != 6 or cb % lanes:
        return False
    n, c, y, x, r0, r1 = loops
    blocked = _blocked(lanes)

    stage = None
    if prologue:
        *inline, last = prologue
        for b in inline:
            if not ok(sch.compute_inline, b):
                return False
        if any(sch.get(p).same_as(sch.get(last)) for p in sch.get_producers(block)):
            sch.set_scope(last, 0, UB_SCOPE)
            stage = last
        elif not ok(sch.compute_inline, last):
            return False
    if stage is None:
        stage = sch.cache_read(block, 0, UB_SCOPE, consumer_blocks=[block])
    # a copy of a blocked source (no padding block in between) is blocked already
    copied_blocked = len(sch.get(stage).writes[0].source.ty.shape) == 5
    if copied_blocked and not blocked_source:
        return False
    if not copied_blocked and not ok(sch.transform_layout, stage, ("write", 0), blocked):
        return False

    out_shape = sch.get(block).writes[0].source.ty.shape
    writer = None
    if epilogue:
        *inline, last = epilogue
        for b in inline:
            if not ok(sch.compute_inline, b):
                return False
        own = all(sch.get(p).same_as(sch.get(block)) for p in sch.get_producers(last))
        if not (own and tile_local(sch, last, out_shape)):
            return False        # the plain path runs such an epilogue after the pool
        sch.set_scope(block, 0, UB_SCOPE)
        writer = last
    else:
        writer = sch.cache_write(block, 0, UB_SCOPE)
    if not ok(sch.transform_layout, block, ("write", 0), blocked):
        return False

    co, ci = sch.split(c, [None, cb])
    cl, lane = sch.split(ci, [None, lanes])
    yo, yi = sch.split(y, [None, rb])
    sch.reorder(n, co, yo, cl, yi, x, r0, r1, lane)
    tile = sch.fuse(n, co, yo)
    if not ok(sch.compute_at, stage, tile, preserve_unit_loops=True):
        return False
    if not ok(sch.reverse_compute_at, writer, tile, preserve_unit_loops=True):
        return False
    if copied_blocked:
        if not ok(sch.vectorize, sch.get_loops(stage)[-1]):    # its loops end in the lanes
            return False
    elif blocked_source:
        c_loop, h_loop, w_loop = sch.get_loops(stage)[-3:]
        co, ci = sch.split(c_loop, [None, lanes])
        sch.reorder(co, h_loop, w_loop, ci)
        if not ok(sch.vectorize, ci):
            return False
    else:
        c_loop, h_loop, w_loop = sch.get_loops(stage)[-3:]
        # the transposing copy a whole channel row at a time (contiguous reads, the row's elements written
        # ``lanes`` apart): a concat in front of the pool then picks its part once per row, not once per
        # element. Measured on a 2-core Zen 5 (interleaved, one process): DenseNet's second transition (concat
        # of 13 parts + BN + ReLU + 2x2 average over 28x28) 0.39 -> 0.25 ms against ``lanes`` x ``lanes``
        # blocks across channels, its third (25 parts, 14x14) 0.116 -> 0.099, SqueezeNet's concat + max-pool
        # over 27x27 the same (0.030 / 0.031)
        sch.reorder(h_loop, c_loop, w_loop)
    # parallel and vectorised before the reduction is split into init + update: TVM's legality check accepts
    # a data-parallel loop over a reduction block, not over the update block alone
    try_(sch.parallel, tile)
    if not ok(sch.vectorize, lane):
        return False
    init = sch.decompose_reduction(block, sch.get_loops(block)[1])
    inner = sch.get_loops(init)[-1]
    if sch.get(inner).kind != tirx.ForKind.VECTORIZED and not ok(sch.vectorize, inner):
        return False
    for loop in sch.get_loops(block)[-3:-1]:
        if (extent(sch, loop) or 0) <= 3:
            try_(sch.unroll, loop)
    note = ""
    if not epilogue and _store_through_transposes(sch, writer, lanes):
        note = ", NCHW store through register transposes"
    sch.annotate(block, "ascendfuse.schedule", f"pool tile {cb}ch x {rb}rows, {lanes} channel lanes{note}")
    return True


def _store_columns(width: int) -> int | None:
    """Columns per register transpose of the write-back: 16 or 8 where they divide the row, else the widest
    count from 16 down to 4 that does (55 = 5 x 11, 13, 27 = 3 x 9), None for rows none divides."""
    return next((w for w in (16, 8, *range(15, 3, -1)) if width % w == 0), None)


def _store_through_transposes(sch, writer, lanes: int) -> bool:
    """The write-back ``writer`` (a copy of the pooled tile, (channels, rows, columns) loops over the
    channel-vector UB tile, into the NCHW result) as register transposes of ``lanes`` channels x a column
    block (``transpose.transpose_to_nchw``): whole-vector loads and row stores instead of one lane extract
    and scalar store per element. SqueezeNet's stem (conv + ReLU + max-pool to 64 x 55 x 55) and its concat
    + max-pool kernels stored every pooled element that way. False, ``sch`` unchanged, where the tile has
    no such form (a predicated tile, channels no vector divides, a row no block divides)."""
    *_, c, y, x = sch.get_loops(writer)
    chans, cols = extent(sch, c), extent(sch, x)
    width = None if cols is None else _store_columns(cols)
    dtype = str(sch.get(writer).writes[0].source.ty.dtype)
    if chans is None or chans % lanes or width is None or out_transpose_intrin(dtype, width, lanes) is None:
        return False

    def apply(s) -> bool:
        *_, c, y, x = s.get_loops(writer)
        co, ci = s.split(c, [None, lanes])
        xo, xi = s.split(x, [None, width])
        s.reorder(co, y, xo, ci, xi)
        return transpose_to_nchw(s, writer, lanes)

    return on_copy_first(sch, apply)
