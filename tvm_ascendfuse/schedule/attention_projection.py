"""AttentionProjectionRule: attention and its output projection in one kernel (``grouping/attention_chain.py``
groups it).

The kernel walks blocks of ``m`` query rows (parallel over the cores). For one row block the projection's
accumulator rows (``m x n2``, ``local.L0C``) are zeroed, then the heads are walked one at a time, each head
being one ``D``-wide panel of the projection's reduction axis:

* the head's Kᵀ panel is staged (``local.L1``: the cube reads its right operand from there; on the host the
  copy turns K's rows into the contiguous columns the score tiles vectorise over);
* scores = Q·Kᵀ (scaled, masked) for the block's rows, the row max, exponentials, row sums and
  probabilities, all rows of ``keys`` in ``local.UB``, the reductions as vector partial sums;
* the head's output rows P·V (``m x D``, ``local.UB``) — V read in place, its rows contiguous;
* the projection multiplies them into the accumulator rows with the head's ``D`` rows of the (pre-packed)
  weight, in ``mr x nr`` register tiles.

With the query projection in the kernel (``q = norm(x)·Wq``, LLaMA's pre-norm attention), each row block
starts by normalising its rows once (row sums of squares as vector partial sums, the normalised rows staged in
``local.L1`` as in the chained GEMM's norm prologue), and each head starts with its ``m x D`` query rows
(register tiles over the pre-packed ``D`` columns of Wq, in UB): Q never goes to GM either.

After the last head the epilogue (bias, residual) runs on the accumulator rows and they are written out. The
head-merged attention output never exists in GM (a tuner samples ``m`` among the divisors within the same
capacity). ``m`` comes from ``tiling.attention_row_block`` (the budget
the grouping pass checked), cut to rows / host cores and to a divisor of one sequence's query rows, or, when
the sequence has no divisor near that (a prime length), to balanced blocks with a short last one (``query_row_block``).
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget, get_target
from ..tiling import attention_row_block
from .analysis import (block_name, closure, float32_only, has_reduce, is_cheap, is_contraction, is_copy,
                       match_norm_prologue, reduces_row, reduction_between_products)
from .base import L0C_SCOPE, L1_SCOPE, UB_SCOPE, ScheduleRule, Scheduled
from .common import (new_schedule, 
    extent,
    innermost_vector,
    is_output_block,
    largest_divisor,
    loop_of_reduction,
    num_cores,
    ok,
    root_blocks,
    try_,
    vector_lanes,
    vector_width_for,
)
from .contraction import ACCUMULATORS, micro_tile, prepack_product_weight, schedule_contraction, tile_product
from .layout import PREPROC_ANNOTATION
from .partial_sums import lane_partials, stage_norm_prologue, vectorize_partial_sums, vectorize_rf


MAX_CANDIDATES = 12     # row blocks a tuner may try: the default and the largest divisors within capacity
MICRO_ROWS = 8          # rows of the projections' register tiles (``contraction.micro_tile`` with 2 vectors)


def query_row_block(seq: int, cap: int, micro: int = MICRO_ROWS) -> int:
    """Query rows per block for a sequence of ``seq`` rows, at most ``cap``: the largest divisor of ``seq`` when
    it is at least half of ``cap``; else (197 = ViT's 14x14 patches + 1 is prime: blocks of one row transposed
    the head's whole K panel and streamed both weights once per query row) the sequence cut into
    ``ceil(seq / cap)`` blocks of equal rows rounded up to whole register tiles, the last one short."""
    cap = max(1, min(cap, seq))
    m = largest_divisor(seq, cap)
    if 2 * m >= cap:
        return m
    blocks = -(-seq // cap)
    m = -(-seq // blocks)
    return min(cap, -(-m // micro) * micro) if cap >= micro else m


def row_block_candidates(default: int, seq: int, cap: int) -> list[int]:
    """The row blocks a tuner may try: the default, then the divisors of ``seq`` and the multiples of
    ``MICRO_ROWS`` within ``cap`` (largest first), MAX_CANDIDATES in all."""
    others = sorted({r for r in range(1, cap + 1) if seq % r == 0 or r % MICRO_ROWS == 0} - {default},
                    reverse=True)
    return [default] + others[:MAX_CANDIDATES - 1]


class AttentionProjectionRule(ScheduleRule):
    """Q·Kᵀ → softmax → ·V per head, heads merged into a projection's reduction axis (+ epilogue)."""

    name = "attention-projection"
    min_products = 3
    tunable = True      # query rows per block: ``tiles`` chooser (base.ScheduleRule)

    @staticmethod
    def prepare(func: tirx.PrimFunc) -> tirx.PrimFunc:
        """The kernel as the rule schedules it (``base.ScheduleRule.prepare``): index arithmetic of the reshapes
        simplified over the block domains (``(k // 1024 + i) % 256`` -> ``i``); else compute-at sees every head
        read all query rows and recomputes the whole attention per block."""
        return s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))["main"]

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | None:
        if not float32_only(func) or not reduction_between_products(func):
            return None          # e.g. a chained FFN's three products: declined before building a schedule
        return self.schedule(new_schedule(self.prepare(func)), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> Scheduled | None:
        """Schedule ``sch`` (a prepared kernel) in place (a MetaSchedule space passes its own traced
        schedule); None declines."""
        func = sch.mod["main"]
        if not float32_only(func) or not reduction_between_products(func):
            return None
        plan = self._plan(sch)
        if plan is None:
            return None
        target = target if isinstance(target, AscendTarget) else get_target(target)
        return self._schedule(sch, plan, target, host)

    # ---- recognise ------------------------------------------------------------------------------------------
    @staticmethod
    def _plan(sch):
        """{"qk", "pv", "proj", "query": product names (query None without one), "out": the output block,
        "norm": the query's norm prologue (``analysis.match_norm_prologue``)} when the kernel's products are [query
        projection,] Q·Kᵀ, P·V and the projection in that order, with the softmax's reductions between the two
        attention products, at most a row norm in front of the query projection and after the projection, and
        one output after the projection."""
        blocks = list(root_blocks(sch))
        names = [block_name(sch, b) for b in blocks]
        by_name = dict(zip(names, blocks))
        products = [n for b, n in zip(blocks, names) if has_reduce(sch, b) and is_contraction(sch, b)]
        if len(products) not in (3, 4):
            return None
        query = products[0] if len(products) == 4 else None
        qk, pv, proj = products[-3:]
        at = {n: i for i, n in enumerate(names)}
        if query is not None and query not in closure(sch, by_name[qk], sch.get_producers):
            return None
        start = at[query] if query is not None else -1
        for n, b in zip(names, blocks):
            if n in products or not has_reduce(sch, b):
                continue
            if not (at[qk] < at[n] < at[pv] or ((at[n] > at[proj] or at[n] < start) and reduces_row(sch, b))):
                return None                    # a reduction neither the softmax's nor a row norm's
        if not any(has_reduce(sch, b) for n, b in zip(names, blocks) if at[qk] < at[n] < at[pv]):
            return None
        outputs = [n for n, b in zip(names, blocks) if is_output_block(sch, b)]
        if len(outputs) != 1 or outputs[0] != names[-1] or at[proj] == len(names) - 1:
            return None                        # the projection writes through an epilogue (residual, bias)
        norm = {"stage": [], "out": None}
        if query is not None:
            norm = match_norm_prologue(sch, by_name, names[:start], [query])
            if norm is None:
                return None
        pv_buf = sch.get(blocks[at[pv]]).writes[0].source
        if len(pv_buf.shape) < 3 or not all(isinstance(d, tirx.IntImm) for d in pv_buf.shape):
            return None                        # static shapes only (as the grouping builds this kernel)
        shape = [int(d) for d in pv_buf.shape]
        return {"query": query, "qk": qk, "pv": pv, "proj": proj, "out": names[-1], "norm": norm,
                "heads": shape[-3], "head_dim": shape[-1], "order": names}

    # ---- schedule -------------------------------------------------------------------------------------------
    def _schedule(self, sch, plan, target: AscendTarget, host):
        get = sch.get_sblock
        lanes = vector_lanes(host, 32)
        order = plan["order"]
        at = {n: i for i, n in enumerate(order)}
        qk, pv, proj, out = plan["qk"], plan["pv"], plan["proj"], plan["out"]
        heads, d = plan["heads"], plan["head_dim"]
        query, norm = plan["query"], plan["norm"]
        kt = self._kt_stage(sch, qk)

        # layout stages inlined into their readers (x into the norm, Q, V, the head merge); the scale and mask
        # into the softmax; between the projection and the output, the epilogue recomputed where it is read
        for n in order:
            if n in (qk, pv, proj, out, kt, query) or n in norm["stage"] or at[n] > at[proj]:
                continue
            blk = get(n)
            if has_reduce(sch, blk):
                continue
            consumers = sch.get_consumers(blk)
            if at[qk] < at[n] < at[pv] and len(consumers) > 1 and not is_cheap(sch, blk):
                continue                      # an expensive value read twice: computed once, staged
            if at[qk] < at[n] < at[pv] and not is_copy(sch, blk) \
                    and any(block_name(sch, c) == pv for c in consumers):
                continue                      # the probabilities: staged, not divided again in every FMA
            ok(sch.compute_inline, blk)
        for n in order[at[proj] + 1:-1]:
            ok(sch.compute_inline, get(n))
        norm_blocks, norm_rf = stage_norm_prologue(sch, norm, lanes)
        if norm_blocks is None:
            return None

        rows_dom = [extent(sch, l) for l in sch.get_loops(get(proj))]
        if any(x is None for x in rows_dom) or len(rows_dom) < 3:
            return None
        n2, n1 = rows_dom[-2], rows_dom[-1]
        rows = math.prod(rows_dom[:-2])
        keys = extent(sch, sch.get_loops(get(qk))[-2])
        if n1 != heads * d or keys is None:
            return None
        norm_after = any(has_reduce(sch, get(n)) for n in order[at[proj] + 1:] if try_(get, n) is not None)
        query_k = extent(sch, sch.get_loops(get(query))[-1]) if query is not None else 0
        check = attention_row_block(heads, d, keys, n2, rows, target, target.element_bytes("float32"), norm_after=norm_after,
                                    query_k=query_k or 0, query_norm=norm["out"] is not None)
        if not check.fits:
            return None             # one query row does not fit (the grouping pass refuses such a group)
        cores = num_cores(host)
        seq = rows_dom[-3]
        cap = min(check.tile_elems, max(1, rows // max(1, cores)))
        m = query_row_block(seq, cap, MICRO_ROWS)
        m = self.choose(sch, m, lambda: row_block_candidates(m, seq, min(seq, check.tile_elems)))

        rf_names = lane_partials(sch, order[at[qk] + 1:at[pv]], lanes)      # the softmax's max and sum

        # the projection's weight pre-packed in (head panel, column panel) order; its accumulator in L0C
        v2 = vector_width_for(n2, lanes)
        mr2, nvec2 = micro_tile(m, n2, v2, ACCUMULATORS)
        nvec2 = largest_divisor(n2 // v2, nvec2)
        mr2 = largest_divisor(m, mr2)
        prepack_product_weight(sch, get(proj), nvec2 * v2, d)
        sch.set_scope(get(proj), 0, L0C_SCOPE)
        if query is not None:                  # the query projection: m x D register tiles over Wq's head panel
            v1 = vector_width_for(d, lanes)
            mr1, nvec1 = micro_tile(m, d, v1, ACCUMULATORS)
            nvec1, mr1 = largest_divisor(d // v1, nvec1), largest_divisor(m, mr1)
            prepack_product_weight(sch, get(query), nvec1 * v1)

        # anchor: m output rows at a time, everything else under that loop
        loops = sch.get_loops(get(out))
        if math.prod(extent(sch, l) or 0 for l in loops[:-1]) != rows:
            return None
        # the block's rows cut from one sequence's query rows (a block never straddles two batch entries: it
        # would compute the attention stages of both); the last block of a sequence is short when m does not
        # divide it (the producers computed under the block loop then carry the same bound)
        so, _ = sch.split(loops[-2], [None, m])
        rb = sch.fuse(*loops[:-2], so) if len(loops) > 2 else so
        for b in reversed([b for b in root_blocks(sch) if block_name(sch, b) != out]):
            if PREPROC_ANNOTATION in sch.get(b).annotations:
                continue                      # the weight re-layout stays at the root (packed at compile time)
            sch.compute_at(b, rb, preserve_unit_loops=True)
        innermost_vector(sch, get(out), lanes)
        for n in order[at[proj] + 1:-1]:              # a row norm's statistics, per row of the block, in UB
            blk = try_(get, n)
            if blk is not None:
                try_(sch.set_scope, blk, 0, UB_SCOPE)
        if cores > 1 and rows // m > 1:
            sch.parallel(rb)

        # the projection's reduction walked one head (D columns of the merged rows) at a time
        ploops = sch.get_loops(get(proj))
        at_rb = next(i for i, l in enumerate(ploops) if sch.get(l).same_as(sch.get(rb)))
        red = next(l for l in ploops[at_rb + 1:] if loop_of_reduction(sch, get(proj), l))
        head, _ = sch.split(red, [None, d])
        ploops = sch.get_loops(get(proj))
        sch.reorder(head, *[l for l in ploops[at_rb + 1:] if not loop_of_reduction(sch, get(proj), l)])
        # every attention stage (rfactor partials included) computed for one head of the row block; the
        # query's normalised rows once per row block, staged in L1 for every head
        stages = (set(order[at[query] if query else 0:at[proj]]) | rf_names) - set(norm_blocks)
        attention = [block_name(sch, b) for b in root_blocks(sch) if block_name(sch, b) in stages]
        for n in reversed(attention):
            sch.compute_at(get(n), head, preserve_unit_loops=True)
        for n in attention:
            if not is_output_block(sch, get(n)):
                try_(sch.set_scope, get(n), 0, L1_SCOPE if n == kt else UB_SCOPE)
        for n in norm_blocks:
            try_(sch.set_scope, get(n), 0, L1_SCOPE if n == norm["out"] else UB_SCOPE)
        tile_product(sch, get(proj), mr2, nvec2, v2, whole=False)
        if query is not None:
            tile_product(sch, get(query), mr1, nvec1, v1, whole=True)
        for n in norm_blocks:
            if n in norm_rf:
                vectorize_partial_sums(sch, get(n))
            elif not has_reduce(sch, get(n)):
                innermost_vector(sch, get(n), lanes)
        for n in attention:
            if n == query:
                continue
            blk = get(n)
            if n in rf_names:
                vectorize_rf(sch, blk)
            elif has_reduce(sch, blk) and is_contraction(sch, blk):
                schedule_contraction(sch, blk, lanes)
            elif n == kt:
                self._transpose_rows(sch, blk)
            else:
                innermost_vector(sch, blk, lanes)
        note = (f"query rows per block {m}, {heads} heads of {d} as the projection's panels, "
                     f"projection tile {mr2}x{nvec2 * v2}, accumulator rows in L0C")
        sch.annotate(get(proj), "ascendfuse.schedule", note)
        init = sch.decompose_reduction(get(proj), head)
        innermost_vector(sch, init, lanes)
        return Scheduled(sch, note)

    @staticmethod
    def _transpose_rows(sch, blk):
        """Kᵀ[d, j] = K[j, d] walked along K's rows: contiguous loads, scalar stores into the staged panel,
        the row unrolled. Vectorised along j (a 16-lane gather per store: K's rows are a merged projection's
        width apart) it took a fifth of the kernel; vectorised along d the stores became scatters. Walking
        the rows measured much faster on LLaMA's attention with one thread."""
        loops = sch.get_loops(blk)
        sch.reorder(loops[-1], loops[-2])
        ok(sch.unroll, sch.get_loops(blk)[-1])

    @staticmethod
    def _kt_stage(sch, qk):
        """Name of the stage that feeds Q·Kᵀ with K transposed (``Kᵀ[d, j]``), kept as a staged copy per head;
        None when there is none."""
        for p in sch.get_producers(sch.get_sblock(qk)):
            stmt = sch.get(p)
            buf = stmt.writes[0].source
            for region in sch.get(sch.get_sblock(qk)).reads:
                if region.source.same_as(buf):
                    red = [iv.var for iv in sch.get(sch.get_sblock(qk)).iter_vars
                           if iv.iter_type == tirx.IterVar.CommReduce]
                    mins = [r.min for r in region.region]
                    if len(mins) >= 2 and isinstance(mins[-2], tirx.Var) and red and mins[-2].same_as(red[0]):
                        return stmt.name_hint
        return None
