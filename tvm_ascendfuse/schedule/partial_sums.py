"""Row reductions inside a bigger kernel: sums and maxima as vector partial sums, and the row norm staged in
front of a kernel's products.

A row reduction is vectorised by ``rfactor``: the row is split into ``lanes``-wide chunks, a partial-sum block
accumulates one vector per row over the chunks, a short final reduction sums the lanes. rfactor needs the
reduction to head its loop nest, so it runs at the root, before any compute_at; the partial-sum block is
vectorised once it sits where it runs.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from .analysis import block_name, has_reduce
from .common import extent, get_realize, ok, root_blocks, try_, vector_width_for


# the widest partial sums a narrow host gets (lanes in up to two of its registers)
MIN_WIDEST = 8


def partial_sum_width(ext: int | None, lanes: int) -> int:
    """Lanes of the partial sums of a whole-plane row of ``ext`` elements: the widest divisor of ``ext`` from
    ``lanes`` down to 4 that leaves at least two chunks, else 1 (scalar). Each lane is a chain of adds that
    waits for its previous one, so wider partial sums are shorter chains: 7x7 planes (49 pixels) take 7
    lanes instead of one scalar chain, 14x14 planes (196) 14 instead of 4. A symbolic row takes ``lanes``
    (its tail is predicated). On a 4-lane (SSE) host up to 8 lanes (two registers): with 4 alone a 7x7 plane
    would be one scalar chain. A row none of those divides takes the widest divisor within two of the host's
    registers rather than one scalar chain: a 13x13 plane (169) sums 13 lanes on AVX2, where nothing from 8
    down to 4 divides it (measured on a 2-core Zen 3, one thread: the sums of squares of 8 x 256 planes took
    68 us against 355 us as scalar chains)."""
    if ext is None:
        return lanes
    widest = max(lanes, MIN_WIDEST)
    divisors = [d for d in range(4, min(max(widest, 2 * lanes), ext // 2) + 1) if ext % d == 0]
    return max((d for d in divisors if d <= widest), default=max(divisors, default=1))


def lane_partials(sch, names, lanes: int) -> set:
    """Each row reduction among the blocks ``names`` split into vector-wide partial sums (rfactor, at the root,
    before anything moves: it needs the reduction to head its loop nest) plus a short final sum; returns the
    names of the partial-sum blocks. Rows shorter than two vectors of at least 4 lanes stay scalar."""
    out = set()
    for n in names:
        blk = try_(sch.get_sblock, n)
        if blk is None or not has_reduce(sch, blk):
            continue
        loops = sch.get_loops(blk)
        ext = extent(sch, loops[-1])
        v = vector_width_for(ext, lanes)
        if ext is None or v < 4 or ext < 2 * v:
            continue
        _, ki = sch.split(loops[-1], [None, v])
        rf = try_(sch.rfactor, ki, len(sch.get(blk).iter_vars) - 1)
        if rf is not None:
            out.add(block_name(sch, rf))
    return out


def vector_partial_sums(sch, block, lanes: int):
    """Row sums as ``lanes`` vector partial sums (rfactor, before any compute_at: it needs the reduction
    loop outermost in its block) plus a short final sum; None when the block is not such a reduction."""
    if not has_reduce(sch, block):
        return None
    loops = sch.get_loops(block)
    ext = extent(sch, loops[-1]) if loops else None
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if ext is None or ext % lanes or ext <= lanes or kinds[-1] == tirx.IterVar.DataPar or kinds.count(
            tirx.IterVar.CommReduce) != 1:
        return None
    try:
        _, ki = sch.split(loops[-1], [None, lanes])
        return sch.rfactor(ki, len(sch.get(block).iter_vars) - 1)
    except s_tir.ScheduleError:     # not an rfactor-able reduction: keep it scalar
        return None


def vectorize_rf(sch, rf) -> None:
    """A partial-sum block (rfactor): its lane axis innermost and vectorised, its init split off
    (decompose_reduction last). The lane loop is vectorised even when the reorder was refused; see
    ``vectorize_partial_sums`` for the form that then leaves it alone."""
    realize = get_realize(sch, rf)
    loops = sch.get_loops(rf)
    by_var = {sch.get(l).loop_var.name: l for l in loops}
    lane = red = None
    for iv, val in zip(realize.block.iter_vars, realize.iter_values):
        if not isinstance(val, tirx.Var) or val.name not in by_var:
            continue
        if iv.iter_type == tirx.IterVar.CommReduce and red is None:
            red = by_var[val.name]
        elif iv.iter_type == tirx.IterVar.DataPar and lane is None:
            lane = by_var[val.name]
    if lane is None or red is None:
        return
    ok(sch.reorder, red, lane)
    if not ok(sch.vectorize, lane):
        return
    init = try_(sch.decompose_reduction, rf, red)
    if init is not None:
        ok(sch.vectorize, sch.get_loops(init)[-1])


def vectorize_partial_sums(sch, rf) -> None:
    """A partial-sum block (rfactor) under the row loop: its lane axis innermost and vectorised, the
    reduction over the row's chunks outside it, its init split off; nothing when the lane loop cannot be moved
    inside the reduction loop."""
    realize = get_realize(sch, rf)
    by_var = {sch.get(l).loop_var.name: l for l in sch.get_loops(rf)}
    lane = red = None
    for iv, val in zip(realize.block.iter_vars, realize.iter_values):
        if isinstance(val, tirx.Var) and val.name in by_var:
            if iv.iter_type == tirx.IterVar.CommReduce and red is None:
                red = by_var[val.name]
            elif iv.iter_type == tirx.IterVar.DataPar and lane is None:
                lane = by_var[val.name]
    if lane is None or red is None or not ok(sch.reorder, red, lane) or not ok(sch.vectorize, lane):
        return
    init = try_(sch.decompose_reduction, rf, red)
    if init is not None:
        ok(sch.vectorize, sch.get_loops(init)[-1])


def stage_norm_prologue(sch, norm, lanes):
    """Shape the norm prologue (``analysis.match_norm_prologue``) before anything moves: full-row
    intermediates inlined into the normalised rows (the block the products read), per-row values (sums,
    rsqrt) kept, each row sum split into ``lanes`` vector partial sums (rfactor needs the reduction at the
    root). Returns the remaining blocks of the stage in order and the names of the partial-sum blocks
    (None, None when a full-row intermediate cannot be inlined)."""
    if not norm["out"]:
        return [], set()
    get = sch.get_sblock
    for n in norm["stage"]:
        blk = get(n)
        full_row = n != norm["out"] and not has_reduce(sch, blk) and _is_full_row(sch, blk, get(norm["out"]))
        if full_row and not ok(sch.compute_inline, blk):
            return None, None
    rf_names = lane_partials(sch, norm["stage"], lanes)
    blocks = [block_name(sch, b) for b in root_blocks(sch)]
    stage = set(norm["stage"]) | rf_names
    return [n for n in blocks if n in stage], rf_names


def _is_full_row(sch, block, like) -> bool:
    """Does ``block`` write a tensor of the same size as ``like`` (a full row per row, not a per-row value)?"""
    def size(b):
        return math.prod(int(d) for d in sch.get(b).writes[0].source.ty.shape)

    return size(block) == size(like)
