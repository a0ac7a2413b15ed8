"""GEMV: one to a few rows times a weight (an LLM decode step, a small batch), at the memory's speed.

With one row, a GEMM does two FLOPs per weight element it reads once: the kernel is a stream of the weight
and nothing else matters. The rule lays the weight out once at compile time in panels of ``nt`` columns
(``W'[n // nt, k, n % nt]``, ``layout.panel_pack_map``), so each panel is one contiguous run of memory,
and gives the panels to the cores in turn (the panel loop is the parallel one). Within a panel the rows'
``nt``-column accumulators stay in vector registers (``local.UB``) while ``k`` walks down the panel.

What the grouping puts around the products stays in the kernel:

* a prologue (an RMSNorm or LayerNorm of the row, casts) is computed once, in front of the panel loop: it
  is a few rows, where re-computing it per panel would cost more than the panel;
* several products of the same rows with the same column count and no product reading another (SwiGLU's
  gate and up projections) share the panel loop: each panel computes its columns of every product;
* the elementwise epilogue (bias, residual, SiLU x up) follows each panel, when it reads the panel's
  columns as a box of its own iterations (``row_blocks.tiles_are_boxes``);
* row reductions after the products (the next RMSNorm of a residual stream, also returned) and what
  follows them run once the whole row is there, after the panel loop: a few thousand elements.

A kernel with more rows than ``MAX_ROWS``, products that feed one another (attention, GEMM chains), or a
reduction that is not a row of what the products wrote is declined.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from ..tiling import GEMV_MAX_ROWS
from .analysis import has_reduce, match_gemm
from .base import UB_SCOPE, ScheduleRule
from .common import new_schedule, extent, has_block, is_output_block, ok, root_blocks, transitive_producers, try_, vectorize_inner
from .fast_math import use_fast_math
from .hostvec import HostVector, host_vector
from .layout import mark_prepack, packable_param, panel_pack_map
from .row_blocks import tiles_are_boxes

# Rows of A a kernel may have (batch x sequence of the products' outputs): beyond a few rows the weight is
# read by enough FMAs to be compute-bound, the matmul rule's register blocks.
MAX_ROWS = GEMV_MAX_ROWS
# Vectors of columns per panel at most: with one row, eight independent accumulators hide the FMA latency
# and a panel row is eight cache lines per k (on AVX-512; measured 10-30% faster than four from DRAM).
MAX_PANEL_VECTORS = 8
# K loop unroll (independent loads in flight).
K_UNROLL = 4


def panel_columns(n: int, rows: int, hv: HostVector, dtype: str) -> int:
    """Columns per panel, dividing ``n``: a multiple of the widest power-of-two vector (at most the host's)
    that divides ``n``, up to MAX_PANEL_VECTORS full vectors and as many as the accumulators allow for
    ``rows`` rows; the widest that still gives every core several panels, else the narrowest. (1000
    classes: panels of 40 columns, 16 + 16 + 8 lanes; 10 classes: five panels of 2.)"""
    lanes = hv.lanes(dtype)
    step = lanes
    while n % step:
        step //= 2
    cap = min(MAX_PANEL_VECTORS, max(1, hv.accumulators // max(1, rows))) * lanes
    widths = [w for w in range(step, max(step, cap) + 1, step) if n % w == 0]
    enough = [w for w in widths if n // w >= 4 * hv.cores]
    return max(enough) if enough else min(widths)


class GemvRule(ScheduleRule):
    """Products of at most ``MAX_ROWS`` rows: the weight streamed in panels, one panel per task (module
    docstring)."""

    name = "gemv"
    min_products = 1

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(tvm.IRModule({"main": use_fast_math(func)}))
        return self.schedule(sch, target, host_vector(host))

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, hv: HostVector) -> s_tir.Schedule | None:
        blocks = list(root_blocks(sch))
        gemms = [(i, info) for i, b in enumerate(blocks) if has_reduce(sch, b)
                 for info in [match_gemm(sch, b)] if info is not None]
        if not gemms:
            return None
        first, last = gemms[0][0], gemms[-1][0]
        infos = [info for _, info in gemms]
        for (i, info) in gemms:
            info.block = blocks[i]
        shape = _gemv_shape(sch, infos)
        if shape is None:
            return None
        rows, n, dtype = shape
        nt = panel_columns(n, rows, hv, dtype)
        gemm_names = {sch.get(info.block).name_hint for info in infos}
        if any(has_reduce(sch, b) and sch.get(b).name_hint not in gemm_names for b in blocks[first:last]):
            return None                      # a reduction between the products: attention, not a GEMV
        if _chained(sch, infos):
            return None
        names = [sch.get(b).name_hint for b in blocks]
        # blocks between the products (SwiGLU's SiLU of the gate) belong to the epilogue
        pro = names[:first]
        post = [nm for nm in names[first:last] if nm not in gemm_names] + names[last + 1:]

        # the prologue: inline what is injective and reads no reduction (casts, transposes); a norm (its
        # reductions and what scales by them) stays a row stage in front, computed once, not per panel
        for nm in pro[::-1]:
            blk = sch.get_sblock(nm)
            if not has_reduce(sch, blk) and not any(has_reduce(sch, b) for b in transitive_producers(sch, blk)):
                ok(sch.compute_inline, blk)
        # the epilogue: the first block after the products that every later block reads the products through
        # follows each panel (what comes before it is inlined into it); the rest runs after the panel loop
        at = _anchor_position(sch, post, [sch.get(info.block).writes[0].source for info in infos])
        if at is not None and not all(ok(sch.compute_inline, sch.get_sblock(nm)) for nm in post[:at]):
            at = None                        # (what was inlined stays so: the same computation)
        if at is None:
            # no one block carries every use of the product (a projection whose slices go three ways: the
            # query, the key and the value, each with its own rotary embedding, two of them outputs): the
            # product row is written per panel and the epilogue runs after the panel loop, on a few rows
            if len(infos) != 1 or is_output_block(sch, infos[0].block):
                return None
            post, at = [], 0
        for nm in post[at + 1:]:
            if not has_reduce(sch, sch.get_sblock(nm)):
                ok(sch.compute_inline, sch.get_sblock(nm))
        if at < len(post) and any(is_output_block(sch, info.block) for info in infos):
            return None                      # a product that is also a kernel output besides its epilogue
        for info in infos:
            if packable_param(sch, info.b_buf) is not None:
                b_read = next(i for i, r in enumerate(sch.get(info.block).reads) if r.source.same_as(info.b_buf))
                mark_prepack(sch, info.block, b_read, panel_pack_map(info, nt, len(info.b_buf.ty.shape)))
        if at < len(post):
            anchor = sch.get_sblock(post[at])
            if not all(tiles_are_boxes(sch.get(anchor), sch.get(info.block).writes[0].source,
                                       _panel_tile(sch, info, nt))
                       for info in infos if _reads(sch, anchor, sch.get(info.block).writes[0].source)):
                return None                  # the epilogue does not read whole panels
        elif len(infos) == 1:
            anchor = sch.cache_write(infos[0].block, 0, UB_SCOPE)    # the accumulator copied out per panel
        else:
            return None
        if not _tile_anchor_and_place(sch, anchor, infos, nt, hv, dtype):
            return None
        for nm in names:
            if has_block(sch, nm) and nm not in gemm_names and not _under_parallel(sch, sch.get_sblock(nm)):
                _row_stage(sch, sch.get_sblock(nm), hv.lanes(dtype))
        sch.annotate(anchor, "ascendfuse.schedule", f"gemv panels of {nt} columns, {rows} row(s)")
        return sch


def _gemv_shape(sch, infos) -> tuple[int, int, str] | None:
    """(rows, columns, dtype) shared by every product, or None: static, at most MAX_ROWS rows, one column
    count, one dtype."""
    out = set()
    for info in infos:
        loops = sch.get_loops(info.block)
        rows_ext = [extent(sch, loops[p]) for p in info.batch + info.m]
        n = extent(sch, loops[info.n])
        if None in rows_ext or n is None or any(extent(sch, loops[p]) != 1 for p in info.batch):
            return None                  # symbolic, or batch items with a B of their own: no weight to stream
        out.add((math.prod(rows_ext), n, str(info.c_buf.ty.dtype)))
    if len(out) != 1:
        return None
    rows, n, dtype = out.pop()
    return (rows, n, dtype) if rows <= MAX_ROWS else None


def _chained(sch, infos) -> bool:
    """Does one product read (through any blocks) what another wrote?"""
    names = {sch.get(i.block).name_hint for i in infos}
    for info in infos:
        ups = {sch.get(b).name_hint for b in transitive_producers(sch, info.block)}
        if (ups & names) - {sch.get(info.block).name_hint}:
            return True
    return False


def _anchor_position(sch, post: list, products: list) -> int | None:
    """Index in ``post`` (the blocks after the last product) of the first block through which every later
    block reads the products: no later block reads a product or a block before it. ``len(post)`` when there
    is no block after the products; None when no block qualifies or one before it is not injective."""
    if not post:
        return len(post)
    writes = [sch.get(sch.get_sblock(nm)).writes[0].source for nm in post]
    for at in range(len(post)):
        before = products + writes[:at]
        later = [sch.get(sch.get_sblock(nm)) for nm in post[at + 1:]]
        if all(not any(r.source.same_as(b) for r in blk.reads for b in before) for blk in later):
            if any(has_reduce(sch, sch.get_sblock(nm)) for nm in post[:at + 1]):
                return None
            return at
    return None


def _reads(sch, block, buf) -> bool:
    return any(r.source.same_as(buf) for r in sch.get(block).reads)


def _panel_tile(sch, info, nt: int) -> list:
    """Tile sizes per axis of the product's output that one panel covers: every row, ``nt`` columns."""
    stmt = sch.get(info.block)
    iters = [iv.var for iv in stmt.iter_vars]
    out = []
    for rg in stmt.writes[0].region:
        pos = next((p for p, v in enumerate(iters) if rg.min.same_as(v)), None)
        out.append(nt if pos == info.n else None)
    return out


def _tile_anchor_and_place(sch, anchor, infos, nt: int, hv: HostVector, dtype: str) -> bool:
    """Panel loop over the anchor's columns (parallel), every product computed per panel under it."""
    loops = sch.get_loops(anchor)
    if not loops or extent(sch, loops[-1]) is None or extent(sch, loops[-1]) % nt:
        return False
    outer, inner = sch.split(loops[-1], [None, nt])
    sch.reorder(outer, *loops[:-1], inner)
    for info in infos:
        if not ok(sch.compute_at, info.block, outer, preserve_unit_loops=True):
            return False
        if not is_output_block(sch, info.block):
            ok(sch.set_scope, info.block, 0, UB_SCOPE)
    sch.parallel(outer)              # before the reductions are decomposed (parallel needs whole blocks)
    for info in infos:
        _register_block(sch, info, hv, dtype)
    vectorize_inner(sch, anchor, hv.lanes(dtype))
    return True


def _register_block(sch, info, hv: HostVector, dtype: str) -> None:
    """Under the panel loop: k outermost (unrolled by K_UNROLL), the rows, the panel's columns vectorised."""
    loops = sch.get_loops(info.block)
    stmt = sch.get(info.block)
    k_pos = info.k
    n_pos = info.n
    # the block's own loops are the innermost len(iter_vars) loops, one per iterator in order
    own = loops[len(loops) - len(stmt.iter_vars):]
    k, n = own[k_pos], own[n_pos]
    rows = [own[p] for p in info.batch + info.m]
    ext_k = extent(sch, k)
    uk = K_UNROLL if ext_k is not None and ext_k % K_UNROLL == 0 else 1
    ko, ki = sch.split(k, [None, uk])
    lanes = hv.lanes(dtype)
    width = extent(sch, n) or lanes
    vec = math.gcd(width, lanes)
    nv, nl = sch.split(n, [None, vec])   # whole vector registers, unrolled (one wide vector is split by LLVM
    sch.reorder(ko, ki, *rows, nv, nl)   # into the same registers, but counts as code size here)
    try_(sch.unroll, ki)
    for r in rows:
        try_(sch.unroll, r)
    try_(sch.unroll, nv)
    try_(sch.vectorize, nl)          # before the reduction is decomposed (vectorize needs whole blocks)
    init = sch.decompose_reduction(info.block, ko)
    try_(sch.vectorize, sch.get_loops(init)[-1])


def _under_parallel(sch, block) -> bool:
    return any(sch.get(lp).kind == tirx.ForKind.PARALLEL for lp in sch.get_loops(block))


def _row_stage(sch, block, lanes: int) -> None:
    """A prologue or tail stage of a few rows: vectorised innermost loop, serial (it is small)."""
    if has_reduce(sch, block):
        return
    vectorize_inner(sch, block, lanes)
