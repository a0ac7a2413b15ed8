"""Row dots: a few rows times a run-time matrix read along its rows (``A·Bᵀ`` with ``B[n, k]``), any n.

A decode step's attention scores over its cache, when no attention kernel takes them (a cache length known
only at run time): each of a few query rows is dotted with every key row, and each key row is one contiguous
run of the head dimension. A GEMM schedule vectorises across the keys, which then reads the cache with a
stride of the head dimension and pads the key count up to its tile; here the key rows are read in place:

* the layout prologue (the query heads stacked per KV head, Kᵀ) is inlined: K is read as it is stored;
* the keys are cut into chunks given to the cores in turn (with the batch and head loops: one task per
  (batch, head, chunk)); a chunk's key rows stream past the few query rows, which stay in cache;
* each dot is ``lanes`` vector partial sums along the head dimension, then a short sum of the lanes.

Declined: more than ``GEMV_MAX_ROWS`` rows, a reduction axis that is not the last (contiguous) index of both
operands, a reduction shorter than two vectors or that no vector width divides, more than one product or
any other reduction, an epilogue that cannot be inlined into the product's output.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from ..tiling import GEMV_MAX_ROWS
from .analysis import has_reduce
from .base import UB_SCOPE, ScheduleRule
from .common import new_schedule, ok, root_blocks, try_
from .fast_math import use_fast_math
from .hostvec import host_vector
from .partial_sums import vector_partial_sums, vectorize_partial_sums

# Key rows per task: enough work per task to hide the fork, few enough that a short cache still spreads
# over the cores (a 64-key cache gives every core two tasks per head on a 2-core host).
CHUNK = 32


class RowDotRule(ScheduleRule):
    """A few rows dotted with every row of a run-time matrix (module docstring)."""

    name = "row-dot"
    min_products = 1

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(tvm.IRModule({"main": use_fast_math(func)}))
        return self.schedule(sch, host_vector(host))

    def schedule(self, sch: s_tir.Schedule, hv) -> s_tir.Schedule | None:
        blocks = list(root_blocks(sch))
        names = [sch.get(b).name_hint for b in blocks]
        reducing = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        if len(reducing) != 1:
            return None
        p = reducing[0]
        product = names[p]
        for nm in names[:p][::-1]:
            if not ok(sch.compute_inline, sch.get_sblock(nm)):
                return None
        for nm in names[p + 1:]:
            if not ok(sch.reverse_compute_inline, sch.get_sblock(nm)):
                return None
        blk = sch.get_sblock(product)
        shape = _row_dot_shape(sch.get(blk))
        if shape is None:
            return None
        rows, depth, lead = shape
        dtype = str(sch.get(blk).writes[0].source.dtype)
        lanes = hv.lanes(dtype)
        while lanes > 4 and (depth % lanes or depth < 2 * lanes):
            lanes //= 2
        if depth % lanes or depth < 2 * lanes:
            return None
        rf = vector_partial_sums(sch, blk, lanes)
        if rf is None:
            return None
        # the output block now sums the lanes: [lead..., rows, keys, lane]
        *outer, row, key, lane = sch.get_loops(blk)
        if len(outer) != lead:
            return None
        sch.reorder(key, row)
        chunk, inner = sch.split(key, [None, CHUNK])
        task = sch.fuse(*outer, chunk) if outer else chunk
        sch.parallel(task)
        sch.reorder(task, inner, row)
        try_(sch.unroll, row)
        if not ok(sch.compute_at, rf, row, preserve_unit_loops=True):
            return None
        ok(sch.set_scope, rf, 0, UB_SCOPE)
        vectorize_partial_sums(sch, rf)
        sch.annotate(blk, "ascendfuse.schedule", f"row dots, {rows} row(s), {lanes}-lane partial sums, "
                                                 f"{CHUNK} rows of B per task")
        return sch


def _row_dot_shape(stmt) -> tuple[int, int, int] | None:
    """(rows, reduction length, leading loops) of ``out[..., i, j] += A[..., i, k] * B[..., j, k]``: the
    last iterator the only reduction, static and the last index of every operand it reads; the rows static
    and few; B's row index j an iterator of its own (its extent may be symbolic)."""
    ivs = stmt.iter_vars
    if len(ivs) < 3 or ivs[-1].iter_type != tirx.IterVar.CommReduce:
        return None
    if any(iv.iter_type != tirx.IterVar.DataPar for iv in ivs[:-1]):
        return None
    rows, depth = ivs[-3].dom.extent, ivs[-1].dom.extent
    if not isinstance(rows, tirx.IntImm) or not isinstance(depth, tirx.IntImm) or int(rows) > GEMV_MAX_ROWS:
        return None
    k, i, j = ivs[-1].var, ivs[-3].var, ivs[-2].var
    operands = [r for r in stmt.reads if not r.source.same_as(stmt.writes[0].source)]
    if len(operands) != 2:
        return None
    uses = []
    for region in operands:
        last = region.region[-1].min
        if not (isinstance(last, tirx.Var) and last.same_as(k)):
            return None                      # the reduction is not the contiguous axis of this operand
        uses.append({v.name for r in region.region[:-1] for v in tirx.analysis.undefined_vars(r.min)})
    if not any(j.name in u and i.name not in u for u in uses):
        return None                          # no operand read along its rows by the column iterator
    return int(rows), int(depth), len(ivs) - 3
