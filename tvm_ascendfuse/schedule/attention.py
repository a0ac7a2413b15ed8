"""Attention in one kernel: softmax(Q·Kᵀ·scale + mask)·V, row-blocked so a block of scores stays in UB.

The kernel is walked per (batch·head, block of query rows). For one block, the score rows (rb × Sk), their
exponentials and probabilities live in ``local.UB`` together with the head's Kᵀ when the kernel transposes K
itself; the two contractions run as register-friendly loops (reduction outside, the contiguous output axis
innermost and vectorised) and the softmax row reductions are vectorised through ``rfactor``. rb is the
largest power of two whose working set, doubled for double buffering, fits usable UB. The blocks run in
parallel over the host's cores: with at least two heads per core the head loop is the parallel one; with fewer
(a small-width model) each head's query blocks are cut into a few parallel groups. Kᵀ and V (or their padded
copies) are panels staged once per parallel share, never once per query block. Tuning (``tunable.py``): rb is a sampled decision over the powers of two
that pass the same UB check, the rule's own rb first.
"""

from __future__ import annotations

import math
import re

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from ..target import AscendTarget
from .analysis import is_cheap, is_contraction, is_copy, leading_spatial, reduction_between_products
from .base import UB_SCOPE, ScheduleRule
from .common import (new_schedule, block_infos, blocks_under, buffer_bytes, extent, on_chip_bytes, innermost_vector, is_output_block, loops_through,
                     num_cores, ok, root_blocks, still_exists, try_, vector_lanes, vector_width_for)
from .contraction import schedule_contraction
from .partial_sums import vectorize_rf
from .row_blocks import exact_row_blocks


