"""Whatever no other rule took (gathers, scatters, opaque blocks, odd reductions): still use the cores.

Per root block: the leading data-parallel loops fused and parallel (a leading batch loop of extent 1 alone
would leave the cores idle), and the innermost data-parallel loop vectorised. A reduction block whose
reduction loop is innermost (a GEMM no rule matched: ``C[i, j] += A[i, k] * B[k, j]``) first gets its
reduction loops moved above its innermost data-parallel loop when that loop walks the output and its
operands contiguously (then it vectorises); each output element still sums in the same order, so the numbers
do not change. That caps an unmatched GEMM at a few times a scheduled one instead of a strided scalar dot
product per output (orders of magnitude slower on a 1024 x 1024 weight).
Each step is optional; a step TVM refuses is skipped, so the rule always returns a valid schedule
(possibly unchanged) and never fails the build.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import uses_var
from .base import ScheduleRule
from .common import buffer_bytes, innermost_vector, num_cores, ok, root_blocks, vector_lanes


def _is_spatial_block(sch, block) -> bool:
    return all(iv.iter_type == tirx.IterVar.DataPar for iv in sch.get(block).iter_vars)


def _loop_kinds(sch, block, loops) -> list | None:
    """Per loop, True (data parallel) or False (reduction) when every loop binds exactly one block
    iterator as itself, else None (fused, split or opaque bindings: leave the nest alone)."""
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize) or len(loops) != len(realize.iter_values):
        return None
    kinds = []
    for lp, val, iv in zip(loops, realize.iter_values, sch.get(block).iter_vars):
        if not (isinstance(val, tirx.Var) and val.same_as(sch.get(lp).loop_var)):
            return None
        if iv.iter_type not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce):
            return None
        kinds.append(iv.iter_type == tirx.IterVar.DataPar)
    return kinds


def _walks_last_axes(stmt, var) -> bool:
    """Does ``var`` index only the last axis of what the block writes and reads (or not index a read at
    all)? Then a vector loop over it loads and stores contiguously; otherwise (a row reduction's row) it
    would gather, and the reduction loop is better left innermost."""
    regions = list(stmt.writes) + list(stmt.reads)
    for i, region in enumerate(regions):
        dims = list(region.region)
        if not dims:
            continue
        last_plain = dims[-1].min.same_as(var) and int(dims[-1].extent) == 1 \
            if isinstance(dims[-1].extent, tirx.IntImm) else False
        if any(uses_var(r.min, var) or uses_var(r.extent, var) for r in dims[:-1]):
            return False
        if i < len(stmt.writes) and not last_plain:
            return False
        if not last_plain and uses_var(dims[-1].min, var):
            return False
    return True


def _reduction_outside_inner_loop(sch, block, loops, kinds) -> tuple[list, list] | None:
    """Move the reduction loops just above the innermost data-parallel loop; the new (loops, kinds)."""
    spatial = [lp for lp, s in zip(loops, kinds) if s]
    if kinds[-1] or not spatial:
        return None
    stmt = sch.get(block)
    pos = max(i for i, s in enumerate(kinds) if s)
    if not _walks_last_axes(stmt, stmt.iter_vars[pos].var):
        return None
    order = spatial[:-1] + [lp for lp, s in zip(loops, kinds) if not s] + spatial[-1:]
    if not ok(sch.reorder, *order):
        return None
    n_s = len(spatial) - 1
    return sch.get_loops(block), [True] * n_s + [False] * (len(loops) - len(spatial)) + [True]


def _parallel_leading(sch, block, kinds, keep_inner: bool) -> None:
    """Fuse the leading data-parallel loops (all but a vectorised innermost one) and parallelise them."""
    loops = sch.get_loops(block)
    lead = 0
    while lead < len(kinds) and kinds[lead] and not (keep_inner and lead == len(loops) - 1):
        lead += 1
    if lead == 0:
        return
    outer = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
    ok(sch.parallel, outer)


class FallbackRule(ScheduleRule):
    """Parallel outer loops + vectorised inner loop where legal; never returns None for a schedulable func."""

    name = "fallback"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        sch = s_tir.Schedule(func)
        if not isinstance(sch.mod["main"].body, s_tir.SBlockRealize):
            return None         # no root block (hand-written loops): nothing to schedule, TVM lowers it as is
        cores = num_cores(host)
        for block in root_blocks(sch):
            try:
                self._block(sch, block, cores, host)
            except s_tir.ScheduleError:
                continue        # a refused step leaves the block as far as it got
        return sch

    def _block(self, sch, block, cores: int, host) -> None:
        loops = sch.get_loops(block)
        if not loops:
            return
        writes = sch.get(block).writes
        bits = buffer_bytes(writes[0].source) * 8 if writes else 32
        kinds = _loop_kinds(sch, block, loops)
        if kinds is not None and not kinds[-1]:
            moved = _reduction_outside_inner_loop(sch, block, loops, kinds)
            if moved is not None:
                loops, kinds = moved
        vector_inner = _is_spatial_block(sch, block) or (kinds is not None and kinds[-1])
        if vector_inner:
            before = len(loops)
            innermost_vector(sch, block, vector_lanes(host, bits))
            loops = sch.get_loops(block)
            if kinds is not None and len(loops) > before:       # the innermost loop was split
                kinds = kinds[:-1] + [True, True]
        if cores <= 1:
            return
        if kinds is None:
            ok(sch.parallel, loops[0])
            return
        _parallel_leading(sch, block, kinds, keep_inner=vector_inner)
