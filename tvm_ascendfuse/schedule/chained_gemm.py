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
  could not tell the tile from the panel it reads and stored the tile after every FMA (1.6x slower);
* after the last panel, the epilogue (bias, residual; recomputed where read) and, when present, the row
  norm run on the accumulator rows, and the rows are written out.

With a row norm in front of the first product(s) (RMSNorm/LayerNorm over the last axis, read only by them),
each row block starts by normalising its rows: the row sums of squares (and sums) as vector partial sums,
the per-row scale, then the normalised rows into one ``m x k`` buffer in ``local.L1`` (the cube's operand
buffer on the NPU) that every panel's first product(s) read, so the norm is computed once per row and its
output never goes to GM.

The intermediate never exists in GM, nor whole in UB; the weights are read once per row block (pre-packed at
compile time into the order the tiles read them). ``m`` comes from ``grouping/chain.chain_row_block`` (the
same UB budget the grouping pass checked), cut to what L0C holds, to a divisor of the row count and to
rows / host cores. The weights are streamed once per row block: with UB's budget (``m`` = 32 rows for a
768- or 1024-wide output) that is rows / 32 times per call, against about once for two separate GEMMs.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..target import AscendTarget, get_target
from ..tiling import PANEL_COLS as PANEL
from ..tiling import chain_row_block, staged_rows_bytes
from .base import L0C_SCOPE, L1_SCOPE, UB_SCOPE, ScheduleRule
from .common import (
    extent,
    innermost_vector,
    is_output_block,
    num_cores,
    ok,
    root_blocks,
    try_,
    vector_lanes,
    vector_width_for,
)
from .contraction import _get_realize, _prepack_weight, loops_by_iter, micro_tile
from .layout import PREPROC_ANNOTATION, mark_prepack, packable_param
from .reduction import is_contraction

ACCUMULATORS = 16     # vector registers for a register block's partial sums (half of AVX-512's 32)


def _has_reduce(sch, block) -> bool:
    return any(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(block).iter_vars)


def _name(sch, block) -> str:
    return sch.get(block).name_hint


def _closure(sch, start, step) -> set:
    """Names of the blocks reachable from ``start`` through ``step`` (get_producers / get_consumers)."""
    seen, stack = set(), [start]
    while stack:
        for b in step(stack.pop()):
            n = _name(sch, b)
            if n not in seen:
                seen.add(n)
                stack.append(b)
    return seen


def _largest_divisor(n: int, cap: int) -> int:
    for d in range(max(1, min(n, cap)), 0, -1):
        if n % d == 0:
            return d
    return 1


