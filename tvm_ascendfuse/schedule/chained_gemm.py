"""ChainedGemmRule: two GEMMs in one kernel, the first one's result (after its bias/activation, or SwiGLU's
``silu(x·Wg) * (x·Wu)``) being the second one's row operand — the FFN's up- and down-projection.

The kernel walks blocks of ``m`` rows (parallel over the cores). For one row block, the accumulator rows
(``m x n2``) are zeroed once, then the second product's reduction axis (the intermediate's columns) is walked
one panel of ``PANEL_COLS`` columns at a time:

* the first product(s) compute that panel of the intermediate in ``mr x nr`` register tiles over the input
  rows, and the activation turns it into the panel, in ``local.UB`` (``m x panel``);
* the second product multiplies the panel into the accumulator rows, one ``mr x nr`` register tile at a
  time (loaded, updated over the panel's ``k``, stored back). The accumulator rows live in ``local.L0C``
  (the cube's accumulator, which holds partial sums across K on the NPU) when ``m`` rows fit it, else in
  ``local.UB``. On the host the separate scope matters: sharing one UB allocation with the panel, LLVM
  could not tell the tile from the panel it reads and stored the tile after every FMA (much slower);
* after the last panel, the epilogue (bias, residual; recomputed where read) and, when present, the row
  norm run on the accumulator rows, and the rows are written out.

With a row norm in front of the first product(s) (RMSNorm/LayerNorm over the last axis, read only by them),
each row block starts by normalising its rows: the row sums of squares (and sums) as vector partial sums,
the per-row scale, then the normalised rows into one ``m x k`` buffer in ``local.L1`` (the cube's operand
buffer on the NPU) that every panel's first product(s) read, so the norm is computed once per row and its
output never goes to GM.

The intermediate never exists in GM, nor whole in UB; the weights are read once per row block (pre-packed at
compile time into the order the tiles read them). ``m`` comes from ``tiling.chain_row_block`` (the same UB
budget the grouping pass checked), cut to what L0C holds, to a divisor of the row count and to
rows / host cores (a tuner, ``tunable.py``, samples it among the row blocks within the same capacity). The
weights are streamed once per row block: with UB's budget (``m`` = 32 rows for a 768- or 1024-wide output)
that is rows / 32 times per call, against about once for two separate GEMMs.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..target import AscendTarget, get_target
from ..tiling import PANEL_COLS as PANEL
from ..tiling import ACCUMULATOR_BYTES, accumulator_in_l0c, chain_row_block, staged_rows_bytes
from .analysis import block_name, closure, float32_only, has_reduce, is_contraction, match_norm_prologue
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
    row_block,
    try_,
    vector_lanes,
    vector_width_for,
)
from .contraction import ACCUMULATORS, micro_tile, prepack_product_weight, tile_product
from .layout import PREPROC_ANNOTATION
from .partial_sums import stage_norm_prologue, vectorize_partial_sums


def row_block_candidates(default: int, rows: int, most: int) -> list[int]:
    """Rows per block a tuner may try: the default first, then ``common.row_block`` of every power of two
    and every divisor of ``rows`` up to ``most`` (the rows UB, L1 and L0C hold, the rule's capacity check)."""
    caps = {d for d in range(1, min(rows, most) + 1) if rows % d == 0}
    caps |= {1 << i for i in range(most.bit_length()) if 1 << i <= min(rows, most)}
    out = [default]
    for cap in sorted(caps):
        m = row_block(rows, cap)
        if m not in out:
            out.append(m)
    return out


class ChainedGemmRule(ScheduleRule):
    """First product(s) -> elementwise -> second product (+ injective epilogue, + row norm), per row block."""

    name = "chained-matmul"
    min_products = 2
    tunable = True      # rows per block: ``tiles`` chooser (base.ScheduleRule), ``row_block_candidates``

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | None:
        return self.schedule(new_schedule(func), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> Scheduled | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        if not float32_only(sch.mod["main"]):
            return None
        plan = self._plan(sch)
        if plan is None:
            return None
        target = target if isinstance(target, AscendTarget) else get_target(target)
        return self._schedule(sch, plan, target, host)

    # ---- recognise ------------------------------------------------------------------------------------------
    def _plan(self, sch):
        blocks = list(root_blocks(sch))
        last = blocks[-1]
        if has_reduce(sch, last) and is_output_block(sch, last) and is_contraction(sch, last):
            sch.cache_write(last, 0, "global")      # the product writes the output: give it a copy-out stage
            blocks = list(root_blocks(sch))
        names = [block_name(sch, b) for b in blocks]
        products = [n for b, n in zip(blocks, names) if has_reduce(sch, b) and is_contraction(sch, b)]
        if len(products) < 2:
            return None
        by_name = dict(zip(names, blocks))
        ups = {n: closure(sch, by_name[n], sch.get_producers) for n in products}
        seconds = [n for n in products if any(p in ups[n] for p in products if p != n)]
        if len(seconds) != 1:
            return None
        second = seconds[0]
        first = [p for p in products if p in ups[second]]
        if len(first) + 1 != len(products) or len(first) > 2 or any(set(first) & ups[p] for p in first):
            return None
        # the intermediate: the one block the second product reads that depends on the first product(s)
        direct = [block_name(sch, b) for b in sch.get_producers(by_name[second])]
        inter = [n for n in direct if n in first or set(first) & closure(sch, by_name[n], sch.get_producers)]
        if len(inter) != 1 or inter[0] in first:
            return None                  # a product feeding the next one directly: no activation, not handled
        inter = inter[0]
        between = closure(sch, by_name[inter], sch.get_producers)
        down_of_first = set().union(*(closure(sch, by_name[f], sch.get_consumers) for f in first))
        chain = (between & down_of_first) - set(first)
        if any(has_reduce(sch, by_name[n]) or is_output_block(sch, by_name[n]) for n in chain | {inter}):
            return None
        after = closure(sch, by_name[second], sch.get_consumers)
        pro = [n for n in names if n not in chain and n not in after and n not in first
               and n not in (second, inter)]
        norm = match_norm_prologue(sch, by_name, pro, first)
        if norm is None:
            return None
        outputs = [n for n in names if is_output_block(sch, by_name[n])]
        if len(outputs) != 1 or outputs[0] != names[-1] or names[-1] not in after:
            return None
        return {"first": first, "second": second, "inter": inter, "chain": sorted(chain),
                "pro": [n for n in pro if n not in norm["stage"]], "norm": norm,
                "after": [n for n in names if n in after]}

    # ---- schedule -------------------------------------------------------------------------------------------
    def _schedule(self, sch, plan, target: AscendTarget, host):
        get = sch.get_sblock
        for n in plan["pro"] + plan["chain"]:          # layout prologue; bias + activation into the panel
            if not ok(sch.compute_inline, get(n)):
                return None
        norm_blocks, rf_names = stage_norm_prologue(sch, plan["norm"], vector_lanes(host, 32))
        if norm_blocks is None:
            return None
        after = plan["after"]
        for n in after[:-1]:                           # bias, residual: recomputed where the rows are read
            if not has_reduce(sch, get(n)) and not is_output_block(sch, get(n)):
                ok(sch.compute_inline, get(n))
        second, inter, first = get(plan["second"]), get(plan["inter"]), [get(f) for f in plan["first"]]
        sdom = [extent(sch, l) for l in sch.get_loops(second)]
        fdom = [extent(sch, l) for l in sch.get_loops(first[0])]
        if any(d is None for d in sdom + fdom) or len(sdom) < 3:
            return None
        n2, n1 = sdom[-2], sdom[-1]
        rows = math.prod(sdom[:-2])
        lanes = vector_lanes(host, 32)
        v1 = vector_width_for(n1, lanes)
        panel = v1 * largest_divisor(n1 // v1, max(1, PANEL // v1))
        norm = plan["norm"]
        k1 = fdom[-1]
        norm_after = any(has_reduce(sch, get(n)) for n in after if try_(get, n) is not None)
        check = chain_row_block(n1, n2, panel, len(first), rows, target, target.element_bytes("float32"),
                                staged_row=k1 if norm["out"] else 0, norm_after=norm_after)
        if not check.fits:
            return None             # one row does not fit UB (the grouping pass refuses such a chain)
        cores = num_cores(host)
        # the accumulator rows in L0C (the cube accumulates there across the panels) when they fit, else UB
        acc_scope = L0C_SCOPE if accumulator_in_l0c(n2, target) else UB_SCOPE
        most = check.tile_elems                  # rows per block the capacity allows
        if acc_scope == L0C_SCOPE:
            most = min(most, target.capacity(L0C_SCOPE) // target.align_up(n2 * ACCUMULATOR_BYTES, "l0c"))
        out_loops = sch.get_loops(get(after[-1]))
        channels_first = _channels_first_output(sch, out_loops, rows, n2)
        # rows spread over several loops (N, H, W): a row block must cover whole inner rows (a divisor of W, or
        # whole W rows times a divisor of H, ...): otherwise the product's rows computed for one block overlap
        # the next block's and the row-block loop cannot run in parallel. It also keeps a channels-first
        # output's per-channel store one contiguous run
        cap = min(most, max(1, rows // max(1, cores)))
        m = _aligned_row_block(sdom[:-2], cap)
        if m is None:
            m = row_block(rows, cap)
            m = self.choose(sch, m, lambda: row_block_candidates(m, rows, most))
        else:
            m = self.choose(sch, m, lambda: list(dict.fromkeys(
                [m] + [_aligned_row_block(sdom[:-2], c) for c in range(1, min(rows, most) + 1)])))

        # weights pre-packed into the column panels the register blocks walk
        v2 = vector_width_for(n2, lanes)
        mr1, nvec1 = micro_tile(m, panel, v1, ACCUMULATORS)
        mr2, nvec2 = micro_tile(m, n2, v2, ACCUMULATORS)
        nvec1 = largest_divisor(panel // v1, nvec1)
        nvec2 = largest_divisor(n2 // v2, nvec2)
        mr1, mr2 = largest_divisor(m, mr1), largest_divisor(m, mr2)
        for f in first:
            prepack_product_weight(sch, f, nvec1 * v1)
        prepack_product_weight(sch, second, nvec2 * v2, panel)

        # the second product accumulates into the m x n2 accumulator rows, panel after panel. Its own scope
        # (L0C) is also what keeps its register tiles in registers on the host: in one UB allocation with
        # the panel it reads, LLVM could not prove them apart and stored the tile after every FMA (1.6x)
        sch.set_scope(second, 0, acc_scope)

        # anchor: rows of the output block, m at a time; every other stage at that row-block loop
        out = get(after[-1])
        loops = sch.get_loops(out)
        if channels_first:
            # the output is (N, C, spatial...): the rows are N x spatial, C the product's columns (ConvNeXt's
            # permute back to NCHW before the layer scale and the residual)
            sch.reorder(loops[0], *loops[2:], loops[1])
            loops = sch.get_loops(out)
        elif len(loops) < 2 or math.prod(extent(sch, l) or 0 for l in loops[:-1]) != rows:
            return None
        row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        rb, _ = sch.split(row, [None, m])
        keep = {block_name(sch, b) for b in root_blocks(sch) if PREPROC_ANNOTATION in sch.get(b).annotations}
        keep |= {after[-1], plan["inter"], *plan["first"], *norm_blocks}
        for b in reversed([b for b in root_blocks(sch) if block_name(sch, b) not in keep]):
            sch.compute_at(b, rb, preserve_unit_loops=True)
        if channels_first:
            # channel outer, the block's rows inner: each channel's rows are one contiguous run of the output
            # (the accumulator rows are read with a stride of n2 from L0C, which stays in cache)
            ri, ci = sch.get_loops(out)[-2:]
            sch.reorder(ci, ri)
        innermost_vector(sch, out, lanes)
        if cores > 1 and -(-rows // m) > 1:
            sch.parallel(rb)              # before any decompose_reduction (parallel needs whole reductions)

        # the second product walks the intermediate one column panel at a time (its reduction axis), the
        # panel loop outside its row and column loops: the panel is computed (first product(s) + activation)
        # right before it, in UB; the accumulator rows are zeroed once per row block (the init, above the
        # panel loop)
        sloops = sch.get_loops(second)
        at = next(i for i, l in enumerate(sloops) if sch.get(l).same_as(sch.get(rb)))
        red = next(l for l in sloops[at + 1:] if loop_of_reduction(sch, second, l))
        skp, _ = sch.split(red, [None, panel])
        sloops = sch.get_loops(second)
        sch.reorder(skp, *[l for l in sloops[at + 1:] if not loop_of_reduction(sch, second, l)])
        sch.compute_at(inter, skp, preserve_unit_loops=True)
        sch.set_scope(inter, 0, UB_SCOPE)
        innermost_vector(sch, inter, lanes)
        for f in first:
            sch.compute_at(f, skp, preserve_unit_loops=True)
            sch.set_scope(f, 0, UB_SCOPE)
            tile_product(sch, f, mr1, nvec1, v1, whole=True)
        tile_product(sch, second, mr2, nvec2, v2, whole=False)
        if norm["out"]:
            # the block's normalised rows, once per row block (their consumers, the first products, are now
            # under the row-block loop), staged in L1 for every panel; row sums and scales in UB. In UB (one
            # allocation with the panels) LLVM could not tell them from the register tiles the first products
            # store there and kept every tile in memory (the LLaMA FFN ran much slower)
            for n in reversed(norm_blocks):
                sch.compute_at(get(n), rb, preserve_unit_loops=True)
                try_(sch.set_scope, get(n), 0, L1_SCOPE if n == norm["out"] else UB_SCOPE)
        init = sch.decompose_reduction(second, skp)   # after the tiling: vectorize needs the whole reduction
        innermost_vector(sch, init, lanes)
        for n in norm_blocks:
            if n in rf_names:
                vectorize_partial_sums(sch, get(n))
            elif not has_reduce(sch, get(n)):
                innermost_vector(sch, get(n), lanes)
        for n in after[:-1]:
            blk = try_(get, n)
            if blk is None:
                continue                              # inlined
            if not is_output_block(sch, blk):
                try_(sch.set_scope, blk, 0, UB_SCOPE)
            if not has_reduce(sch, blk):
                innermost_vector(sch, blk, lanes)
        note = f"row block {m} rows, intermediate panel {panel}, tiles {mr1}x{nvec1 * v1} / {mr2}x{nvec2 * v2}"
        if norm["out"]:
            note += (f", norm prologue: normalised input rows staged in L1 "
                     f"({staged_rows_bytes(m, k1, target, target.element_bytes('float32'))} B of {target.capacity(L1_SCOPE)} B)")
        sch.annotate(second, "ascendfuse.schedule", note)
        return Scheduled(sch, note)


def _channels_first_output(sch, loops, rows: int, n2: int) -> bool:
    """Whether the output block's loops are (N, C, spatial...) over the product's (N x spatial) rows and its
    C = n2 columns, rather than rows x columns (the row-major case wins when both extents fit)."""
    ext = [extent(sch, l) for l in loops]
    if len(ext) < 3 or any(e is None for e in ext):
        return False
    if math.prod(ext[:-1]) == rows and ext[-1] == n2:
        return False
    return ext[1] == n2 and ext[0] * math.prod(ext[2:]) == rows


def _aligned_row_block(dims, cap: int) -> int | None:
    """The largest row block not above ``cap`` made of whole inner row loops: a divisor of the innermost
    non-unit extent, or all of it times a divisor of the next, and so on. None for rows in one loop."""
    dims = [d for d in dims if d != 1]
    if len(dims) < 2:
        return None
    inner, best = 1, 1
    for d in reversed(dims):
        c = largest_divisor(d, max(1, cap // inner))
        best = max(best, inner * c)
        if c < d:
            break
        inner *= d
    return best
