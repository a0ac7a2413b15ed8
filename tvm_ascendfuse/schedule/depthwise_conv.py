"""DepthwiseConv2dRule: a depthwise conv2d (groups == channels, one input channel per output) + its epilogue.

Recognised from the blocks (``analysis.match_depthwise_conv2d``): the kernel's only reduction is
``C[n, f, y, x] += D[n, f + rc, y*s + ry*d, x*s + rx*d] * W[f, rc, ry, rx]`` with rc < 1, any kernel, stride,
dilation and padding; before it only injective blocks (the padding, a layout transpose), after it only
injective blocks that can run per output tile (folded-BN bias, ReLU / ReLU6 as clip or max+min, hardswish,
SiLU, a residual add, a transpose to channels-last). A global pool of the conv's output after it (the mean an
SE block takes of the output, ``plane_pool.py``) runs as its own loop nest after the conv; any other
reduction in the kernel is another rule's: the rule declines.

Why its own rule: every output channel reads its own input channel, so the conv2d schedule's register block
(output channels on the lanes, one broadcast input pixel per FMA) does not apply, and there is no reduction
over channels to amortise a re-layout. Here the channels are the vector lanes throughout (NCHW[vl]c inside
the kernel, the graph stays NCHW):

* a tile is vl channels x ``rows`` output rows (parallel over batch x channel blocks x row blocks); the
  padded input rows it reads (with the halo) are staged in ``local.UB`` as NCHW[vl]c, zero border first,
  then the in-bound pixels; the weights of the channel block are one (KH, KW, vl) tile, re-laid out once at
  compile time when they are constants (``layout.py``);
* the register block is ``owr`` output columns x vl channels: each tap is one FMA of a staged input vector
  by a weight vector (no broadcast, no gather), accumulated in registers over the KH x KW window;
* the epilogue runs per register block on the NCHW[vl]c values (a bias is one vector, an activation runs on
  full vectors, the block's columns unrolled so their activations interleave), into a UB tile that is stored
  to the NCHW output through register transposes
  (``transpose.transpose_to_nchw``); an epilogue whose output is channels-last (ConvNeXt's transpose) stores
  the vectors as they are.

Channel counts no full vector divides (ShuffleNetV2's 58/116/232, MobileNetV3's 72/120/200/184) run as full
vectors too: the last channel block starts at C - vl and recomputes part of the block before it
(``channel_overlap.py``, a rewrite of the kernel before tiling; not with an SE pool in the kernel, a
channels-last output or a symbolic batch, which keep the widest power-of-two vector dividing C).

Sizes come from the target: the staged input rows, the weight tile, the accumulator and the epilogue tile,
double-buffered, within usable UB (``choose_depthwise_tiles``).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, sym, tirx

from ..target import AscendTarget
from .analysis import LOAD, GroupedConvBlock, has_reduce, match_depthwise_conv2d
from .base import UB_SCOPE, Declined, ScheduleRule, Scheduled
from .common import new_schedule, as_target, extent, ok, root_blocks, still_exists, try_, vectorize_inner
from .fast_math import use_fast_math
from .border_fill import mark_border_fill, rewrite_border_fills
from .channel_overlap import OVERLAP_STORE_BLOCK, overlap_channel_blocks, overlapped_blocks, pack_overlap_weight
from .hostvec import HostVector, host_vector
from .layout import mark_prepack, packable_param
from .plane_pool import schedule_plane_pool, split_plane_pool
from .transpose import mark_transposed_stage, rewrite_transposed_stages, transpose_to_nchw

MAX_LANES = 16        # channels per block: one fp32 AVX-512 vector (fp16 keeps 16: the host converts to fp32)
MAX_COLUMNS = 8       # output columns per register block (the store transpose takes up to 8)
TASKS_PER_CORE = 4    # row blocks shrink until every core has this many tiles (border tiles cost more)


@dataclass(frozen=True)
class DepthwiseTiles:
    vl: int      # channels per block (vector lanes)
    rows: int    # output rows per tile
    owr: int     # output columns per register block

    def __str__(self):
        return f"{self.vl}ch x {self.rows}rows, register block {self.owr}cols"


def _lanes(channels: int, dtype: str, hv: HostVector) -> int:
    """The widest power of two within a host vector (and MAX_LANES) dividing the channel count."""
    cap = min(MAX_LANES, hv.lanes(dtype))
    vl = 1
    while vl * 2 <= cap and channels % (vl * 2) == 0:
        vl *= 2
    return vl


def _copy_columns(width: int | None) -> int | None:
    """Columns per input transpose: the largest divisor of the (unpadded) input width from 8 down to 2."""
    if width is None:
        return None
    return next((d for d in range(MAX_COLUMNS, 1, -1) if width % d == 0), None)


def _columns(ow: int) -> int:
    """Output columns per register block: 8 when they divide the width, else the largest divisor of the width
    from 8 down to 4 (7 for 7/14/28-wide planes), else 8 with a predicated tail."""
    if ow <= MAX_COLUMNS:
        return ow
    for d in range(MAX_COLUMNS, 3, -1):
        if ow % d == 0:
            return d
    return MAX_COLUMNS


def stage_bytes(rows: int, info: GroupedConvBlock, padded_w: int, vl: int, owr: int, nbytes: int,
                target: AscendTarget) -> int:
    """UB bytes of one tile: the staged input rows (halo included), the weight tile, the accumulator and the
    epilogue tile of one register block; doubled when the target double-buffers."""
    (kh, kw), (sh, _), (dh, _) = info.kernel, info.stride, info.dilation
    in_rows = (rows - 1) * sh + (kh - 1) * dh + 1
    parts = [in_rows * padded_w * vl, kh * kw * vl, owr * vl, owr * vl]
    copies = 2 if target.double_buffer else 1
    return copies * sum(target.align_up(p * nbytes) for p in parts)


def choose_depthwise_tiles(channels: int, oh: int, ow: int, padded_w: int, batch: int | None,
                           info: GroupedConvBlock, hv: HostVector, target: AscendTarget) -> DepthwiseTiles | None:
    """Channels per block from the host vector; output rows per tile: the most (dividing OH) whose tile fits
    usable UB, fewer while the cores would get under TASKS_PER_CORE tiles each. None when not even one row
    fits."""
    vl = _lanes(channels, info.out_dtype, hv)
    owr = _columns(ow)
    nbytes = target.element_bytes(info.out_dtype)
    fits = [r for r in range(oh, 0, -1) if oh % r == 0
            and stage_bytes(r, info, padded_w, vl, owr, nbytes, target) <= target.ub_usable]
    if not fits:
        return None
    want = max(1, hv.cores) * TASKS_PER_CORE
    blocks = (batch or 1) * (channels // vl)
    rows = next((r for r in fits if blocks * (oh // r) >= want), fits[-1])
    return DepthwiseTiles(vl, rows, owr)


MAX_CANDIDATES = 12


def depthwise_candidates(default: DepthwiseTiles, channels: int, oh: int, ow: int, padded_w: int,
                         batch: int | None, info: GroupedConvBlock, target: AscendTarget,
                         cores: int) -> list[DepthwiseTiles]:
    """Tiles a tuner may try: the default first, then output rows per tile (dividing OH, at least a tile per
    core) x output columns per register block (dividing OW, at most MAX_COLUMNS) whose tile passes the rule's
    UB check (``stage_bytes``); changes of one of the two first (at most MAX_CANDIDATES in all)."""
    nbytes = target.element_bytes(info.out_dtype)
    blocks = (batch or 1) * (channels // default.vl)
    rows = [r for r in range(1, oh + 1) if oh % r == 0 and blocks * (oh // r) >= min(cores, blocks * oh)]
    cols = sorted({d for d in range(2, min(ow, MAX_COLUMNS) + 1) if ow % d == 0} | {default.owr})
    fits = [DepthwiseTiles(default.vl, r, c) for r in rows for c in cols
            if stage_bytes(r, info, padded_w, default.vl, c, nbytes, target) <= target.ub_usable]
    changes = lambda t: (t.rows != default.rows) + (t.owr != default.owr)  # noqa: E731
    others = sorted((t for t in fits if t != default), key=lambda t: (changes(t), t.rows, t.owr))
    return [default, *others[:MAX_CANDIDATES - 1]]


class DepthwiseConv2dRule(ScheduleRule):
    """Depthwise conv2d + epilogue, channels on the vector lanes (see module docstring).

    Tunable: rows per tile and columns per register block are a sampled decision (``depthwise_candidates``).
    The register-transposed input copy is a rewrite of the scheduled function, which no trace records: under
    a tuner the schedule leaves the copy marked (``transpose.mark_transposed_stage``) and the rewrite is made
    where a traced schedule becomes a kernel (``tuned.finish_traced``: the measured build and the applied
    record)."""

    name = "depthwise-conv2d"
    tunable = True

    def __init__(self, transpose_store: bool = True, transpose_load: bool = True, prepack: bool = True,
                 tiles=None, unroll_epilogue: bool = True, overlap: bool = True, border_fill: bool = True):
        self.overlap = overlap
        self.border_fill = border_fill
        self.unroll_epilogue = unroll_epilogue
        self.transpose_store = transpose_store
        self.transpose_load = transpose_load
        self.prepack = prepack
        self.tiles = tiles

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | Declined | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        return self.schedule(new_schedule(tvm.IRModule({"main": use_fast_math(func)})), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> Scheduled | Declined | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        blocks = list(root_blocks(sch))
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        found = [i for i in reductions if match_depthwise_conv2d(sch, blocks[i]) is not None]
        if not found:
            return None
        ci = found[0]
        ri, why = split_plane_pool(sch, blocks, ci)
        if why is not None:
            return Declined(f"the depthwise conv shares the kernel with {why}: only injective ops, or one "
                            "global pool of its output, may surround it")
        hv = host_vector(host)
        pool_note = None
        if ri is not None:
            # an SE block's pool of the conv's output: its own loop nest after the conv part
            pool_note = schedule_plane_pool(sch, blocks[ri:], hv.lanes(match_depthwise_conv2d(
                sch, blocks[ci]).out_dtype))
            blocks = blocks[:ri]
        result = self._schedule(sch, blocks, ci, match_depthwise_conv2d(sch, blocks[ci]), as_target(target), hv,
                                overlap=self.overlap and ri is None)
        if isinstance(result, Scheduled) and pool_note:
            return Scheduled(result.sch, f"{result.note}, {pool_note}")
        return result

    def _schedule(self, sch, blocks, ci, info: GroupedConvBlock, target, hv: HostVector, overlap: bool = False):
        conv = info.block
        stage = _prologue(sch, blocks[:ci], conv, info)
        if stage is None:
            return Declined("the conv's input is not a block of the kernel, or a block in front of it cannot be "
                            "inlined into the staged input rows")
        epilogue = _epilogue(sch, blocks[ci + 1:], conv)
        if epilogue is None:
            return Declined("an epilogue block cannot run per output tile (it changes the shape, selects by "
                            "index like a concat, or is an intermediate the kernel also outputs)")
        layout = _output_layout(sch, epilogue[-1], sch.get(conv).writes[0].source)
        store, overlap_note = None, ""
        if overlap and layout == "nchw" and self.tiles is None:
            # (not under a tuner: the rewrite makes a new schedule, which a trace cannot record)
            channels = extent(sch, sch.get_loops(conv)[1])
            moved = _overlap_blocks(sch, stage, conv, epilogue[-1], info, hv)
            if moved is not None:
                sch, stage, conv, last, store, info = moved
                epilogue = [last]
                overlap_note = f", {channels} channels as overlapping full-vector blocks"
        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        channels, oh, ow = extent(sch, f), extent(sch, y), extent(sch, x)
        padded = [extent_of(d) for d in sch.get(stage).writes[0].source.ty.shape]
        if None in (channels, oh, ow) or None in padded[1:]:
            return Declined("symbolic channels or plane size (only the batch may be symbolic)")
        t = choose_depthwise_tiles(channels, oh, ow, padded[3], extent(sch, n), info, hv, target)
        if t is None:
            one = stage_bytes(1, info, padded[3], _lanes(channels, info.out_dtype, hv), _columns(ow),
                              target.element_bytes(info.out_dtype), target)
            return Declined(f"the tile of one output row needs {one} B of UB, usable {target.ub_usable} B")
        t = self.choose(sch, t, lambda: depthwise_candidates(t, channels, oh, ow, padded[3], extent(sch, n), info,
                                                             target, hv.cores))
        vl = t.vl
        f0, f1 = sch.split(f, [None, vl])
        y0, y1 = sch.split(y, [None, t.rows])
        x0, x1 = sch.split(x, [None, t.owr])
        sch.reorder(n, f0, y0, y1, x0, rc, ry, rx, x1, f1)
        # the accumulator: one register block (owr x vl) in NCHW[vl]c
        sch.transform_layout(conv, ("write", 0), lambda a, c, h, w: (a, c // vl, h, w, c % vl))
        sch.set_scope(conv, 0, "local")
        # the tile's loops (n, f0, y0) are fused into the parallel loop only after the staged rows' padding is
        # decomposed: with one row a tile and several batch x channel blocks, the staged row index under the
        # fused loop is ``fused % OH + ry``, which TVM's iter-map analysis (decompose_padding) cannot normalise;
        # the stage would keep its per-element padding select, be copied lane by lane instead of through the
        # register transposes, and get no border-only fill
        # weights: (C/vl, 1, KH, KW, vl)
        packed = False
        if store is not None:
            packed = True       # the slot-indexed weight copy is laid out (C/vl, 1, KH, KW, vl) already
        elif self.prepack and packable_param(sch, info.weight_buf) is not None:
            mark_prepack(sch, conv, info.weight_read, lambda c, r, h, w: (c // vl, r, h, w, c % vl))
            packed = True
        else:
            wt = sch.cache_read(conv, info.weight_read, UB_SCOPE)
            sch.transform_layout(wt, ("write", 0), lambda c, r, h, w: (c // vl, r, h, w, c % vl))
            sch.compute_at(wt, y0, preserve_unit_loops=True)
            wc, wh, ww = sch.get_loops(wt)[-3:]
            sch.reorder(wh, ww, wc)
            try_(sch.vectorize, wc)
        # input rows of the tile, padded, NCHW[vl]c in UB: zero border, then the in-bound pixels
        sch.transform_layout(stage, ("write", 0), lambda a, c, h, w: (a, c // vl, h, w, c % vl))
        sch.set_scope(stage, 0, UB_SCOPE)
        sch.compute_at(stage, y0, preserve_unit_loops=True)
        sc, sh, sw = sch.get_loops(stage)[-3:]
        sch.reorder(sh, sw, sc)
        box = _in_bound_box(sch.get(stage))
        fill = try_(sch.decompose_padding, stage, sh)
        if fill is not None:
            try_(sch.vectorize, sch.get_loops(fill)[-1])
            if self.border_fill and box is not None:
                mark_border_fill(sch, fill, box)
        cols = _copy_columns(extent(sch, sch.get_loops(stage)[-2]))
        transposed = self.transpose_load and fill is not None and cols is not None \
            and mark_transposed_stage(sch, stage, vl, cols)
        if not transposed:
            try_(sch.vectorize, sch.get_loops(stage)[-1])     # one lane-strided load per element
        tile = sch.fuse(n, f0, y0)
        # epilogue per register block
        how = self._epilogue_at(sch, epilogue[-1], layout, x0, vl, store)
        sch.vectorize(f1)
        try_(sch.unroll, x1)
        try_(sch.unroll, rx)
        try_(sch.unroll, ry)
        sch.parallel(tile)
        init = sch.decompose_reduction(conv, rc)
        il = sch.get_loops(init)
        try_(sch.vectorize, il[-1])
        try_(sch.unroll, il[-2])
        note = f"depthwise-conv2d: {'packed ' if packed else ''}{t}{overlap_note}, {how}"
        sch.annotate(conv, "ascendfuse.schedule", note)
        if self.tiles is None:
            # the rewrites no trace records (under a tuner: tuned.finish_traced makes them)
            func, rewritten = rewrite_transposed_stages(sch.mod["main"]) if transposed else (sch.mod["main"], 0)
            if rewritten:
                note += ", input staged through register transposes"
            func, bordered = rewrite_border_fills(func)
            if rewritten or bordered:
                sch = new_schedule(tvm.IRModule({"main": func}))
        return Scheduled(sch, note)

    def _epilogue_at(self, sch, last, layout, x0, vl, store=None) -> str:
        """Place the epilogue per register block; returns how its output is stored. ``store``: the copy of
        overlapping channel blocks to the output (``channel_overlap``), which takes the place of the
        epilogue's cache write."""
        if layout == "nchw" and vl > 1:
            # epilogue on NCHW[vl]c vectors into a UB tile, stored to NCHW through register transposes
            if store is not None:
                out = store
                sch.set_scope(last, 0, UB_SCOPE)
            else:
                out = sch.cache_write(last, 0, UB_SCOPE)
            sch.transform_layout(last, ("write", 0), lambda a, c, h, w: (a, c // vl, h, w, c % vl))
            sch.reverse_compute_at(last, x0)
            sch.reverse_compute_at(out, x0)
            lc, lx = sch.get_loops(last)[-2:]
            sch.reorder(lx, lc)
            try_(sch.vectorize, lc)
            # the register block's columns unrolled: each column's activation (SiLU's exp polynomial and
            # divide, a clip) is a chain of dependent vector ops; side by side the owr chains overlap
            if self.unroll_epilogue:
                try_(sch.unroll, lx)
            if self.transpose_store and transpose_to_nchw(sch, out, vl):
                return "NCHW store through register transposes"
            vectorize_inner(sch, out, vl)
            return "NCHW store lane by lane"
        sch.reverse_compute_at(last, x0)
        vectorize_inner(sch, last, vl)
        return "channels-last store" if layout == "nhwc" else "store as the epilogue indexes"


def _overlap_blocks(sch, stage, conv, last, info: GroupedConvBlock, hv: HostVector):
    """The kernel rewritten to run overlapping full-vector channel blocks (``channel_overlap``) when the
    channel count is no multiple of the host's full vector: (schedule, stage, conv, last epilogue block,
    output store block, conv info) of the rewritten kernel, or None to keep it as it is."""
    lanes = min(MAX_LANES, hv.lanes(info.out_dtype))
    channels = extent(sch, sch.get_loops(conv)[1])
    if channels is None or overlapped_blocks(channels, lanes) is None:
        return None
    names = [sch.get(b).name_hint for b in (stage, conv, last)]
    func = sch.mod["main"]
    new = overlap_channel_blocks(func, *names, info.weight_buf, lanes)
    if new is None:
        return None
    sch = new_schedule(tvm.IRModule({"main": new}))
    stage, conv, last = (sch.get_sblock(n) for n in names)
    weight = info.weight_buf
    info = match_depthwise_conv2d(sch, conv)
    if info is None:
        return None
    pack_overlap_weight(sch, new, weight, lanes)
    return sch, stage, conv, last, sch.get_sblock(OVERLAP_STORE_BLOCK), info


def _in_bound_box(stage) -> tuple | None:
    """(first row, end row, first column, end column) of the staged (padded) rows the input fills, from the
    padding block's ``if_then_else(lo <= h < hi and lo <= w < hi, X[...], 0)``; None in any other form."""
    store = stage.body
    value = store.value if isinstance(store, tirx.BufferStore) else None
    if not (isinstance(value, tvm.ir.expr.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "prim.if_then_else") or len(stage.iter_vars) != 4:
        return None
    h, w = stage.iter_vars[2].var, stage.iter_vars[3].var
    ext = [stage.iter_vars[2].dom.extent, stage.iter_vars[3].dom.extent]
    if not all(isinstance(e, tirx.IntImm) for e in ext):
        return None
    bounds = {"h": [0, int(ext[0])], "w": [0, int(ext[1])]}
    terms, todo = [], [value.args[0]]
    while todo:
        t = todo.pop()
        if isinstance(t, tirx.And):
            todo += [t.a, t.b]
        else:
            terms.append(t)
    for t in terms:
        if not isinstance(t, (tirx.LT, tirx.LE)):
            return None
        for var, key in ((h, "h"), (w, "w")):
            if t.b.same_as(var) and isinstance(t.a, tirx.IntImm):        # lo <= v (or lo < v)
                bounds[key][0] = int(t.a) + (1 if isinstance(t, tirx.LT) else 0)
                break
            if t.a.same_as(var) and isinstance(t.b, tirx.IntImm):        # v < hi (or v <= hi)
                bounds[key][1] = int(t.b) + (1 if isinstance(t, tirx.LE) else 0)
                break
        else:
            return None
    return (*bounds["h"], *bounds["w"])


def extent_of(dim) -> int | None:
    return int(dim) if isinstance(dim, tirx.IntImm) else None


def _prologue(sch, pro, conv, info: GroupedConvBlock):
    """The block the conv reads (the padding), everything in front of it inlined into it; None when the conv
    reads no block of the kernel or a prologue block cannot be inlined (read elsewhere, an output)."""
    data = sch.get(conv).reads[info.data_read].source
    stage = next((b for b in pro if sch.get(b).writes[0].source.same_as(data)), None)
    if stage is None:
        return None
    for b in pro:
        if not sch.get(b).same_as(sch.get(stage)) and not ok(sch.compute_inline, b):
            return None
    return stage


def _epilogue(sch, epi, conv):
    """The epilogue blocks with all but the last inlined into it, or None when one cannot run per output
    tile (a concat, a shape change) or stay out of the last block (an intermediate the kernel also
    outputs). An empty epilogue gets a copy (the conv's result reaches GM through it)."""
    out_shape = sch.get(conv).writes[0].source.ty.shape
    if not all(_writes_as_many(sch, b, out_shape) and not _selects_by_iterator(sch, b) for b in epi):
        return None
    if not epi:
        return [sch.cache_write(conv, 0, "global")]
    *inner, last = epi
    for b in inner:
        if not ok(sch.compute_inline, b):
            return None
    return [last] if still_exists(sch, last) else None


def _writes_as_many(sch, block, shape) -> bool:
    """``common.writes_as_many`` that also proves it for a symbolic batch: the element counts are equal
    expressions."""
    def count(dims):
        n = tirx.IntImm("int64", 1)
        for d in dims:
            n = n * (d if str(d.ty.dtype) == "int64" else tirx.Cast("int64", d))
        return n

    ana = sym.Analyzer()
    want = count(shape)
    return all(ana.can_prove_equal(count(w.source.ty.shape), want) for w in sch.get(block).writes)


def _selects_by_iterator(sch, block) -> bool:
    """Does the block choose between values by one of its own iterators (a concatenate)? Such a block reads a
    tile only in one branch and must not be placed per tile. Conditions on values (ReLU as a select, the
    fast-math exp's underflow test on a let-bound value) are fine: they name no iterator directly."""
    stmt = sch.get(block)
    iters = {iv.var.name for iv in stmt.iter_vars}
    found = []

    def by_iterator(cond) -> bool:
        names, loads = [], []
        tvm_ffi.structural_walk(cond, [(LOAD, loads.append), (tvm.ir.Var, lambda v: names.append(v.name))])
        return not loads and bool(iters & set(names))

    def on_call(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "prim.if_then_else" and by_iterator(call.args[0]):
            found.append(call)

    def on_select(sel):
        if by_iterator(sel.condition):
            found.append(sel)

    tvm_ffi.structural_walk(stmt.body, [(tvm.ir.expr.Call, on_call), (tvm.ir.prim.expr.Select, on_select)])
    return bool(found)


def _output_layout(sch, last, acc) -> str:
    """``nchw`` when the last epilogue block writes the conv's element (n, c, y, x) at the same indices,
    ``nhwc`` when it writes it with the channel last, else ``other`` (read before any re-layout)."""
    store = sch.get(last).body
    if not isinstance(store, tirx.BufferStore):
        return "other"
    loads = []
    tvm_ffi.structural_walk(store.value, (LOAD, lambda ld: loads.append(ld) if ld.source.same_as(acc) else None))
    if not loads or len(loads[0].indices) != 4 or len(store.indices) != 4:
        return "other"
    src, dst = list(loads[0].indices), list(store.indices)
    same = lambda a, b: isinstance(a, tirx.Var) and isinstance(b, tirx.Var) and a.same_as(b)  # noqa: E731
    if all(same(a, b) for a, b in zip(src, dst)):
        return "nchw"
    if same(src[0], dst[0]) and same(src[1], dst[3]) and same(src[2], dst[1]) and same(src[3], dst[2]):
        return "nhwc"
    return "other"
