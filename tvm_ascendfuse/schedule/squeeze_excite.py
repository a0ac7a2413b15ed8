"""SqueezeExciteRule: squeeze-and-excitation as one kernel (the ``ascendfuse.squeeze_excite.*`` patterns).

Recognised from the blocks: three reduction blocks, in order a sum over both (static) spatial axes of an NCHW
tensor into (N, C, 1, 1) (the squeeze; a divide follows it; N and C may be symbolic) and two product blocks (the
excitation FCs: 1x1 convs on the pooled (N, C, 1, 1) tensor or matmuls on (N, C) rows), everything else
injective (bias, activation, gate, layout). What the kernel writes is the gate, (N, C[, 1, 1]).

Schedule: cheap injective blocks (copies, divides, adds, clips) are inlined into their consumer, blocks with
transcendental calls (sigmoid, exp) stay their own small loops so they are evaluated once per element; the
squeeze sums each channel's plane as vector partial sums (``rfactor`` over lanes of the flattened H*W),
parallel over channels when the plane is large; each FC keeps its output channels innermost in vector lanes
with the reduction outside them (one broadcast input value times a vector of weights per step), its
constant weight re-laid out once at compile time so the output channels are contiguous; an FC whose weight
has ``FC_PARALLEL_MIN_BYTES`` or more (MobileNetV3's 960 x 240) runs its blocks of output channels on every
core (it streams its weight once per call: one core's bandwidth bounds it). The pooled vector,
the hidden vector and the FC accumulators are a few KiB, staged in ``local.UB``.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import LOAD, has_reduce, is_cheap, is_contraction, strip_cast, uses_var
from .base import UB_SCOPE, ScheduleRule
from .common import new_schedule, buffer_bytes, extent, on_chip_bytes, ok, root_blocks, try_, vector_lanes, vector_width_for
from .layout import mark_prepack, packable_param
from .partial_sums import partial_sum_width, vectorize_rf

# Planes below this many elements per call are summed on one core (a fork/join costs more than the sum).
PARALLEL_MIN_ELEMENTS = 32768
# an FC whose weight has at least this many bytes runs its blocks of output channels on every core
FC_PARALLEL_MIN_BYTES = 1 << 17


class SqueezeExciteRule(ScheduleRule):
    """Spatial mean -> FC -> act -> FC -> gate in one kernel (see the module docstring)."""

    name = "squeeze-excite"
    min_products = 2

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(tvm.IRModule({"main": func}))
        blocks = list(root_blocks(sch))
        reductions = [b for b in blocks if has_reduce(sch, b)]
        if len(reductions) != 3:
            return None
        squeeze, fc1, fc2 = reductions
        plane = _plane_sum(sch, squeeze)
        if plane is None:
            return None
        if not (is_contraction(sch, fc1) and is_contraction(sch, fc2)):
            return None
        lanes = vector_lanes(host, buffer_bytes(sch.get(squeeze).writes[0].source) * 8)
        self._inline_cheap(sch, [b for b in blocks if b not in reductions])
        kept = [b for b in root_blocks(sch) if not has_reduce(sch, b)]
        rf = self._squeeze(sch, squeeze, lanes)
        self._stage(sch, (fc1, fc2), target)      # first: _fc may partition an FC into two blocks
        for fc in (fc1, fc2):
            self._fc(sch, fc, lanes)
        for b in kept:
            self._elementwise(sch, b, lanes)
        sch.annotate(squeeze, "ascendfuse.schedule",
                     f"squeeze-excite plane {plane[0]}x{plane[1]} partial sums {rf}")
        return sch

    @staticmethod
    def _inline_cheap(sch, blocks) -> None:
        """Copies and plain arithmetic go into their consumer; calls (sigmoid, exp) stay materialised,
        evaluated once per element instead of once per use inside an FC's loops."""
        for b in blocks:
            if is_cheap(sch, b) and not ok(sch.compute_inline, b):
                ok(sch.reverse_compute_inline, b)     # a layout op writing the output (the gate reshaped)

    @staticmethod
    def _squeeze(sch, block, lanes: int) -> int:
        """The plane sum: flattened H*W split into vector partial sums; parallel over (N, C) when large.
        Returns the partial-sum width (1: scalar)."""
        n, c, *spatial, kh, kw = sch.get_loops(block)
        hw = (extent(sch, kh) or 0) * (extent(sch, kw) or 0)
        k = sch.fuse(kh, kw)
        v = partial_sum_width(hw, lanes) if hw else 1
        rf = None
        if v >= 4 and hw >= 2 * v:
            _, ki = sch.split(k, [None, v])
            rf = try_(sch.rfactor, ki, len(sch.get(block).writes[0].source.ty.shape))   # lanes appended
        target = rf if rf is not None else block
        outer = sch.get_loops(target)
        rows = extent(sch, outer[0]), extent(sch, outer[1])
        big = None not in rows and rows[0] * rows[1] * hw >= PARALLEL_MIN_ELEMENTS
        lead = sch.fuse(outer[0], outer[1])
        if rf is not None:
            vectorize_rf(sch, rf)
        if big:
            try_(sch.parallel, lead)
        return v if rf is not None else 1

    @staticmethod
    def _fc(sch, block, lanes: int) -> None:
        """Output channels innermost in vector lanes, the reduction outside them; a constant weight
        re-laid out (reduction axis first) so those channels are contiguous. A channel count no full
        vector divides (RegNet's 196 hidden channels) runs as full vectors plus one shorter vector for the
        remainder (``loop_partition``): a split by the full width guards every lane with the channel
        bound, and TVM then scalarises the whole FC."""
        stmt = sch.get(block)
        loops = sch.get_loops(block)
        kinds = [iv.iter_type for iv in stmt.iter_vars]
        if len(loops) != len(kinds):
            return
        wide = [i for i, (lp, k) in enumerate(zip(loops, kinds))
                if k == tirx.IterVar.DataPar and extent(sch, lp) != 1]
        rwide = [lp for lp, k in zip(loops, kinds) if k != tirx.IterVar.DataPar and extent(sch, lp) != 1]
        if not wide or len(rwide) != 1:
            return
        at = wide[-1]
        _relayout_weight(sch, block, loops[at])
        ch, k = extent(sch, loops[at]), extent(sch, rwide[0])
        nbytes = buffer_bytes(sch.get(block).writes[0].source)
        par = None not in (ch, k) and ch * k * nbytes >= FC_PARALLEL_MIN_BYTES
        if ch is None or ch <= lanes or ch % lanes == 0:
            _fc_part(sch, block, at, min(lanes, ch) if ch is not None else lanes, par)
            return
        main = ch // lanes * lanes
        parts = try_(sch.loop_partition, loops[at], [main, None])
        if parts is None:
            _fc_part(sch, block, at, lanes, par)
            return
        _fc_part(sch, sch.get_child_blocks(parts[0])[0], at, lanes, par)
        _fc_part(sch, sch.get_child_blocks(parts[1])[0], at, ch - main)

    @staticmethod
    def _elementwise(sch, block, lanes: int) -> None:
        loops = sch.get_loops(block)
        if not loops:
            return
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        ext = extent(sch, fused)
        v = vector_width_for(ext, lanes) if ext is not None else 1
        if v > 1:
            _, vi = sch.split(fused, [None, v])
            try_(sch.vectorize, vi)

    @staticmethod
    def _stage(sch, fcs, target) -> None:
        """The FC accumulators in UB when their size is static and small (a few KiB)."""
        for blk in fcs:
            buf = sch.get(blk).writes[0].source
            shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in buf.ty.shape]
            if None in shape or math.prod(shape) * on_chip_bytes(buf, target) > target.ub_usable // 4:
                continue
            if not any(p.same_as(buf) for p in sch.mod["main"].params):
                try_(sch.set_scope, blk, 0, UB_SCOPE)


