"""Row reductions with prologue/epilogue: LayerNorm, RMSNorm, softmax, add+norm, mean/sum/max, global pools.

One row at a time: every block is computed at the row loop of the last block, so a row's intermediates
(the ``x + r`` row, the exponentials of softmax, the partial sums) live in ``local.UB`` and the input is
read from GM once. Sums and maxima are vectorised with ``rfactor`` into lane-wide partials, which must
happen *before* ``compute_at`` (rfactor needs the reduction block to head its loop nest). Tunable: the
reduction rule samples how many vectors of partials a row keeps (independent accumulators). When a row does
not fit UB the row tensor is not staged: it streams from GM (the report notes it).
"""

from __future__ import annotations

import math
import re

import tvm_ffi
from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import conv_block_head, is_contraction, leading_spatial, uses_var
from .bf16_gemm import bf16_gemm_root
from .base import UB_SCOPE, ScheduleRule, Scheduled
from .common import (new_schedule, block_infos, blocks_under, buffer_bytes, extent, on_chip_bytes, get_realize, innermost_vector, is_output_block,
                     largest_divisor, loops_through, num_cores, ok, parallel_vector, root_blocks,
                     still_exists, transitive_producers, try_, vector_lanes, vector_storable, vector_width_for)
from .contraction import (contiguous_along_output, inline_operand_chain, micro_tile, pad_output_axis,
                          producer_to_stage, schedule_contraction, schedule_gemm_root)
from .injective import tile_injective
from .partial_sums import vectorize_rf

MIN_PARALLEL_ELEMENTS = 16384

_annotate_access = tvm_ffi.get_global_func("s_tir.schedule.ScheduleAnnotateBufferAccess")