class ChainedGemmRule(ScheduleRule):
    """First product(s) -> elementwise -> second product (+ injective epilogue, + row norm), per row block."""

    name = "chained-matmul"
    min_products = 2

    def __init__(self):
        self.note = None

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        self.note = None
        if not float32_only(func):
            return None
        sch = s_tir.Schedule(func)
        plan = self._plan(sch)
        if plan is None:
            return None
        target = target if isinstance(target, AscendTarget) else get_target(target)
        return self._schedule(sch, plan, target, host)

    # ---- recognise ------------------------------------------------------------------------------------------
    def _plan(self, sch):
        blocks = list(root_blocks(sch))
        last = blocks[-1]
        if _has_reduce(sch, last) and is_output_block(sch, last) and is_contraction(sch, last):
            sch.cache_write(last, 0, "global")      # the product writes the output: give it a copy-out stage
            blocks = list(root_blocks(sch))
        names = [_name(sch, b) for b in blocks]
        products = [n for b, n in zip(blocks, names) if _has_reduce(sch, b) and is_contraction(sch, b)]
        if len(products) < 2:
            return None
        by_name = dict(zip(names, blocks))
        ups = {n: _closure(sch, by_name[n], sch.get_producers) for n in products}
        seconds = [n for n in products if any(p in ups[n] for p in products if p != n)]
        if len(seconds) != 1:
            return None
        second = seconds[0]
        first = [p for p in products if p in ups[second]]
        if len(first) + 1 != len(products) or len(first) > 2 or any(set(first) & ups[p] for p in first):
            return None
        # the intermediate: the one block the second product reads that depends on the first product(s)
        direct = [_name(sch, b) for b in sch.get_producers(by_name[second])]
        inter = [n for n in direct if n in first or set(first) & _closure(sch, by_name[n], sch.get_producers)]
        if len(inter) != 1 or inter[0] in first:
            return None                  # a product feeding the next one directly: no activation, not handled
        inter = inter[0]
        between = _closure(sch, by_name[inter], sch.get_producers)
        down_of_first = set().union(*(_closure(sch, by_name[f], sch.get_consumers) for f in first))
        chain = (between & down_of_first) - set(first)
        if any(_has_reduce(sch, by_name[n]) or is_output_block(sch, by_name[n]) for n in chain | {inter}):
            return None
        after = _closure(sch, by_name[second], sch.get_consumers)
        pro = [n for n in names if n not in chain and n not in after and n not in first
               and n not in (second, inter)]
        norm = self._norm_prologue(sch, by_name, pro, first)
        if norm is None:
            return None
        outputs = [n for n in names if is_output_block(sch, by_name[n])]
        if len(outputs) != 1 or outputs[0] != names[-1] or names[-1] not in after:
            return None
        return {"first": first, "second": second, "inter": inter, "chain": sorted(chain),
                "pro": [n for n in pro if n not in norm["stage"]], "norm": norm,
                "after": [n for n in names if n in after]}

    @staticmethod
    def _norm_prologue(sch, by_name, pro, first):
        """The row norm in front of the first product(s): ``{"stage": blocks from its reductions to the
        normalised rows, "out": the block the products read}`` (``out`` None without a norm); None when the
        prologue has reductions of another shape (not over the row's last axis, or read elsewhere)."""
        reds = [n for n in pro if _has_reduce(sch, by_name[n])]
        if not reds:
            return {"stage": [], "out": None}
        stage = set(reds)
        for n in reds:
            stage |= _closure(sch, by_name[n], sch.get_consumers) & set(pro)
        feeding = {n for n in stage if set(first) & {_name(sch, c) for c in sch.get_consumers(by_name[n])}}
        if len(feeding) != 1 or any(not _reduces_row(sch, by_name[n]) for n in reds):
            return None
        out = feeding.pop()
        for n in stage:                 # the normalised rows feed the first product(s) and nothing else
            users = {_name(sch, c) for c in sch.get_consumers(by_name[n])}
            if not users <= stage | set(first) or (n != out and users & set(first)):
                return None
        if not set(first) <= {_name(sch, c) for c in sch.get_consumers(by_name[out])}:
            return None
        return {"stage": [n for n in pro if n in stage], "out": out}

    # ---- schedule -------------------------------------------------------------------------------------------
    def _schedule(self, sch, plan, target: AscendTarget, host):
        get = sch.get_sblock
        for n in plan["pro"] + plan["chain"]:          # layout prologue; bias + activation into the panel
            if not ok(sch.compute_inline, get(n)):
                return None
        norm_blocks, rf_names = self._norm_stage(sch, plan["norm"], vector_lanes(host, 32))
        if norm_blocks is None:
            return None
        after = plan["after"]
        for n in after[:-1]:                           # bias, residual: recomputed where the rows are read
            if not _has_reduce(sch, get(n)) and not is_output_block(sch, get(n)):
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
        panel = v1 * _largest_divisor(n1 // v1, max(1, PANEL // v1))
        norm = plan["norm"]
        k1 = fdom[-1]
        norm_after = any(_has_reduce(sch, get(n)) for n in after if try_(get, n) is not None)
        check = chain_row_block(n1, n2, panel, len(first), rows, target, 4,
                                staged_row=k1 if norm["out"] else 0, norm_after=norm_after)
        if not check.fits:
            self.note = f"one row needs {check.needed_bytes} B of UB > {check.available_bytes} B"
            return None
        cores = num_cores(host)
        m = _largest_divisor(rows, min(check.tile_elems, max(1, rows // max(1, cores))))
        # the accumulator rows in L0C (the cube accumulates there across the panels) when they fit, else UB
        acc_row = target.align_up(n2 * 4, "l0c")
        acc_scope = L0C_SCOPE if acc_row <= target.capacity(L0C_SCOPE) else UB_SCOPE
        if acc_scope == L0C_SCOPE:
            m = _largest_divisor(rows, min(m, target.capacity(L0C_SCOPE) // acc_row))

        # weights pre-packed into the column panels the register blocks walk
        v2 = vector_width_for(n2, lanes)
        mr1, nvec1 = micro_tile(m, panel, v1, ACCUMULATORS)
        mr2, nvec2 = micro_tile(m, n2, v2, ACCUMULATORS)
        nvec1 = _largest_divisor(panel // v1, nvec1)
        nvec2 = _largest_divisor(n2 // v2, nvec2)
        mr1, mr2 = _largest_divisor(m, mr1), _largest_divisor(m, mr2)
        for f in first:
            self._prepack(sch, f, nvec1 * v1)
        self._prepack(sch, second, nvec2 * v2, panel)

        # the second product accumulates into the m x n2 accumulator rows, panel after panel. Its own scope
        # (L0C) is also what keeps its register tiles in registers on the host: in one UB allocation with
        # the panel it reads, LLVM could not prove them apart and stored the tile after every FMA (1.6x)
        sch.set_scope(second, 0, acc_scope)

        # anchor: rows of the output block, m at a time; every other stage at that row-block loop
        out = get(after[-1])
        loops = sch.get_loops(out)
        if len(loops) < 2 or math.prod(extent(sch, l) or 0 for l in loops[:-1]) != rows:
            return None
        row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        rb, _ = sch.split(row, [None, m])
        keep = {_name(sch, b) for b in root_blocks(sch) if PREPROC_ANNOTATION in sch.get(b).annotations}
        keep |= {after[-1], plan["inter"], *plan["first"], *norm_blocks}
        for b in reversed([b for b in root_blocks(sch) if _name(sch, b) not in keep]):
            sch.compute_at(b, rb, preserve_unit_loops=True)
        innermost_vector(sch, out, lanes)
        if cores > 1 and rows // m > 1:
            sch.parallel(rb)              # before any decompose_reduction (parallel needs whole reductions)

        # the second product walks the intermediate one column panel at a time (its reduction axis), the
        # panel loop outside its row and column loops: the panel is computed (first product(s) + activation)
        # right before it, in UB; the accumulator rows are zeroed once per row block (the init, above the
        # panel loop)
        sloops = sch.get_loops(second)
        at = next(i for i, l in enumerate(sloops) if sch.get(l).same_as(sch.get(rb)))
        red = next(l for l in sloops[at + 1:] if _loop_of_reduction(sch, second, l))
        skp, _ = sch.split(red, [None, panel])
        sloops = sch.get_loops(second)
        sch.reorder(skp, *[l for l in sloops[at + 1:] if not _loop_of_reduction(sch, second, l)])
        sch.compute_at(inter, skp, preserve_unit_loops=True)
        sch.set_scope(inter, 0, UB_SCOPE)
        innermost_vector(sch, inter, lanes)
        for f in first:
            sch.compute_at(f, skp, preserve_unit_loops=True)
            sch.set_scope(f, 0, UB_SCOPE)
            self._tile(sch, f, mr1, nvec1, v1, whole=True)
        self._tile(sch, second, mr2, nvec2, v2, whole=False)
        if norm["out"]:
            # the block's normalised rows, once per row block (their consumers, the first products, are now
            # under the row-block loop), staged in L1 for every panel; row sums and scales in UB. In UB (one
            # allocation with the panels) LLVM could not tell them from the register tiles the first products
            # store there and kept every tile in memory: the W7 FFN ran 1.45x slower
            for n in reversed(norm_blocks):
                sch.compute_at(get(n), rb, preserve_unit_loops=True)
                try_(sch.set_scope, get(n), 0, L1_SCOPE if n == norm["out"] else UB_SCOPE)
        init = sch.decompose_reduction(second, skp)   # after the tiling: vectorize needs the whole reduction
        innermost_vector(sch, init, lanes)
        for n in norm_blocks:
            if n in rf_names:
                _vectorize_partial_sums(sch, get(n))
            elif not _has_reduce(sch, get(n)):
                innermost_vector(sch, get(n), lanes)
        for n in after[:-1]:
            blk = try_(get, n)
            if blk is None:
                continue                              # inlined
            if not is_output_block(sch, blk):
                try_(sch.set_scope, blk, 0, UB_SCOPE)
            if not _has_reduce(sch, blk):
                innermost_vector(sch, blk, lanes)
        self.note = f"row block {m} rows, intermediate panel {panel}, tiles {mr1}x{nvec1 * v1} / {mr2}x{nvec2 * v2}"
        if norm["out"]:
            self.note += (f", norm prologue: normalised input rows staged in L1 "
                          f"({staged_rows_bytes(m, k1, target)} B of {target.capacity(L1_SCOPE)} B)")
        sch.annotate(second, "ascendfuse.schedule", self.note)
        return sch

    @staticmethod
    def _norm_stage(sch, norm, lanes):
        """Shape the norm prologue before anything moves: full-row intermediates inlined into the normalised
        rows (the block the products read), per-row values (sums, rsqrt) kept, each row sum split into
        ``lanes`` vector partial sums (rfactor needs the reduction at the root). Returns the remaining
        blocks of the stage in order and the names of the partial-sum blocks."""
        if not norm["out"]:
            return [], set()
        get = sch.get_sblock
        for n in norm["stage"]:
            blk = get(n)
            full_row = n != norm["out"] and not _has_reduce(sch, blk) and _is_full_row(sch, blk, get(norm["out"]))
            if full_row and not ok(sch.compute_inline, blk):
                return None, None
        rf_names = lane_partials(sch, norm["stage"], lanes)
        blocks = [_name(sch, b) for b in root_blocks(sch)]
        stage = set(norm["stage"]) | rf_names
        return [n for n in blocks if n in stage], rf_names

    @staticmethod
    def _prepack(sch, block, nr, panel=None):
        """Constant weight ``W[k, n]`` re-laid out at compile time into the order the register blocks read it:
        ``(N/nr, K, nr)``; with ``panel`` (the second product, read one K panel at a time)
        ``(K/panel, N/nr, panel, nr)``, so one panel of all output columns is one contiguous slab."""
        stmt = sch.get(block)
        kinds = [iv.iter_type for iv in stmt.iter_vars]
        spatial = [iv.var for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.DataPar]
        red = [iv.var for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.CommReduce]
        if nr <= 1 or not spatial or len(red) != 1:
            return
        if panel is None:
            _prepack_weight(sch, block, spatial[-1], red[0], nr)
            return
        for idx, region in enumerate(stmt.reads):
            mins = [r.min for r in region.region]
            if len(mins) == 2 and all(isinstance(x, tirx.Var) for x in mins) and mins[0].same_as(red[0]) \
                    and mins[1].same_as(spatial[-1]):
                shape = [int(d) for d in region.source.shape]
                if packable_param(sch, region.source) is None or shape[1] % nr or shape[0] % panel:
                    return
                try_(mark_prepack, sch, block, idx, lambda k, n: (k // panel, n // nr, k % panel, n % nr))
                return

    @staticmethod
    def _tile(sch, block, mr, nvec, v, whole):
        """Register block ``mr x (nvec*v)``: loops ``j0, i0, k0, i1, j1, j2``, i1/j1 unrolled, j2 the
        vector. ``whole``: the block's reduction is complete under its loops, its accumulator tile is a UB
        buffer written back per tile (cache_write); else (the second product, its reduction split across
        panels) the block accumulates into its accumulator rows in place, and the caller decomposes its init
        above the panel loop; LLVM keeps the tile in registers over the ``k`` loop."""
        stmt = sch.get(block)
        kinds = [iv.iter_type for iv in stmt.iter_vars]
        spatial = [i for i, k in enumerate(kinds) if k == tirx.IterVar.DataPar]
        red = next(i for i, k in enumerate(kinds) if k == tirx.IterVar.CommReduce)
        by_iter = loops_by_iter(sch, block)
        i_loop, j_loop, k_loop = by_iter[spatial[-2]], by_iter[spatial[-1]], by_iter[red]
        i0, i1 = sch.split(i_loop, [None, mr])
        j0, j1, j2 = sch.split(j_loop, [None, nvec, v])
        # K is not unrolled: unrolling it by 4 ran no faster and cost W7's FFN kernel 14 ms of LLVM time
        k0 = k_loop
        sch.reorder(j0, i0, k0, i1, j1, j2)
        if v > 1:
            ok(sch.vectorize, j2)
        ok(sch.unroll, j1)
        ok(sch.unroll, i1)
        if whole:
            copy = sch.cache_write(block, 0, UB_SCOPE)
            sch.reverse_compute_at(copy, i0, preserve_unit_loops=True)
            innermost_vector(sch, copy, v)
            init = try_(sch.decompose_reduction, block, k0)
            if init is not None:
                innermost_vector(sch, init, v)
        return i0


def lane_partials(sch, names, lanes: int) -> set:
    """Each row reduction among the blocks ``names`` split into vector-wide partial sums (rfactor, at the root,
    before anything moves: it needs the reduction to head its loop nest) plus a short final sum; returns the
    names of the partial-sum blocks. Rows shorter than two vectors of at least 4 lanes stay scalar."""
    out = set()
    for n in names:
        blk = try_(sch.get_sblock, n)
        if blk is None or not _has_reduce(sch, blk):
            continue
        loops = sch.get_loops(blk)
        ext = extent(sch, loops[-1])
        v = vector_width_for(ext, lanes)
        if ext is None or v < 4 or ext < 2 * v:
            continue
        _, ki = sch.split(loops[-1], [None, v])
        rf = try_(sch.rfactor, ki, len(sch.get(blk).iter_vars) - 1)
        if rf is not None:
            out.add(_name(sch, rf))
    return out


def float32_only(func: tirx.PrimFunc) -> bool:
    """Every buffer parameter is float32 (the register blocks and the UB row budgets assume 4 B)."""
    return all(str(p.ty.dtype) == "float32" for p in func.params if isinstance(p.ty, tirx.BufferType))


def _reduces_row(sch, block) -> bool:
    """A row reduction over the last axis: one reduction variable, indexing only the last axis of every
    buffer it reads, under a loop of its own that is the block's innermost."""
    stmt = sch.get(block)
    reds = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reds) != 1 or stmt.iter_vars[-1].iter_type != tirx.IterVar.CommReduce:
        return False
    for region in stmt.reads:
        uses = [reds[0].name in {v.name for v in _vars_of(r.min)} for r in region.region]
        if any(uses[:-1]) or (any(uses) and not uses[-1]):
            return False
    return True


def _vars_of(expr):
    from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

    return collect_vars_used_in_prim_expr(expr)


def _is_full_row(sch, block, like) -> bool:
    """Does ``block`` write a tensor of the same size as ``like`` (a full row per row, not a per-row value)?"""
    def size(b):
        return math.prod(int(d) for d in sch.get(b).writes[0].source.ty.shape)

    return size(block) == size(like)


def _vectorize_partial_sums(sch, rf) -> None:
    """A partial-sum block (rfactor) under the row loop: its lane axis innermost and vectorised, the
    reduction over the row's chunks outside it, its init split off."""
    realize = _get_realize(sch, rf)
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


def _loop_of_reduction(sch, block, loop) -> bool:
    """Does ``loop`` drive a reduction iterator of ``block``?"""
    from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

    realize = _get_realize(sch, block)
    name = sch.get(loop).loop_var.name
    for iv, val in zip(realize.block.iter_vars, realize.iter_values):
        if iv.iter_type == tirx.IterVar.CommReduce and name in {v.name for v in collect_vars_used_in_prim_expr(val)}:
            return True
    return False
