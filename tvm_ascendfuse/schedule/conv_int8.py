"""Int8Conv2dRule: a uint8 x int8 -> int32 NCHW conv2d (+ prologue and epilogue) on the int8 dot product.

Recognised from the blocks: one conv2d block (groups = 1, ``analysis.match_conv2d``) with uint8 data, an int8
constant weight and an int32 accumulator (``graph_fusion/conv_quant``), injective blocks before it (the
quantize of the input and its padding) and after it (zero-point correction, scale, bias, activation,
residual, the next quantize).

Schedule, the GEMM rule's micro-kernel with output channels on the 16 int32 lanes and output pixels of one
row as the tile rows:

* weight packed once at compile time to ``W'[f // 16, c // 4, r, s, f % 16, c % 4]``;
* the data written once per call as ``D'[n, c // 4, h, w, c % 4]`` (4 channels of a pixel: the 4 bytes one
  ``vpdpbusd`` broadcasts), by the padding block when the kernel pads (the prologue inlined into it) or by a
  copy of the input; any stride and dilation (the 4 bytes stay contiguous);
* a tile of ``mr`` output pixels x ``nv`` 16-channel vectors accumulates over (c, r, s) in registers, the
  accumulator laid out ``[n, y, x, f]`` so one vector is 16 channels; the epilogue runs on each finished tile.

An epilogue that writes a larger tensor than the conv's output (the next conv's padded input, fused here by
the grouping) runs after the conv over the whole int32 result instead: its border belongs to no tile.
Channel counts that are not multiples of 16 (output) or 4 (input) are declined: the generic conv rule
takes those, and every int8 conv on a host without VNNI (there the generic rule's
schedule was measured faster than this tile in plain int32 arithmetic: 8.7 vs 19.3 ms for a 64-channel 3x3
conv at 28x28 on a portable x86 target).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import has_reduce, match_conv2d
from .base import UB_SCOPE, ScheduleRule
from .common import new_schedule, extent, ok, root_blocks
from .hostvec import has_int8_dot, host_vector
from .int8_dot import DEPTH, LANES, dot_16x4_u8s8, register_tile
from .layout import mark_prepack, packable_param
from .transpose import STAGE_DTYPES, transpose_to_nchw


def _param(sch, buf) -> bool:
    return any(p.same_as(buf) for p in sch.mod["main"].params)


class Int8Conv2dRule(ScheduleRule):
    """See the module docstring."""

    name = "conv2d_int8"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(func)
        blocks = list(root_blocks(sch))
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        if len(reductions) != 1:
            return None
        ci = reductions[0]
        conv = blocks[ci]
        info = match_conv2d(sch, conv)
        if info is None:
            return None
        stmt = sch.get(conv)
        data = stmt.reads[info.data_read].source
        if (str(data.dtype), str(info.weight_buf.dtype), str(stmt.writes[0].source.dtype)) \
                != ("uint8", "int8", "int32"):
            return None
        if packable_param(sch, info.weight_buf) is None or not has_int8_dot(host):
            return None
        ext = [extent(sch, lp) for lp in sch.get_loops(conv)]
        if None in ext:
            return None
        _, oc, _, ow, ic, _, _ = ext
        if oc % LANES or ic % DEPTH:
            return None
        hv = host_vector(host)
        tile = register_tile(ow, oc // LANES, hv.accumulators + hv.accumulators // 2)
        if tile is None:
            return None
        mr, nv = tile

        # prologue: everything in front of the conv inlined into the block that writes its data (the padding)
        producer = None
        for blk in blocks[:ci]:
            writes = sch.get(blk).writes
            if len(writes) == 1 and writes[0].source.same_as(data):
                producer = blk
            elif not ok(sch.compute_inline, blk):
                return None
        if producer is None:
            if not _param(sch, data):
                return None
            producer = sch.cache_read(conv, info.data_read, "global")
        # epilogue: what can be inlined is; the blocks left write the kernel's outputs (a residual kernel
        # writes the next conv's uint8 input and the int8 tensor the residual add reads)
        epilogue = [blk for blk in blocks[ci + 1:] if not ok(sch.compute_inline, blk)]
        out_shape = [int(d) for d in stmt.writes[0].source.shape]
        # an epilogue writing a larger tensor (the next conv's padded input) has a border no output tile
        # covers: it runs after the conv, over its whole output, from the int32 result
        whole = any(_larger([int(d) for d in sch.get(blk).writes[0].source.shape], out_shape) for blk in epilogue)

        sch.transform_layout(producer, ("write", 0), lambda n, c, h, w: [n, c // DEPTH, h, w, c % DEPTH])
        mark_prepack(sch, conv, info.weight_read,
                     lambda f, c, r, s: [f // LANES, c // DEPTH, r, s, f % LANES, c % DEPTH])

        n, f, y, x, c, r, s = sch.get_loops(conv)
        fo, nvo, fi = sch.split(f, [None, nv, LANES])
        xo, xi = sch.split(x, [None, mr])
        co, cii = sch.split(c, [None, DEPTH])
        sch.reorder(n, fo, y, xo, co, r, s, xi, nvo, fi, cii)
        outer = sch.fuse(n, fo, y)
        sch.parallel(outer)
        acc = sch.cache_write(conv, 0, "global")   # the intrinsic declares global buffers
        sch.transform_layout(conv, ("write", 0), lambda n_, f_, y_, x_: [n_, y_, x_, f_])
        init = sch.decompose_reduction(conv, co)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.tensorize(fi, dot_16x4_u8s8())
        sch.unroll(xi)
        sch.unroll(nvo)
        if not epilogue:
            # the int32 result itself is the output: copied out of the [n, y, x, f] accumulator in one pass
            # (TVM 0.27 cannot move this copy under the tile loop: reverse_compute_at fails inside its error
            # reporting)
            loops = sch.get_loops(acc)
            sch.parallel(sch.fuse(*loops[:2]))
        else:
            sch.compute_inline(acc)
            for blk in epilogue:
                if whole:
                    loops = sch.get_loops(blk)
                    sch.parallel(sch.fuse(*loops[:2]))
                elif len(epilogue) > 1 or not _transposed_epilogue(sch, blk, xo):
                    # several outputs keep the vector epilogue (TVM 0.27 raised an internal error placing the
                    # second output's block after the first one's UB tile)
                    if not ok(sch.reverse_compute_at, blk, xo):
                        return None
                    _vector_epilogue(sch, blk)
        # the packed data: one pass, parallel over channel groups
        p_loops = sch.get_loops(producer)
        sch.parallel(sch.fuse(*p_loops[:2]))
        return sch


def _larger(shape, out_shape) -> bool:
    """Whether an epilogue output of ``shape`` reaches outside the conv's output (a padded next input). One
    with fewer channels (the conv's weight padded to whole vectors, ``graph_fusion/_quant``) stays per tile:
    each tile computes its padded channels and stores the real ones."""
    return len(shape) != len(out_shape) or any(a > b for a, b in zip(shape, out_shape)) \
        or any(a != b for i, (a, b) in enumerate(zip(shape, out_shape)) if i != 1)


def _transposed_epilogue(sch, blk, xo) -> bool:
    """The per-tile epilogue on 16-channel vectors into a UB tile (NCHW[16]c), stored to the NCHW output
    through register transposes (``transpose.transpose_to_nchw``: one ``cols``-wide store per channel row
    instead of 16 lane extracts per vector). False, schedule untouched, when the tile has no such store
    (channels per tile not a multiple of 16, one column, a store dtype without the intrinsic)."""
    dtype = str(sch.get(blk).writes[0].source.ty.dtype)
    if len(sch.get(blk).writes[0].source.shape) != 4 or dtype not in STAGE_DTYPES:
        return False
    trial = sch.copy()
    try:
        if not _blocked_store(trial, blk, xo, check=True):
            return False
    except RuntimeError:
        return False
    return _blocked_store(sch, blk, xo)     # the trial worked: the same steps on the real schedule


def _blocked_store(sch, blk, xo, check: bool = False) -> bool:
    """The steps of ``_transposed_epilogue`` on ``sch``; ``check``: refuse a tile whose channels are not
    whole vectors or whose columns are outside 2..8 (what the register transposes take)."""
    out = sch.cache_write(blk, 0, UB_SCOPE)
    sch.transform_layout(blk, ("write", 0), lambda n, c, h, w: (n, c // LANES, h, w, c % LANES))
    sch.reverse_compute_at(blk, xo)
    sch.reverse_compute_at(out, xo)
    chans, cols = sch.get_loops(blk)[-2:]
    if check:
        n_chans, n_cols = extent(sch, chans), extent(sch, cols)
        if n_chans is None or n_chans % LANES or n_cols is None or not 2 <= n_cols <= 8:
            return False
    sch.reorder(cols, chans)
    sch.vectorize(sch.split(chans, [None, LANES])[1])
    sch.split(sch.get_loops(out)[-2], [None, LANES])
    return transpose_to_nchw(sch, out, LANES)


def _vector_epilogue(sch, blk) -> None:
    """The per-tile epilogue with the channels as its inner loop, 16 to a vector (8 or 4 when the output
    has a channel count 16 does not divide, the padded channels not stored): its reads of the
    ``[n, y, x, f]`` accumulator and its per-channel constants are whole vectors and the arithmetic
    (requantize's divide, round and clip) runs on all lanes at once; only the store into the NCHW output
    goes lane by lane. Left as placed (scalar) when its loops are not (channels, columns)."""
    loops = sch.get_loops(blk)
    if len(loops) < 2:
        return
    chans, cols = loops[-2:]
    n_chans = extent(sch, chans)
    lanes = next((v for v in (LANES, 8, 4) if n_chans is not None and n_chans % v == 0), None)
    if lanes is None:
        return
    sch.reorder(cols, chans)
    _, inner = sch.split(chans, [None, lanes])
    sch.vectorize(inner)