def _fc_part(sch, block, at: int, v: int, parallel: bool = False) -> None:
    """One FC block's loops: the loop of its output-channel iterator (index ``at``) split by ``v`` with the
    vector innermost and the reduction loops outside it. Loops are told apart by the iterators their
    variables bind (after ``loop_partition`` the part's loops start below a wrapping block). Vectorised
    before the init is split off: the update block alone is neither complete nor a reduction (no init), so
    vectorize's dataflow check refuses it after."""
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return
    ivs, values = realize.block.iter_vars, realize.iter_values

    def binds(lp, pick):
        var = sch.get(lp).loop_var
        return any(pick(i, iv) and uses_var(val, var) for i, (iv, val) in enumerate(zip(ivs, values)))

    ch = [lp for lp in loops if binds(lp, lambda i, _: i == at)]
    reduce = [lp for lp in loops if binds(lp, lambda _, iv: iv.iter_type != tirx.IterVar.DataPar)]
    if len(ch) != 1 or not reduce:
        return
    others = [lp for lp in loops if not lp.same_as(ch[0]) and not any(lp.same_as(r) for r in reduce)]
    if extent(sch, ch[0]) == v:      # the remainder of a partition (its loop starts at the cut: no split)
        fi = ch[0]
        sch.reorder(*others, *reduce, fi)
    else:
        fo, fi = sch.split(ch[0], [None, v])
        sch.reorder(*others, fo, *reduce, fi)
        if parallel:
            try_(sch.parallel, fo)
    if v > 1:
        try_(sch.vectorize, fi)
    rwide = [lp for lp in reduce if extent(sch, lp) != 1] or reduce
    init = try_(sch.decompose_reduction, block, rwide[0])
    if init is not None and v > 1:
        try_(sch.vectorize, sch.get_loops(init)[-1])


