"""Conv2dRule: NCHW conv2d (any kernel, stride, padding, dilation; groups=1) + injective epilogue.

Recognised from the blocks: one reduction block ``C[n, f, y, x] += D[n, c, ..y.., ..x..] * W[f, c, r, s]``
(casts allowed) whose output and weight indices are bare iterators in NCHW / OIHW order. Its padding
prologue (``pad_temp``, with whatever injective ops feed it inlined, e.g. the Focus slicing) is computed
inside the one parallel loop when that loop runs over blocks of output rows (each task pads the input rows
of its block, halo rows twice: no second fork/join, the rows stay in the core's cache; W1 conv 2 threads
measured ~5% faster, 1 thread unchanged), else once at the root, parallel over channels. Epilogue ops
(folded-BN bias, activation, residual add) are fused into the store of each output tile, which reaches NCHW
through a register transpose where the tile has its shape (``transpose.py``; one core: W1 1%, 7x7 s2 stem
6%, 1x1 64ch @56^2 2-4% faster). Grouped and depthwise convs have another index structure and are left to
the fallback rule.

Tiling: the accumulator tile (ocb output channels x owr output columns of one row) lives in ``local.UB``
in an NCHW[vl]c layout, so the vector axis (output channels) is innermost; each FMA multiplies vl output
channels by one broadcast input pixel. ocb x owr is the host's register block (AVX-512: 32 x 8 fp32 =
16 zmm accumulators), which on the NPU is a small UB tile (1 KiB) well inside usable UB for any conv. The
weight is re-laid out to (OC/ocb, IC, KH, KW, ocb) when it is a compile-time constant (``layout.py``).
A pointwise conv's NCHW input staged NCHW[16]c (``_wants_nchwc``) is copied through the input-side register
transpose (16 channels x 8 columns, ``transpose.py``) where the width is a multiple of 8, else gathered lane
by lane; kernel alone, one core: 1x1 64->64 @56^2 11%, 256->64 9%, 64->256 3% faster.

Tuning: with a ``tiles`` chooser the register block and the blocks of output rows become one sampled
decision over ``conv_candidates`` (``tunable.py``), the rule's own choice first; without one the schedule is
the rule's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from .base import UB_SCOPE, ScheduleRule
from .common import accumulating_store, extent, ok, root_blocks, tile_local, try_
from .fast_math import use_fast_math
from .hostvec import HostVector, host_vector
from .layout import mark_prepack, packable_param
from .matmul import _LOAD, _has_reduce, _strip_cast, _vectorize_inner, parallel_vector
from .transpose import transpose_load, transpose_store

_LOG = logging.getLogger(__name__)
_SUBSAMPLE = "ascendfuse.conv_subsample"   # marks the gathered input of a strided 1x1 conv


@dataclass
class ConvBlock:
    block: object
    data_read: int        # index of the data operand in block.reads
    weight_read: int
    weight_buf: object
    out_dtype: str


def match_conv2d(sch: s_tir.Schedule, block) -> ConvBlock | None:
    stmt = sch.get(block)
    body = accumulating_store(stmt)
    if body is None:
        return None
    iters = [iv.var for iv in stmt.iter_vars]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if len(iters) != 7 or [k == tirx.IterVar.DataPar for k in kinds] != [True] * 4 + [False] * 3:
        return None
    loops = sch.get_loops(block)
    if len(loops) != 7:
        return None
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize) or not all(
            isinstance(v, tirx.Var) and v.same_as(sch.get(lp).loop_var) for lp, v in zip(loops, realize.iter_values)):
        return None
    n, f, y, x, rc, ry, rx = iters
    same = lambda idx, vs: len(idx) == len(vs) and all(isinstance(i, tirx.Var) and i.same_as(v)
                                                      for i, v in zip(idx, vs))
    if not same(body.indices, [n, f, y, x]):
        return None
    val = body.value
    for acc, prod in ((val.a, val.b), (val.b, val.a)):
        acc, prod = _strip_cast(acc), _strip_cast(prod)
        if not (isinstance(acc, _LOAD) and acc.source.same_as(body.buffer) and isinstance(prod, tirx.Mul)):
            continue
        ops = [_strip_cast(prod.a), _strip_cast(prod.b)]
        if not all(isinstance(o, _LOAD) for o in ops):
            continue
        w = next((o for o in ops if same(o.indices, [f, rc, ry, rx])), None)
        d = next((o for o in ops if o is not w), None)
        if w is None or d is None or len(d.indices) != 4:
            continue
        if not (same(d.indices[:2], [n, rc])):
            continue
        reads = [r.source for r in stmt.reads]
        di = next((i for i, r in enumerate(reads) if r.same_as(d.source)), None)
        wi = next((i for i, r in enumerate(reads) if r.same_as(w.source)), None)
        if di is None or wi is None:
            continue
        return ConvBlock(block, di, wi, w.source, str(body.buffer.ty.dtype))
    return None


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
    nbytes = tvm.DataType(dtype).bits // 8
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
                      columns_first: bool = False) -> ConvTiles:
    """Register block from the host's vector file, capped so the accumulator tile fits usable UB.

    Default: two vectors of output channels (fewest loads per FMA), as many columns as the accumulators
    allow. ``columns_first`` (a conv with KW > 1 whose every register block re-reads all its weights from
    L2): each weight vector feeds owr FMAs, and below half the accumulator count of columns per vector the
    weight stream outpaces the FMAs, so the column block comes first, then the accumulator count.
    With the NCHW input (``_wants_nchwc``), measured on this host, one core: 3x3 128ch @28^2 (1 x 14 instead
    of 2 x 7) 1.12x faster, 3x3 s2 128ch @56^2 1.15x, 3x3 s2 256ch @28^2 1.14x; W1's 3x3 @56^2 keeps 2 x 8.
    Pointwise convs and small planes (weights cache resident) keep the default: 1 x 14 measured 10-19%
    slower there (one broadcast load per FMA, no sliding reuse along KW)."""
    lanes = hv.lanes(dtype)
    vl = 1
    while vl * 2 <= lanes and oc % (vl * 2) == 0:
        vl *= 2
    acc = hv.accumulators

    def columns(ocr):
        cap = max(1, min(ow, acc // ocr))
        # prefer a column block dividing OW (no predicated tail) if one is at least half the cap
        owr = next((d for d in range(cap, 0, -1) if ow % d == 0), cap)
        return cap if owr * 2 <= cap else owr

    cands = [(ocr, columns(ocr)) for ocr in (2, 1) if oc >= ocr * vl and oc % (ocr * vl) == 0]
    if columns_first:
        ocr, owr = max(cands, key=lambda c: (c[1] * 2 >= acc, c[0] * c[1], c[0]))
    else:
        ocr, owr = cands[0]
    nbytes = tvm.DataType(dtype).bits // 8
    copies = 2 if target.double_buffer else 1
    while owr > 1 and copies * target.align_up(ocr * vl * owr * nbytes) > target.ub_usable:
        owr //= 2
    return ConvTiles(vl, ocr, owr)


class Conv2dRule(ScheduleRule):
    """NCHW conv2d + epilogue, register-blocked and UB-tiled (see module docstring)."""

    name = "conv2d"
    tunable = True      # register block and output-row blocks: ``tiles`` chooser (base.ScheduleRule)

    def __init__(self, prepack: bool = True, channel_chunk: int | None = 0, nchwc_min_ic: int | None = None,
                 nchwc_min_plane: int = 2048, plane_chunks: bool = True,
                 row_block_max_plane: int = 4096, subsample_strided: bool = True, pad_in_task: bool = True,
                 row_blocks: int | None = None, transpose: bool = True, transpose_input: bool = True,
                 tiles=None):
        """``tiles(sch, default, candidates)``, when given, picks the ConvChoice to use (a tuner samples one
        of ``candidates()``, see ``tunable.py``); without it the rule uses its own choice."""
        self.tiles = tiles
        self.transpose = transpose       # NCHW[vl]c -> NCHW store through register shuffles (transpose.py)
        self.transpose_input = transpose_input   # NCHW -> NCHW[icb]c input staging through register shuffles
        self.pad_in_task = pad_in_task   # see _row_blocks
        self.row_blocks = row_blocks     # None: from the core count (_row_blocks); n: n blocks (tuning)
        self.row_block_max_plane = row_block_max_plane
        self.subsample_strided = subsample_strided
        self.prepack = prepack
        # small output planes: reduce over input-channel chunks outside the pixel loops (see _plane_chunk)
        self.plane_chunks = plane_chunks
        self.nchwc_min_ic = nchwc_min_ic     # see _wants_nchwc; 0: never re-lay the input out
        self.nchwc_min_plane = nchwc_min_plane
        # 0 (default): no channel chunks (the measured recipe); None: chunk from the target's UB (3x3 s2 128ch:
        # 1.2x faster, 3x3 256ch 14x14: 1.2x slower on this host, so not the default); n: n channels (tuning)
        self.channel_chunk = channel_chunk

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        return self.schedule(s_tir.Schedule(tvm.IRModule({"main": use_fast_math(func)})), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> s_tir.Schedule | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        try:
            blocks = list(root_blocks(sch))
            reductions = [i for i, b in enumerate(blocks) if _has_reduce(sch, b)]
            if len(reductions) != 1:
                return None
            ci = reductions[0]
            info = match_conv2d(sch, blocks[ci])
            if info is None:
                return None
            return self._schedule(sch, blocks, ci, info, target, host_vector(host))
        except Exception:  # noqa: BLE001 - a refused primitive: decline, the fallback schedules it
            _LOG.debug("Conv2dRule declined", exc_info=True)
            return None

    def _wants_nchwc(self, sch, conv, info, ic, icb) -> bool:
        """Re-lay the input out NCHW[icb]c when the channel planes are far apart (a plane of at least
        ``nchwc_min_plane`` bytes: every channel of a register block's reads is another line and page) and
        the conv is pointwise, or (``nchwc_min_ic`` set) reads at least that many channels per output.
        Measured on this host: 1x1 256->64 @56^2 3.5x faster, 512->128 @28^2 1.3x. Convs with a larger
        kernel keep NCHW (read in place, padded per task): with the column-first register blocks of
        ``choose_conv_tiles`` NCHW measured 10% faster than NCHW[16]c on 3x3 128ch @28^2 and 3x3 s2 @56^2
        and @28^2 (one core)."""
        if ic is None or ic % icb:
            return False
        d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
        w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
        if None in d_shape or None in w_shape:
            return False
        plane = d_shape[2] * d_shape[3] * (tvm.DataType(info.out_dtype).bits // 8)
        wide = self.nchwc_min_ic is not None and ic >= self.nchwc_min_ic
        return plane >= self.nchwc_min_plane and (w_shape[2] * w_shape[3] == 1 or wide)

    def _channel_chunk(self, ic, sch, conv, ow, target, info) -> int | None:
        """Input channels per chunk when the input rows one output row needs (KH rows of the padded input,
        every channel) exceed a quarter of usable UB (double-buffered input, weights, accumulator), else
        None. 1x1 convs are not chunked: their accumulator row would leave the registers for one FMA per
        channel (measured slower)."""
        if self.channel_chunk is not None:
            return self.channel_chunk or None
        w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
        d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
        if ic is None or None in w_shape or None in d_shape or w_shape[2] * w_shape[3] == 1:
            return None
        per_channel = w_shape[2] * d_shape[3] * (tvm.DataType(info.out_dtype).bits // 8)
        budget = target.ub_usable // 4
        if ic * per_channel <= budget:
            return None
        chunk = max(1, budget // per_channel)
        while ic % chunk:
            chunk -= 1
        return chunk if chunk < ic else None

    def _plane_chunk(self, ic, out_dims, sch, conv, info, t: ConvTiles, target, hv: HostVector):
        """(input channels per chunk, output rows per block) for a small output plane, else None.

        With the reduction innermost, every register block streams the weights of all IC channels
        (IC x KH x KW x ocb) from L2 and reuses them for one block only. On a small plane (7x7, 14x14) the
        accumulator of a whole block of output rows fits UB, so the channel chunk loop goes outside the
        pixel loops and one chunk of weights plus its input planes is reused by every block of the plane.
        A pointwise stride-1 conv whose input planes are at most ``row_block_max_plane`` bytes (one page)
        may use a block of output rows instead of the whole plane when the plane's accumulator is too big;
        it then reads the input in place instead of re-laying it out NCHW[vl]c (a full copy per call).
        Sizes: accumulator and the chunk's working set (weights + input rows) each within a quarter of
        usable UB, chunks of 16..64 channels; the rows are split further only to give every core two tasks.
        Measured on this host, one core (ResNet-50 shapes): 3x3 256ch 14x14 1.15x, 512ch 7x7 1.15x, 1x1 on
        7x7/14x14 1.05-1.2x, 1x1 on 28x28 (row blocks) 1.15-1.2x faster; 3x3 on 28x28 and 56x56 neutral,
        1x1 on 56x56 (12.5 KB planes) and strided 1x1 slower than the NCHW[vl]c input, 8-channel chunks
        (3x3 s2 from 28x28) slower: those keep the register-resident reduction."""
        w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
        d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
        oc, oh, ow = out_dims
        if ic is None or None in w_shape or None in d_shape or None in (oh, ow, oc):
            return None
        nbytes = tvm.DataType(info.out_dtype).bits // 8
        budget = target.ub_usable // 4
        fit = oh
        while fit > 1 and (oh % fit or fit * ow * t.ocb * nbytes > budget):
            fit -= 1
        pointwise = w_shape[2] == w_shape[3] == 1 and d_shape[2:] == [oh, ow]
        row_blocks_ok = pointwise and d_shape[2] * d_shape[3] * nbytes <= self.row_block_max_plane
        if fit * ow * t.ocb * nbytes > budget or (fit < oh and not row_blocks_ok):
            return None
        in_rows = min(d_shape[2], -(-d_shape[2] * fit // oh) + w_shape[2])
        per_channel = (w_shape[2] * w_shape[3] * t.ocb + in_rows * d_shape[3]) * nbytes
        chunk = 64
        while chunk > 16 and (chunk * per_channel > budget or 2 * chunk > ic):
            chunk //= 2
        if chunk * per_channel > budget or ic % chunk or ic < 2 * chunk:
            return None
        tasks_per_row = -(-oc // t.ocb)
        row_blocks = max(1, -(-2 * hv.cores // tasks_per_row))
        rows = min(fit, -(-oh // row_blocks))
        while oh % rows:
            rows += 1
        if tasks_per_row * (oh // rows) < 2 * hv.cores:
            return None      # too few parallel tasks left (few output channels, prime row count)
        return chunk, rows

    def _schedule(self, sch, blocks, ci, info: ConvBlock, target, hv: HostVector):
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
        if self.subsample_strided:
            sub = _subsample_strided_pointwise(sch, conv, info, pro, (oh, ow))
            if sub is not None:
                pro, info = sub
        t = choose_conv_tiles(oc, ow, info.out_dtype, hv, _target(target))
        icb = hv.lanes(info.out_dtype)
        pad_blocks = [b for b in pro if _still_exists(sch, b)]
        plane = None
        if self.plane_chunks and self.channel_chunk == 0 and len(pad_blocks) <= 1:
            plane = self._plane_chunk(ic, (oc, oh, ow), sch, conv, info, t, _target(target), hv)
        if plane is not None or not (self.nchwc_min_ic != 0 and len(pad_blocks) == 1
                                     and self._wants_nchwc(sch, conv, info, ic, icb)):
            icb = None
        kw = extent_of(info.weight_buf.ty.shape[3])
        if plane is None and icb is None and self.channel_chunk == 0 and kw is not None and kw > 1:
            t = choose_conv_tiles(oc, ow, info.out_dtype, hv, _target(target), columns_first=True)
        for b in pro:
            if icb is None and _still_exists(sch, b) and _is_plain_copy(sch, b) and \
                    _SUBSAMPLE not in sch.get(b).annotations:
                ok(sch.compute_inline, b)     # a "pad" of zero width (1x1 convs): read the input directly
        rci = self._channel_chunk(ic, sch, conv, ow, _target(target), info) if icb is None else None
        rows = 1
        if plane is not None:
            rci, rows = plane
        blocks_of_rows, fits = None, None
        pads_left = [b for b in pro if _still_exists(sch, b)]
        if self.pad_in_task and icb is None and rci is None and len(pads_left) == 1 and oh is not None:
            fits = _padded_rows_fit(sch, pads_left[0], oh, info, _target(target))
            blocks_of_rows = self.row_blocks if self.row_blocks and oh % self.row_blocks == 0 \
                else _row_blocks(oh, hv.cores, fits)
        chosen = default = ConvChoice(t, blocks_of_rows)
        if self.tiles is not None:
            # a small plane's channel chunk and rows follow the register block, as the rule derives them
            replan = (lambda tiles: self._plane_chunk(ic, (oc, oh, ow), sch, conv, info, tiles,
                                                      _target(target), hv)) if plane is not None else None
            more = [] if blocks_of_rows is None else _row_block_choices(oh, hv.cores, fits)
            chosen = self.tiles(sch, default, lambda: conv_candidates(
                default, oc, ow, info.out_dtype, hv, _target(target),
                replan and (lambda tiles: replan(tiles) is not None), more))
            t, blocks_of_rows = chosen.tiles, chosen.row_blocks
            if replan is not None and chosen != default:
                rci, rows = replan(t)
        packed = False
        if self.prepack and oc % t.ocb == 0 and packable_param(sch, info.weight_buf) is not None:
            ocb = t.ocb
            mark_prepack(sch, conv, info.weight_read, lambda f, c, r, s: (f // ocb, c, r, s, f % ocb))
            packed = True
        epi = list(blocks[ci + 1:])
        out_shape = sch.get(conv).writes[0].source.ty.shape
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
            sch.transform_layout(pad, ("write", 0), lambda a, c, h, w: (a, c // icb, h, w, c % icb))
            pn, pc, ph, pw = sch.get_loops(pad)
            pco, pci = sch.split(pc, [None, icb])
            sch.reorder(pn, pco, ph, pw, pci)
            try_(sch.parallel, sch.fuse(pn, pco, ph))
            if not (self.transpose_input and transpose_load(sch, pad, icb)):
                try_(sch.vectorize, pci)      # one scalar load and insert per element
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
        if ok(sch.reverse_compute_at, last, epi_at):
            if self.transpose and epi_at is x0 and oc % t.vl == 0:
                transpose_store(sch, last, sch.get(conv).writes[0].source, t.owr, t.vl)
            _vectorize_inner(sch, last, lanes)
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
            sch.parallel(sch.fuse(n, f0, yy))
            for b in pro:
                if icb is None and _still_exists(sch, b):   # the padded input, once at the root: parallel
                    pl = sch.get_loops(b)
                    try_(sch.parallel, sch.fuse(*pl[:2]) if len(pl) > 2 else pl[0])
        init = sch.decompose_reduction(conv, red_outer)
        il = sch.get_loops(init)
        try_(sch.vectorize, il[-1])
        try_(sch.unroll, il[-2])
        try_(sch.unroll, il[-3])
        rows_note = f" row_blocks={blocks_of_rows}" if chosen.row_blocks != default.row_blocks else ""
        sch.annotate(conv, "ascendfuse.schedule", f"{'packed ' if packed else ''}{t}{rows_note}")
        return sch


def _subsample_strided_pointwise(sch, conv, info: ConvBlock, pro, out_hw):
    """A strided 1x1 conv reads every s-th pixel of its input: gather those pixels once into an NCHW buffer
    of the output's size (``reindex`` of the data read, the zero-width pad inlined into it), so the conv
    becomes a stride-1 pointwise conv on a plane s*s times smaller instead of re-laying out (or striding
    through) the whole input. Returns (prologue blocks, re-matched conv) or None when not applicable."""
    w_shape = [extent_of(d) for d in info.weight_buf.ty.shape]
    pads = [b for b in pro if _still_exists(sch, b)]
    d_shape = [extent_of(d) for d in sch.get(conv).reads[info.data_read].source.ty.shape]
    if w_shape[2:] != [1, 1] or len(pads) != 1 or None in d_shape or d_shape[2:] == list(out_hw):
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
    this host: the core's L2). W1 (64ch @58^2 padded): 2 blocks of 28 rows (445 KiB) instead of 4 of 14,
    one per core: 2 threads measured 1-3% faster (4 interleaved A/B runs); 3x3 64->64 @56^2 and the 7x7 s2
    stem (8 -> 2 blocks) within noise; one thread unchanged."""
    shape = [extent_of(d) for d in sch.get(pad).writes[0].source.ty.shape]
    kh = extent_of(info.weight_buf.ty.shape[2])
    if len(shape) != 4 or None in shape or kh is None:
        return None
    _, c, ph, pw = shape
    nbytes = tvm.DataType(str(sch.get(pad).writes[0].source.ty.dtype)).bits // 8
    return lambda rows: min(ph, -(-rows * ph // oh) + kh - 1) * c * pw * nbytes <= target.l1_bytes


def extent_of(dim) -> int | None:
    return int(dim) if isinstance(dim, tirx.IntImm) else None


def _still_exists(sch, block) -> bool:
    try:
        sch.get(block)
        return True
    except Exception:  # noqa: BLE001 - inlined
        return False


def _is_plain_copy(sch, block) -> bool:
    """A block that stores one load of another buffer unchanged (no padding select)."""
    body = sch.get(block).body
    return isinstance(body, tirx.BufferStore) and isinstance(_strip_cast(body.value), _LOAD)


def _target(target):
    from ..target import get_target

    return target if isinstance(target, AscendTarget) else get_target(target)