class ReductionRule(ScheduleRule):
    """Blocks with shared leading spatial (row) axes, at least one reducing the trailing axes."""

    name = "reduction"
    tunable = True      # width of the partial sums: ``tiles`` chooser (base.ScheduleRule), ``schedule_rows``

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | None:
        return self.schedule(new_schedule(func), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> Scheduled | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        infos = block_infos(sch)
        if not infos or not any(b.is_reduction() for b in infos):
            return None
        kinds = [b.dom_kind() for b in infos]
        if any(not re.fullmatch(r"S+R*", k) for k in kinds):
            return None
        if any(b.is_reduction() and is_contraction(sch, b.block_rv) for b in infos):
            return None
        done, note = schedule_rows(sch, infos, target, host, choose=self.choose)
        return Scheduled(sch, note) if done else None


class GemmNormRule(ScheduleRule):
    """One GEMM (+ injective epilogue: bias, residual) whose output feeds row reductions: matmul + bias +
    residual + LayerNorm/RMSNorm in one kernel, or attention's scores + softmax. The GEMM runs as its own
    register-blocked stage over all rows (``contraction.schedule_gemm_root``), then the norm one row at a
    time with the row being normalised in UB; a residual sum that is also an output is a stage of its own
    between them.

    Two operand steps come first. An operand whose producers, inlined, would make the GEMM read it with a
    stride along the vectorised output axis (attention's Kᵀ cut from a packed Q|K|V projection: one gather
    per lane) is computed once, whole, as a stage in front of the GEMM (``contraction.producer_to_stage``).
    An output axis that no full host vector divides (1500 keys: 4-lane vectors) is zero-padded to whole
    register blocks of full vectors (``contraction.pad_output_axis``); the padding is written by the
    operand's stage itself, and the norm reads the padded result in place. When the GEMM's second operand
    stays in cache and its result would not (attention's scores over 1500 keys: 54 MB), the GEMM runs per
    block of rows under the norm's row loop instead, right before the norm of those rows (``_row_block``).
    Tunable: the GEMM's register block is a sampled decision (``contraction.gemm_root_candidates``)."""

    name = "matmul+norm"
    min_products = 1
    tunable = True      # the GEMM's register block: ``tiles`` chooser (base.ScheduleRule)

    def __init__(self, tiles=None, row_blocks: bool = True):
        """``row_blocks``: compute the GEMM per block of rows right before the norm of those rows when its
        whole second operand stays in cache (``_row_block``); False: always as a stage over all rows."""
        super().__init__(tiles)
        self.row_blocks = row_blocks

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | None:
        return self.schedule(new_schedule(func), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> Scheduled | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        found = self._shape(sch)
        if found is None:
            return None
        lanes = vector_lanes(host, 32)
        staged = self._stage_operands(sch, found[0], found[1], lanes)
        if staged:
            found = self._shape(sch)       # the blocks changed: read them again
            if found is None:
                return None
        infos, gi, first_red = found
        # bias/residual chain: all but its last block inlined; the last (the normalised tensor) is staged
        chain = infos[gi + 1:first_red]
        outs = [pos for pos, b in enumerate(chain) if is_output_block(sch, b.block_rv)]
        # On the host the GEMM runs as its own register-blocked stage over all rows (its weight panel is
        # reused by every row; per row block a weight bigger than the cache would be re-streamed from
        # memory), then the norm per row; per row block only when the weight panel stays in cache.
        # A residual sum that is also an output must be a stage of its own too (TIR cannot compute an output
        # block per row step between its producer and consumers).
        return self._split_stages(sch, infos, gi, first_red, outs[-1] if outs else -1, target, host, staged)

    @staticmethod
    def _shape(sch):
        """(block infos, index of the GEMM, index of the first row reduction after it), or None when the
        kernel is not one GEMM + injective chain + row reductions."""
        # A conv's three reduction iterators leave it to the untiled contraction below: scalar, far slower
        # than the conv rule's tiles (Swin's 4x4 patch conv + LayerNorm ran 25x the two apart; DLA's strided
        # conv beside a max-pool 2.3 GFLOP/s). Checked before the normal form, which drops a batch of 1 and
        # leaves the conv block too few iterators to be recognised as one.
        if any(conv_block_head(sch.get(b)) is not None for b in root_blocks(sch)):
            return None
        infos = block_infos(sch)
        if not infos:
            return None
        products = [i for i, b in enumerate(infos) if b.is_reduction() and is_contraction(sch, b.block_rv)]
        if len(products) != 1:
            return None
        gi = products[0]
        if conv_block_head(sch.get(infos[gi].block_rv)) is not None:
            return None
        first_red = next((i for i in range(gi + 1, len(infos)) if infos[i].is_reduction()), None)
        if first_red is None or any(b.is_reduction() for b in infos[:gi]):
            return None
        if any(not b.is_injective() for b in infos[gi + 1:first_red]):
            return None
        return infos, gi, first_red

    @staticmethod
    def _stage_operands(sch, infos, gi, lanes) -> set[str]:
        """Stage the operands the GEMM would read strided along its vector axis, pad that axis to full
        vectors; the names of the blocks now computed in front of the GEMM (not to be inlined)."""
        gemm = infos[gi].block_rv
        gemm_name = sch.get(gemm).name_hint
        pro = [b.block_rv for b in infos[:gi]]
        staged = {}                                         # operand buffer name -> stage block name
        for region in sch.get(gemm).reads:
            if region.source.same_as(sch.get(gemm).writes[0].source):
                continue

            def inline(probe, probe_pro, operand=region.source):
                mine = [b for b in probe_pro if probe.get(b).writes
                        and probe.get(b).writes[0].source.name == operand.name]
                for b in mine:
                    for p in reversed([*transitive_producers(probe, b), b]):
                        if not is_output_block(probe, p):
                            probe.compute_inline(p)

            blk = producer_to_stage(sch, pro, region.source, inline,
                                    lambda probe: contiguous_along_output(probe, probe.get_sblock(gemm_name)))
            if blk is not None and not is_output_block(sch, blk):
                inline_operand_chain(sch, blk)
                staged[region.source.name] = sch.get(blk).name_hint
        pads = pad_output_axis(sch, sch.get_sblock(gemm_name), lanes) or []
        names = set(staged.values())
        for pad in pads:
            # the operand's stage writes the padded operand itself: gather, pad and lay out in one pass
            src = {r.source.name for r in sch.get(pad).reads}
            for operand in src & set(staged):
                if ok(sch.compute_inline, sch.get_sblock(staged[operand])):
                    names.discard(staged[operand])
            names.add(sch.get(pad).name_hint)
        return names

    def _split_stages(self, sch, infos, gi, first_red, last_out, target, host, staged):
        gemm = infos[gi]
        chain = infos[gi + 1:first_red]
        stages = [b for b in infos[:gi] if b.name in staged]
        for b in infos[:gi] + chain[:max(0, last_out)]:          # in front of the residual output
            if not is_output_block(sch, b.block_rv) and b.name not in staged:
                ok(sch.compute_inline, b.block_rv)
        also = []
        rest = chain[last_out + 1:]
        for pos, b in enumerate(rest):
            if pos == len(rest) - 1 or not ok(sch.compute_inline, b.block_rv):
                ok(sch.set_scope, b.block_rv, 0, UB_SCOPE)      # the row being normalised, per row in UB
                also.append(b.name)
        lanes = vector_lanes(host, 32)
        rb = self._row_block(sch, gemm.block_rv, infos[first_red:], lanes, target) \
            if self.row_blocks and last_out < 0 and not also else 1
        done, rows_note = schedule_rows(sch, infos[first_red:], target, host, also=also, row_block=rb)
        if not done:
            return None
        for b in stages:
            parallel_vector(sch, b.block_rv, lanes)
        for b in chain[:max(0, last_out + 1)]:
            # (the chain in front of the output was inlined above: only the output block is left)
            if still_exists(sch, b.block_rv) and is_output_block(sch, b.block_rv):
                tile_injective(sch, b.block_rv, target, host, stage=True)
        under = self._gemm_at_row_blocks(sch, gemm.block_rv) if rb > 1 else None
        if under is not None:
            schedule_gemm_root(sch, gemm.block_rv, lanes, 1, choose=self.choose, under=under)
            return Scheduled(sch, rows_note)
        dot = bf16_gemm_root(sch, gemm.block_rv, host)
        if dot is not None:
            return Scheduled(sch, "; ".join(n for n in (dot, rows_note) if n))
        if not schedule_gemm_root(sch, gemm.block_rv, lanes, num_cores(host), choose=self.choose):
            # (declined before its tile decision) no register block to tune: a space of one point
            self.choose(sch, "untiled", lambda: ["untiled"])
            # odd output width: no register tile, still reduction-outside loops and parallel rows
            schedule_contraction(sch, gemm.block_rv, lanes)
            loops = sch.get_loops(gemm.block_rv)
            if num_cores(host) > 1 and loops:
                ok(sch.parallel, loops[0])
        if last_out >= 0:
            return Scheduled(sch, "residual sum is a second output: GEMM and residual run as separate stages, "
                                  "the norm per row")
        return Scheduled(sch, rows_note)

    @staticmethod
    def _row_block(sch, gemm, row_infos, lanes: int, target: AscendTarget) -> int:
        """Rows of the GEMM to compute right before the norm of those rows (1: the GEMM is a stage over all
        rows). Only when the GEMM's second operand (one batch of it: attention's Kᵀ of one head) and a block
        of the result fit the target's L1 together (the host's L2), so that every block of rows reads the
        operand from cache, not memory, and the result never round-trips through memory (attention's scores
        over 1500 keys are 54 MB). The block: the most rows, a multiple of the register block's rows
        dividing the GEMM's rows, that fit."""
        stmt = sch.get(gemm)
        spatial = [i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == tirx.IterVar.DataPar]
        red = [i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
        if len(red) != 1 or len(spatial) < 2 or is_output_block(sch, gemm):
            return 1
        dims = [iv.dom.extent for iv in stmt.iter_vars]
        if any(not isinstance(d, tirx.IntImm) for d in dims):
            return 1
        m, n, k = int(dims[spatial[-2]]), int(dims[spatial[-1]]), int(dims[red[0]])
        rows = [int(dims[i]) for i in spatial[:-1] if int(dims[i]) != 1]
        nbytes = buffer_bytes(stmt.writes[0].source)
        panel = k * n * nbytes
        # the norm's rows must be the GEMM's rows (the same leading axes): one block of GEMM rows per block
        # of norm rows; and the result must not fit the cache anyway (else there is no round trip to save)
        last = row_infos[-1]
        nrow = min(leading_spatial(b.dom_kind()) for b in row_infos)
        if nrow < 1 or [d for d in last.dom()[:nrow] if d != 1] != rows or panel >= target.l1_bytes \
                or math.prod(rows) * n * nbytes <= target.l1_bytes:
            return 1
        mr, _ = micro_tile(m, n, vector_width_for(n, lanes))
        mr = mr if m % mr == 0 else largest_divisor(m, mr)
        fits = [r for r in range(mr, m + 1, mr) if m % r == 0 and panel + r * n * nbytes <= target.l1_bytes]
        return max(fits) if fits else 1

    @staticmethod
    def _gemm_at_row_blocks(sch, gemm):
        """Compute the GEMM under the row-block loop of the norm (the kernel's last root loop): the
        norm's blocks are told they read whole padded rows of the GEMM's result (so the block of the GEMM
        keeps its full-vector width), then the GEMM is computed there. The loop, or None when TVM refused
        (the GEMM then stays a stage over all rows)."""
        outer = sch.get_loops(root_blocks(sch)[-1])[0]
        result = sch.get(gemm).writes[0].source
        width = result.ty.shape[-1]
        for blk in blocks_under(sch, outer):
            stmt = sch.get(blk)
            for idx, region in enumerate(stmt.reads):
                if region.source.same_as(result):
                    bounds = [x for r in region.region[:-1] for x in (r.min, r.min + r.extent)] + [0, width]
                    # (the primitive itself: its Python wrapper wants one range per block iterator, not per
                    # buffer axis)
                    region_map = tirx.IndexMap([iv.var for iv in stmt.iter_vars], bounds, None)
                    if not ok(_annotate_access, sch, blk, idx, 0, region_map):
                        return None
        if not ok(sch.compute_at, gemm, outer, preserve_unit_loops=True):
            return None
        return outer


# Widths of the partial sums a tuner may try, in host vectors (independent accumulators per row).
PARTIAL_VECTORS = (1, 2, 4)


def partial_width_candidates(reductions: list[tuple[int, int]]) -> list[int]:
    """Vectors of partial sums per row reduction (``reductions``: (extent, vector width) of each vectorised
    one): 1 (the rule's) first, then each count of PARTIAL_VECTORS whose partials divide every vectorised
    reduction of the row and leave it two steps at least."""
    return [k for k in PARTIAL_VECTORS if all(e % (v * k) == 0 and e >= 2 * v * k for e, v in reductions)]


def partials_width(ext: int | None, lanes: int) -> int:
    """Lanes of a row reduction's partials: ``vector_width_for``'s power of two, unless no full vector divides
    the row; then the divisor of the row, a multiple of 4 between one and four full vectors, that fills the
    vectors LLVM splits it into best (1500 keys: 60 lanes, four AVX-512 vectors nearly full, against 375
    steps of 4-lane ones)."""
    v = vector_width_for(ext, lanes)
    if ext is None or v == lanes:
        return v
    best, fill = v, v / lanes
    for w in range(4 * lanes, lanes, -4):
        if ext % w == 0 and ext >= 2 * w and w / (-(-w // lanes) * lanes) > fill:
            best, fill = w, w / (-(-w // lanes) * lanes)
    return best


def schedule_rows(sch: s_tir.Schedule, infos, target: AscendTarget, host, also=(), choose=None, row_block: int = 1
                  ) -> tuple[bool, str | None]:
    """Schedule the blocks of ``infos`` (a row-reduction stage; other blocks of the function are left
    alone) one row at a time. ``also``: names of producer blocks to compute per row too (the row being
    normalised after a GEMM). Returns (done, note): done is False when the stage does not have that shape;
    the note says when a row does not fit UB. ``choose(sch, default, candidates)``: a tunable rule's
    decision of the partial sums' width (``partial_width_candidates``; see ``base.ScheduleRule.choose``).
    ``row_block`` > 1 (dividing the rows): the row loop is split into blocks of that many rows, the outer loop
    (the parallel one) is the root loop of the last block, for the caller to compute a producer per block."""
    kinds = [b.dom_kind() for b in infos]
    if any(not re.fullmatch(r"S+R*", k) for k in kinds) or not any(b.is_reduction() for b in infos):
        return False, None
    nrow = min(leading_spatial(k) for k in kinds)
    last = infos[-1]
    out_dtype_bits = buffer_bytes(sch.get(last.block_rv).writes[0].source) * 8
    lanes = vector_lanes(host, out_dtype_bits)

    # Row geometry of the last block.
    dom = last.dom()
    row_elems = math.prod(d if isinstance(d, int) else 1 << 16 for d in dom[nrow:]) if len(dom) > nrow else 1
    red_elems = max((math.prod(d if isinstance(d, int) else 1 << 16 for d in b.dom()[leading_spatial(b.dom_kind()):])
                     for b in infos if b.is_reduction()), default=1)
    row_elems = max(row_elems, red_elems)

    # 1. prologue blocks: inline single-use ones, stage multi-use full rows in UB.
    staged = []
    for info in infos[:-1]:
        if info.is_reduction() or is_output_block(sch, info.block_rv):
            continue
        consumers = sch.get_consumers(info.block_rv)
        full_row = len(info.dom()) > nrow
        if len(consumers) > 1 and full_row:
            staged.append(info.block_rv)
        elif not ok(sch.compute_inline, info.block_rv) and full_row:
            staged.append(info.block_rv)

    # A last block that reads a window of rows of the stage (Swin's cyclic shift: a concat of two row slices
    # of the normalised tensor) would, computed per row, recompute every row of the window for each of its
    # rows. The row stage then ends at the block it reads that way, written whole, and the last block runs
    # after it as an injective stage.
    cut = _row_window_producer(sch, infos, nrow) if row_block == 1 else None
    if cut is not None:
        stage = [b for b in infos[:cut + 1] if still_exists(sch, b.block_rv)]
        done, note = schedule_rows(sch, stage, target, host, also=also, choose=choose)
        if done:
            tile_injective(sch, last.block_rv, target, host)
        return done, note

    # Does one row fit? inputs + staged rows + output, double-buffered.
    stmt = sch.get(last.block_rv)
    n_row_buffers = len(staged) + len(stmt.writes) + len(
        [r for r in stmt.reads if len(r.region) > nrow])
    chip = on_chip_bytes(sch.get(last.block_rv).writes[0].source, target)   # what a row takes on chip
    row_bytes = row_elems * chip * max(1, n_row_buffers) * (2 if target.double_buffer else 1)
    stage_rows = row_bytes <= target.ub_usable
    note = None
    if not stage_rows:
        note = (f"one row needs {row_bytes} B of UB > {target.ub_usable} B usable: row tensors stream "
                f"from GM in {lanes}-element chunks instead of being staged")
    for blk in staged:
        if stage_rows:
            try_(sch.set_scope, blk, 0, UB_SCOPE)

    # rows that reach the last block permuted (LayerNorm over the channels of NCHW: transpose -> norm ->
    # transpose back): blocks of rows, channels outer (``_strided_rows``), no lane-wide partials
    red_rows = {tuple(b.dom()[:nrow]) for b in infos if b.is_reduction()}
    strided = nrow > 0 and len(red_rows) == 1 and tuple(dom[:nrow]) not in red_rows
    if strided:
        rows = next(iter(red_rows))
        if choose is not None:
            choose(sch, 1, lambda: [1])     # no partial sums to widen: a space of one point
        return (_strided_rows(sch, infos, staged, also, nrow, rows, row_elems * chip,
                              target, host, lanes), note)

    # 2. rfactor the row reductions into lane-wide partials (before compute_at), ``wide`` vectors of them
    wide = 1
    if choose is not None:
        doms = [[d for d, k in zip(b.dom(), b.dom_kind()) if k == "R"] for b in infos if b.is_reduction()]
        exts = [math.prod(d) for d in doms if all(isinstance(x, int) for x in d)]
        vec = [(e, vector_width_for(e, lanes)) for e in exts]
        vec = [(e, v) for e, v in vec if v >= 4 and e >= 2 * v]
        static = len(exts) == len(doms)
        wide = choose(sch, 1, lambda: partial_width_candidates(vec) if static else [1])
    rf_blocks = []
    for info in infos:
        if not info.is_reduction():
            continue
        blk = info.block_rv
        rloops = [it.loop_rv for it in info.iters if it.kind == "R"]
        r = sch.fuse(*rloops) if len(rloops) > 1 else rloops[0]
        ext = extent(sch, r)
        v = partials_width(ext, lanes) if wide == 1 else vector_width_for(ext, lanes)
        if not is_output_block(sch, blk):
            try_(sch.set_scope, blk, 0, UB_SCOPE)
        if ext is None or v < 4 or ext < 2 * v:
            continue
        _, ki = sch.split(r, [None, v * wide])
        rf = try_(sch.rfactor, ki, 0)
        if rf is not None:
            try_(sch.set_scope, rf, 0, UB_SCOPE)
            rf_blocks.append(rf)

    # 3. everything at the row loop of the last block.
    mine = {b.name for b in infos} | {sch.get(b).name_hint for b in rf_blocks} | set(also)
    blocks = [b for b in root_blocks(sch) if sch.get(b).name_hint in mine]
    last_blk = blocks[-1]
    if not sch.get(last_blk).name_hint == sch.get(last.block_rv).name_hint:
        return False, None
    rf_names = {sch.get(b).name_hint for b in rf_blocks}
    row_shapes = {tuple(b.dom()[:nrow]) for b in infos if b.is_reduction()} | {tuple(last.dom()[:nrow])}
    if nrow == 0 or len(row_shapes) > 1:
        # no one row loop: a pooling reduction over the GEMM's rows, then a norm over the pooled vector
        # (ConvNeXt's head: 768 channel rows, then one row of 768). Put under the last block's first loop
        # (its columns), every block would be recomputed once per column. Each block runs once, vectorised
        for blk in blocks:
            _vectorise_row_block(sch, blk, rf_names, lanes)
        return True, note
    row_loops = loops_through(sch, last_blk, last, nrow)
    row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    outer = row
    if row_block > 1 and (extent(sch, row) or 1) % row_block == 0:
        outer, row = sch.split(row, [None, row_block])
    cores = num_cores(host)
    for blk in reversed(blocks[:-1]):
        sch.compute_at(blk, row, preserve_unit_loops=True)
    total = math.prod(d if isinstance(d, int) else 1 << 10 for d in dom[:nrow]) * row_elems
    if cores > 1 and total >= MIN_PARALLEL_ELEMENTS:
        try_(sch.parallel, outer)

    # 4. vectorise: injective stages on their inner axis, rf partials on the lane axis.
    for blk in blocks_under(sch, row):
        _vectorise_row_block(sch, blk, rf_names, lanes)
    return True, note


def _row_window_producer(sch: s_tir.Schedule, infos, nrow: int) -> int | None:
    """Index in ``infos`` of a block whose output the last block reads over more than one value of an axis
    indexed by the last block's row iterators (a window of rows), when that block is not a reduction and
    every block after it is injective; None otherwise."""
    if infos[-1].is_reduction():
        return None
    last = sch.get(infos[-1].block_rv)
    rows = [iv.var for iv in last.iter_vars[:nrow]]
    writer = {}
    for i, b in enumerate(infos[:-1]):
        if still_exists(sch, b.block_rv):
            for w in sch.get(b.block_rv).writes:
                writer[w.source.name] = i
    for region in last.reads:
        i = writer.get(region.source.name)
        if i is None or infos[i].is_reduction():
            continue
        for r in region.region:
            wide = not (isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1)
            if wide and any(uses_var(r.min, v) for v in rows):
                return i if all(not b.is_reduction() for b in infos[i + 1:]) else None
    return None


def _strided_rows(sch: s_tir.Schedule, infos, staged, also, nrow: int, rows: tuple, row_bytes: int,
                  target: AscendTarget, host, lanes: int) -> bool:
    """A row reduction whose rows the last block writes permuted (its loops are not led by the row axes:
    LayerNorm over the channels of NCHW, ``transpose -> norm -> transpose``), in blocks of rows.

    The last block's loops are reordered rows first; the rows are fused and split into blocks of whole runs
    of the innermost row axis (a divisor of it, or whole multiples of it: the block is then one contiguous
    run of the NCHW planes), and every other block is computed per row block. A staged row tensor is laid out
    channels first (a [C, block] tile), so that each block's statistics are vector sums over the rows of the
    block along the contiguous axis, and the copies in and out run along it too. On chip a block holds its
    rows of each staged tensor and the row statistics; the row count is sized from the target, so the
    kernel stays within capacity whenever one row does (what the grouping's capacity check assumes), where
    computing the blocks over whole tensors would hold every row. ``row_bytes``: bytes of one row of one
    tensor. False when the last block's loops do not map onto the rows (the caller declines)."""
    for info in infos[:-1]:                 # statistics live per row block on chip
        if info.is_reduction() and not is_output_block(sch, info.block_rv):
            try_(sch.set_scope, info.block_rv, 0, UB_SCOPE)
    last_blk = infos[-1].block_rv
    realize = get_realize(sch, last_blk)
    block = realize.block
    loops = sch.get_loops(last_blk)
    loop_of = {}
    for iv, val in zip(block.iter_vars, realize.iter_values):
        for pos, lp in enumerate(loops):
            if isinstance(val, tirx.Var) and sch.get(lp).loop_var.same_as(val):
                loop_of[iv.var] = pos
    mine = {b.name for b in infos[:-1]} | set(also)
    ours = {sch.get(b).writes[0].source.name for b in root_blocks(sch)
            if sch.get(b).name_hint in mine and sch.get(b).writes}
    row_pos = None
    for region in block.reads:
        if region.source.name not in ours:
            continue
        # unit axes are left out, as in the blocks' normal form (``rows`` has none)
        axes = [(r.min, int(d)) for r, d in zip(region.region, region.source.shape)
                if not (isinstance(d, tirx.IntImm) and int(d) == 1)]
        if len(axes) < nrow or tuple(d for _, d in axes[:nrow]) != tuple(rows):
            continue
        pos = [loop_of.get(m) if isinstance(m, tirx.Var) else None for m, _ in axes[:nrow]]
        if all(p is not None for p in pos) and len(set(pos)) == nrow:
            row_pos = pos
            break
    if row_pos is None or len(loops) != len(block.iter_vars) or any(not isinstance(r, int) for r in rows):
        return False
    elem_pos = [p for p in range(len(loops)) if p not in row_pos]
    elem_elems = math.prod(extent(sch, loops[p]) or 1 for p in elem_pos)
    # the output's innermost index is the innermost row axis (NCHW's W): that axis goes innermost
    store = block.writes[0].region if block.writes else []
    row_inner_var = next(iv.var for iv in block.iter_vars if loop_of.get(iv.var) == row_pos[-1])
    row_innermost = bool(store) and store[-1].min.same_as(row_inner_var)
    if not ok(sch.reorder, *[loops[p] for p in row_pos + elem_pos]):
        return False
    in_ub = [b for b in staged + [sch.get_sblock(n) for n in also] if _scope(sch, b) == UB_SCOPE]
    per_row = max(1, len(in_ub)) * row_bytes * (2 if target.double_buffer else 1) + 8 * nrow
    per_block = _rows_per_block(rows, target.ub_usable // per_row if row_bytes else 1, lanes)
    row_loops = [loops[p] for p in row_pos]
    fused = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    outer, ri = sch.split(fused, [None, per_block])
    producers = [b for b in root_blocks(sch) if sch.get(b).name_hint in mine]
    for blk in reversed(producers):
        sch.compute_at(blk, outer, preserve_unit_loops=True)
    if num_cores(host) > 1 and math.prod(rows) * elem_elems >= MIN_PARALLEL_ELEMENTS:
        try_(sch.parallel, outer)
    for blk in producers:
        _channels_first(sch, blk, nrow, lanes)
    last_loops = sch.get_loops(last_blk)
    elems = last_loops[len(last_loops) - len(elem_pos):]
    if row_innermost and per_block > 1 and elems:
        ok(sch.reorder, *elems, ri)
    innermost_vector(sch, last_blk, lanes)
    return True


def _scope(sch: s_tir.Schedule, blk) -> str:
    writes = sch.get(blk).writes
    return writes[0].source.scope() if writes else ""


def _rows_per_block(rows: tuple, cap: int, lanes: int) -> int:
    """Rows per block of ``_strided_rows``: whole runs of the innermost row axis only (a divisor of it, or a
    multiple of it dividing the next axis' runs), so that a block's tile is exact; the largest one that is a
    multiple of ``lanes`` and at most ``cap``, else the largest at most ``cap``."""
    inner = rows[-1]
    cands = [d for d in range(1, inner + 1) if inner % d == 0]
    if len(rows) > 1:
        cands += [inner * k for k in range(2, rows[-2] + 1) if rows[-2] % k == 0]
    fit = [d for d in cands if d <= max(1, cap)] or [1]
    vec = [d for d in fit if d % lanes == 0]
    return max(vec) if vec else max(fit)


def _channels_first(sch: s_tir.Schedule, blk, nrow: int, lanes: int) -> None:
    """A block computed per row block (``_strided_rows``): its row loops innermost, fused and vectorised, so
    that it runs along the rows of the block (contiguous in NCHW); a row tensor it writes is laid out with its
    row axes last to match; a reduction's init is split off in front of its reduction loop."""
    stmt = sch.get(blk)
    ivs = stmt.iter_vars
    # leading row iterators: the first ``nrow`` non-unit data-parallel ones
    seen, split_at = 0, None
    for i, iv in enumerate(ivs):
        if iv.iter_type != tirx.IterVar.DataPar:
            break
        if not (isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == 1):
            seen += 1
        if seen == nrow:
            split_at = i + 1
            break
    if split_at is None:
        return
    loops = sch.get_loops(blk)
    mine = loops[len(loops) - len(ivs):]
    if len(mine) != len(ivs):
        return
    rows, rest = mine[:split_at], mine[split_at:]
    if rest:
        buf = stmt.writes[0].source if stmt.writes else None
        cut = _row_prefix([int(d) if isinstance(d, tirx.IntImm) else 0 for d in buf.shape], nrow) \
            if buf is not None and stmt.init is None else None
        if cut is not None and cut < len(buf.shape):
            order = list(range(cut, len(buf.shape))) + list(range(cut))
            ok(sch.transform_layout, blk, ("write", 0),
               tirx.IndexMap.from_func(lambda *idx: [idx[i] for i in order], ndim=len(buf.shape)))
        if not ok(sch.reorder, *rest, *rows):
            return
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    v = vector_width_for(extent(sch, row), lanes)
    if v >= 2:
        inner = sch.split(row, [None, v])[1] if (extent(sch, row) or 0) > v else row
        ok(sch.vectorize, inner)
    if stmt.init is not None and rest:
        # (after vectorising: the update block alone is no reduction block any more)
        ok(sch.decompose_reduction, blk, rest[0])
        init = try_(sch.get_sblock, stmt.name_hint + "_init")
        if init is not None:
            innermost_vector(sch, init, lanes)


def _row_prefix(shape: list[int], nrow: int) -> int | None:
    """Length of the shortest prefix of ``shape`` holding ``nrow`` non-unit axes (the row axes)."""
    seen = 0
    for i, d in enumerate(shape):
        seen += d != 1
        if seen == nrow:
            return i + 1
    return None


def _vectorise_row_block(sch: s_tir.Schedule, blk, rf_names, lanes: int) -> None:
    name = sch.get(blk).name_hint
    if name in rf_names:
        vectorize_rf(sch, blk)
    elif not any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(blk).iter_vars):
        if not _vectors_and_tail(sch, blk, lanes):
            innermost_vector(sch, blk, lanes)
    elif is_contraction(sch, blk):
        schedule_contraction(sch, blk, lanes)


def _vectors_and_tail(sch: s_tir.Schedule, blk, lanes: int) -> bool:
    """A row no full vector divides (softmax over 1500 keys: 1500 = 4 x 375) as full vectors plus one shorter
    vector for the remainder (``loop_partition``: a split by the full width would guard every lane, and TVM
    then scalarises the loop); False (nothing changed) when the row is a whole number of vectors, shorter
    than one, or its innermost loop runs other blocks too."""
    loops = sch.get_loops(blk)
    if not loops or not vector_storable(sch, blk) or not isinstance(sch.get(loops[-1]).body, s_tir.SBlockRealize):
        return False
    ext = extent(sch, loops[-1])
    if ext is None or ext <= lanes or ext % lanes == 0 or vector_width_for(ext, lanes) == lanes:
        return False
    main = ext // lanes * lanes
    parts = try_(sch.loop_partition, loops[-1], [main, None])
    if parts is None:
        return False
    head, tail = parts
    ok(sch.vectorize, sch.split(head, [None, lanes])[1])
    if ext - main >= 2:
        ok(sch.vectorize, tail)
    return True