class AttentionRule(ScheduleRule):
    """Two contractions with a row softmax between them (Q·Kᵀ → softmax → ·V), batched over heads."""

    name = "attention"
    min_products = 2
    tunable = True      # query rows per block: ``tiles`` chooser (base.ScheduleRule), ``row_block_candidates``

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        if not _eligible(func):
            return None
        return self.schedule(new_schedule(func), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> "s_tir.Schedule | None":
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        if not _eligible(sch.mod["main"]):
            return None
        infos = block_infos(sch)
        if not infos:
            return None
        kinds = [b.dom_kind() for b in infos]
        if any(not re.fullmatch(r"S+R*", k) for k in kinds):
            return None
        contractions = [i for i, b in enumerate(infos) if b.is_reduction() and is_contraction(sch, b.block_rv)]
        if len(contractions) != 2:
            return None
        i1, i2 = contractions
        between = infos[i1 + 1:i2]
        if not any(b.is_reduction() for b in between):
            return None                       # no softmax between the two products: not attention
        c1, c2 = infos[i1], infos[i2]
        n_s2 = leading_spatial(c2.dom_kind())
        n_s1 = leading_spatial(c1.dom_kind())
        if n_s2 < 2 or n_s1 != n_s2:
            return None
        nb = n_s2 - 2                         # batch (and head) axes
        sk = c1.dom()[nb + 1]
        d_out = c2.dom()[nb + 1]
        if not isinstance(sk, int):
            return None                       # score rows of unknown length cannot be sized for UB
        dtype_bytes = buffer_bytes(sch.get(c2.block_rv).writes[0].source)
        lanes = vector_lanes(host, dtype_bytes * 8)

        # Epilogue after P·V (head-merge transpose + reshape, casts): one block computed per tile from the
        # P·V rows, which then stay in UB.
        epilogue = [info.block_rv for info in infos[i2 + 1:]]
        for blk in epilogue[:-1]:
            if not ok(sch.compute_inline, blk):
                return None
        tail = None
        if epilogue and not ok(sch.reverse_compute_inline, epilogue[-1]):
            tail = epilogue[-1]
            ok(sch.set_scope, c2.block_rv, 0, UB_SCOPE)

        # Stages between: single-use elementwise (scale, mask) inlined; multi-use rows staged in UB.
        staged, row_stages = [c1.block_rv], [c1.block_rv]
        for pos, info in enumerate(infos[:i2]):
            if info is c1 or info.is_reduction() or is_output_block(sch, info.block_rv):
                continue
            blk = info.block_rv
            consumers = sch.get_consumers(blk)
            feeds_product = any(is_contraction(sch, c) for c in consumers)
            if len(consumers) == 1 and not feeds_product and ok(sch.compute_inline, blk):
                continue
            if len(consumers) > 1 and not feeds_product and is_cheap(sch, blk) and ok(sch.compute_inline, blk):
                continue
            if (pos > i1 and is_copy(sch, blk) and not _row_indexed(sch, c2.block_rv, blk)
                    and ok(sch.compute_inline, blk)):
                continue    # V cut out of a merged projection: P·V reads it in place, rows contiguous
            staged.append(blk)
            if pos > i1 and not _column_panel(sch, c2.block_rv, blk, consumers):
                row_stages.append(blk)      # score-like rows (exp, probabilities); V's padded copy is a panel

        # Row block: scores-like rows (staged stages) + Kᵀ/prologue + output rows, double-buffered.
        d_static = d_out if isinstance(d_out, int) else 256
        batch = math.prod(d if isinstance(d, int) else 1 for d in c2.dom()[:nb])
        sq = c2.dom()[nb]
        sq_static = sq if isinstance(sq, int) else 256
        # in the bytes they take on chip (16 bits for a kernel a precision mode stores in 16 bits)
        chip = on_chip_bytes(sch.get(c2.block_rv).writes[0].source, target)
        head_bytes = 0
        row_bytes = sk * target.element_bytes("float32") * len(row_stages) + d_static * chip * 2
        panels = set()                                  # stages computed once per head, not per row block
        for b in staged:
            if any(b.same_as(r) for r in row_stages):
                continue
            if _row_indexed(sch, c1.block_rv, b):      # Q rows: only the block's rows are needed per step
                row_bytes += _per_head_bytes(sch, b, batch, target) // max(1, sq_static)
            else:                                       # Kᵀ / V panels: once per head
                head_bytes += _per_head_bytes(sch, b, batch, target)
                if not b.same_as(c1.block_rv):
                    panels.add(sch.get(b).name_hint)
        copies = 2 if target.double_buffer else 1
        fits = lambda rows: head_bytes + copies * rows * row_bytes <= target.ub_usable  # noqa: E731
        rb = 1
        while rb * 2 <= sq_static and rb * 2 <= 64 and fits(rb * 2):
            rb *= 2
        if not fits(rb):
            return None                       # one block of score rows does not fit UB
        cores = num_cores(host)
        while rb > 4 and isinstance(sq, int) and batch * math.ceil(sq / rb) < 2 * cores:
            rb //= 2
        if tail is not None:
            # the epilogue follows each block of rows (reverse_compute_at): only blocks it reads as boxes of
            # its own iterations are exact (``row_blocks``); the largest such count up to rb
            c2_buf = sch.get(c2.block_rv).writes[0].source
            exact = exact_row_blocks(sch.get(tail), c2_buf, nb, sq_static, range(rb, 0, -1))
            if not exact:
                return None
            fits_rows, rb = fits, exact[0]
            fits = lambda rows: fits_rows(rows) and bool(  # noqa: E731
                exact_row_blocks(sch.get(tail), c2_buf, nb, sq_static, [rows]))
        rb = self.choose(sch, rb, lambda: row_block_candidates(rb, sq_static, fits))
        for blk in staged:
            if not is_output_block(sch, blk):
                ok(sch.set_scope, blk, 0, UB_SCOPE)

        # Softmax reductions: lane-wide partials (rfactor before compute_at).
        rf_blocks = []
        for info in between:
            if not info.is_reduction() or not still_exists(sch, info.block_rv):
                continue
            blk = info.block_rv
            ok(sch.set_scope, blk, 0, UB_SCOPE)
            rloops = [it.loop_rv for it in info.iters if it.kind == "R"]
            if len(rloops) != 1:
                continue
            r = rloops[0]
            ext = extent(sch, r)
            v = vector_width_for(ext, lanes)
            if ext is None or v < 4 or ext < 2 * v:
                continue
            _, ki = sch.split(r, [None, v])
            rf = try_(sch.rfactor, ki, 0)
            if rf is not None:
                ok(sch.set_scope, rf, 0, UB_SCOPE)
                rf_blocks.append(sch.get(rf).name_hint)

        # Tile loop over (batch·head, query block); everything else computed inside it. With enough heads
        # for the cores, the head loop is the parallel one and the Kᵀ / V panels (a gather when the heads
        # are cut out of a merged projection) are staged once per head, not once per query block.
        out_blk = c2.block_rv
        head_loops = loops_through(sch, out_blk, c2, nb)
        row = c2.iters[nb].loop_rv
        head = (sch.fuse(*head_loops) if len(head_loops) > 1 else head_loops[0]) if head_loops else None
        io, _ = sch.split(row, [None, rb])
        groups = query_groups(batch, math.ceil(sq_static / rb), cores) if isinstance(sq, int) else 1
        if head is not None and panels and batch >= 2 * cores:
            tile, inner = head, io
        elif head is not None and panels and groups > 1:
            # Fewer heads than the cores want (a small-width Transformer: DeiT-Tiny's 3 heads on 2 cores):
            # each head's query blocks are cut into a few groups that run in parallel, and the Kᵀ / V panels
            # are staged once per (head, group), not once per query block (13x per head at 197 tokens).
            go, inner = sch.split(io, [groups, None])
            tile = sch.fuse(head, go)
        else:
            tile = inner = sch.fuse(head, io) if head is not None else io
            panels = set()
        skip = {sch.get(out_blk).name_hint} | ({sch.get(tail).name_hint} if tail is not None else set())
        for blk in reversed([b for b in root_blocks(sch) if sch.get(b).name_hint not in skip]):
            at = tile if sch.get(blk).name_hint in panels else inner
            sch.compute_at(blk, at, preserve_unit_loops=True)
        if tail is not None:
            sch.reverse_compute_at(tail, inner, preserve_unit_loops=True)
        if cores > 1:
            ok(sch.parallel, tile)

        for blk in blocks_under(sch, tile):
            stmt = sch.get(blk)
            name = stmt.name_hint
            if name in rf_blocks:
                vectorize_rf(sch, blk)
            elif any(iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.iter_vars):
                if is_contraction(sch, blk):
                    schedule_contraction(sch, blk, lanes)
                else:
                    # the final sum/max over the rf lanes: its innermost loop runs over the block's rows,
                    # contiguous in the partials and the result. Vectorised across rows instead of scalar
                    # (same speed; LLVM's unroll + SLP of the scalar form cost compile time on every kernel)
                    innermost_vector(sch, blk, lanes)
            else:
                innermost_vector(sch, blk, lanes)
        return sch


# Query rows per block a tuner may try besides the default (powers of two up to the query rows).
MAX_ROW_BLOCK = 128


def row_block_candidates(default: int, rows: int, fits) -> list[int]:
    """Query rows per block: the default first, then every power of two up to the query rows (and
    MAX_ROW_BLOCK) whose block passes the rule's UB check ``fits(rows)``."""
    out = [default]
    rb = 1
    while rb <= max(1, min(rows, MAX_ROW_BLOCK)):
        if rb not in out and fits(rb):
            out.append(rb)
        rb *= 2
    return out


def query_groups(heads: int, blocks: int, cores: int) -> int:
    """Parallel groups each head's ``blocks`` query blocks are cut into so that heads x groups gives every
    core at least two equal shares: the fewest groups with heads·groups >= 2·cores and a multiple of the
    cores (else the fewest reaching 2·cores), at most ``blocks``; 1 when the heads alone are enough."""
    if heads >= 2 * cores or blocks < 2:
        return 1
    least = min(blocks, math.ceil(2 * cores / max(1, heads)))
    for g in range(least, min(blocks, 4 * least) + 1):
        if (heads * g) % cores == 0:
            return g
    return least


def _eligible(func: tirx.PrimFunc) -> bool:
    if any(isinstance(p.ty, tirx.BufferType) and str(p.ty.dtype) == "bfloat16" for p in func.params):
        # bf16 is stored as uint16 on the host; this rule's vectorized stores then fail TVM's BF16
        # legalization ("dtype mismatch on BufferStore ... T.bfloat16x8"). Another rule takes it.
        return False
    # e.g. a chained FFN: declined before building a schedule (which takes milliseconds)
    return reduction_between_products(func)


def _row_indexed(sch, product, block) -> bool:
    """Whether ``product`` reads ``block``'s output along its row (query) axis, e.g. the Q operand."""
    stmt = sch.get(product)
    spatial = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    if len(spatial) < 2:
        return False
    row = spatial[-2]
    buf = sch.get(block).writes[0].source
    for region in stmt.reads:
        if region.source.same_as(buf):
            return any(row.name in {v.name for v in collect_vars_used_in_prim_expr(r.min)} for r in region.region)
    return False


def _column_panel(sch, product, block, consumers) -> bool:
    """Whether ``block`` feeds only ``product`` and not along its query rows: V (or its padded copy) for
    P·V, whose whole head is read by every query block, so it is staged once per head like Kᵀ."""
    return (len(consumers) == 1 and sch.get(consumers[0]).same_as(sch.get(product))
            and not _row_indexed(sch, product, block))


def _per_head_bytes(sch, block, batch: int, target) -> int:
    """Bytes of one head's share of a stage's buffer (its whole buffer over the batch·head count; symbolic
    batch dims are left out of both)."""
    buf = sch.get(block).writes[0].source
    dims = [int(d) for d in buf.shape if isinstance(d, tirx.IntImm)]
    return math.prod(dims) * on_chip_bytes(buf, target) // max(1, batch)