def _plane_sum(sch, block) -> tuple[int, int] | None:
    """(H, W) when ``block`` is ``S[n, c, 0, 0] += X[n, c, rh, rw]`` over whole static planes (N and C may be
    symbolic), else None."""
    stmt = sch.get(block)
    body = stmt.body
    if stmt.init is None or not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return None
    out = body.buffer.ty.shape
    if len(out) != 4 or not all(isinstance(d, tirx.IntImm) and int(d) == 1 for d in out[2:]):
        return None
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if kinds != [tirx.IterVar.DataPar] * 4 + [tirx.IterVar.CommReduce] * 2 or len(stmt.reads) != 1:
        return None
    n, c, _, _, rh, rw = (iv.var for iv in stmt.iter_vars)
    val = body.value
    load = val.b if isinstance(val.a, LOAD) and val.a.source.same_as(body.buffer) else val.a
    load = strip_cast(load)
    if not isinstance(load, LOAD) or len(load.indices) != 4:
        return None
    want = (n, c, rh, rw)
    if not all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(load.indices, want)):
        return None
    h, w = load.source.ty.shape[2:]
    if not (isinstance(h, tirx.IntImm) and isinstance(w, tirx.IntImm)):
        return None
    return int(h), int(w)


def _relayout_weight(sch, block, out_ch) -> None:
    """Re-lay a constant weight out so that the output-channel axis is its last (contiguous) one."""
    stmt = sch.get(block)
    ch_var = None
    realize_loops = sch.get_loops(block)
    for lp, iv in zip(realize_loops, stmt.iter_vars):
        if lp.same_as(out_ch):
            ch_var = iv.var
    if ch_var is None:
        return
    for i, region in enumerate(stmt.reads):
        buf = region.source
        if packable_param(sch, buf) is None:
            continue
        axes = [j for j, r in enumerate(region.region) if _uses(r.min, ch_var)]
        if len(axes) != 1 or axes[0] == len(region.region) - 1:
            return     # already contiguous along the channels (a matmul's (K, N) weight)
        axis = axes[0]
        rank = len(region.region)
        order = [j for j in range(rank) if j != axis] + [axis]
        mark_prepack(sch, block, i, lambda *idx: tuple(idx[j] for j in order))
        return


def _uses(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)
