"""Attention of a few query rows over a cache of keys (an LLM decode step): one task per (batch, head).

With one query row per head, Q·Kᵀ and P·V are matrix-vector products over the cache: the kernel reads K and V
once and does two FLOPs per element, so what matters is reading each key row contiguously and keeping the
scores on chip. The attention rule's blocks of query rows do not apply (there is one row; dlight's normal
form folds it away and no product is left), so this rule schedules the kernel as it comes from FuseTIR:

* the layout prologue (GQA's repeat of the KV heads, the head split, Kᵀ) is inlined: each task reads its KV
  head in place through index arithmetic, nothing is materialised per query head;
* per (batch, head), in parallel: the scores ``q·k_j`` as vector partial sums along the head dimension (one
  key row is one contiguous run), the softmax over the keys (max and sum as vector partial sums), and
  ``P·V`` with the head dimension in vector registers while the keys stream past; the scores, probabilities
  and output row stay in UB (``sk`` floats per row);
* the epilogue (the head merge into the hidden size) follows each task when it reads the task's output as a
  box (``row_blocks.tiles_are_boxes``).

Declined: more than ``GEMV_MAX_ROWS`` query rows per head (the attention rule's row blocks), a symbolic key
count or head dimension, anything that is not product -> row softmax -> product.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..kinds import is_product_block
from ..target import AscendTarget
from ..tiling import GEMV_MAX_ROWS
from .analysis import has_reduce
from .base import UB_SCOPE, ScheduleRule
from .common import new_schedule, has_block, is_output_block, ok, root_blocks, try_, vectorize_inner
from .fast_math import use_fast_math
from .hostvec import host_vector
from .partial_sums import vector_partial_sums, vectorize_partial_sums
from .row_blocks import tiles_are_boxes


class DecodeAttentionRule(ScheduleRule):
    """Q·Kᵀ -> softmax -> ·V with at most GEMV_MAX_ROWS query rows per head (module docstring)."""

    name = "decode-attention"
    min_products = 2

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(tvm.IRModule({"main": use_fast_math(func)}))
        return self.schedule(sch, target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> s_tir.Schedule | None:
        hv = host_vector(host)
        blocks = list(root_blocks(sch))
        names = [sch.get(b).name_hint for b in blocks]
        products = [i for i, b in enumerate(blocks) if has_reduce(sch, b) and is_product_block(sch.get(b))]
        if len(products) != 2:
            return None
        i1, i2 = products
        if not any(has_reduce(sch, b) for b in blocks[i1 + 1:i2]):
            return None                                   # no softmax between the products
        if any(has_reduce(sch, b) for b in blocks[:i1] + blocks[i2 + 1:]):
            return None
        qk, pv = names[i1], names[i2]
        shape = _rows_and_heads(sch, sch.get_sblock(pv))
        if shape is None:
            return None
        rows, lead = shape                                # query rows per head, leading (batch, head) loops
        if rows > GEMV_MAX_ROWS:
            return None
        dtype = str(sch.get(sch.get_sblock(pv)).writes[0].source.dtype)
        lanes = hv.lanes(dtype)

        # the layout prologue read in place; scale and mask inlined into the softmax that reads them
        for nm in names[:i1][::-1]:
            if not ok(sch.compute_inline, sch.get_sblock(nm)):
                return None
        # (the probabilities P·V reads stay a stage: inlined, their division would run per element of V)
        for nm in names[i1 + 1:i2]:
            blk = sch.get_sblock(nm)
            if not has_reduce(sch, blk) and not is_output_block(sch, blk) and not _feeds(sch, blk, pv):
                ok(sch.compute_inline, blk)
        epilogue = names[i2 + 1:]
        for nm in epilogue[:-1]:
            if not ok(sch.compute_inline, sch.get_sblock(nm)):
                return None

        # vector partial sums for every row reduction (rfactor needs them at the root, before compute_at)
        rf = []
        for nm in [qk] + [n for n in names[i1 + 1:i2] if has_block(sch, n)]:
            blk = sch.get_sblock(nm)
            if has_reduce(sch, blk):
                part = vector_partial_sums(sch, blk, lanes)
                if part is not None:
                    rf.append(sch.get(part).name_hint)

        out = sch.get_sblock(pv)
        tail = sch.get_sblock(epilogue[-1]) if epilogue else None
        loops = sch.get_loops(out)
        task = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
        if tail is not None:
            acc = sch.get(out).writes[0].source
            tile = [1] * lead + [None] * (len(acc.shape) - lead)
            if not tiles_are_boxes(sch.get(tail), acc, tile):
                return None
        stages = [b for b in root_blocks(sch) if sch.get(b).name_hint not in {pv} | set(epilogue)]
        for blk in reversed(stages):
            if not ok(sch.compute_at, blk, task, preserve_unit_loops=True):
                return None
            if not is_output_block(sch, blk):
                ok(sch.set_scope, blk, 0, UB_SCOPE)
        if tail is not None:
            if not ok(sch.reverse_compute_at, tail, task, preserve_unit_loops=True):
                return None
            ok(sch.set_scope, out, 0, UB_SCOPE)
        sch.parallel(task)

        # P·V: the keys outermost, the head dimension in vector registers
        *row_loops, d, key = sch.get_loops(out)[1:]       # under the task loop: rows, d, keys
        sch.reorder(key, *row_loops, d)
        for r in row_loops:
            try_(sch.unroll, r)
        try_(sch.vectorize, d)
        for nm in rf:
            vectorize_partial_sums(sch, sch.get_sblock(nm))
        for nm in names[i1 + 1:i2] + epilogue:
            if has_block(sch, nm) and not has_reduce(sch, sch.get_sblock(nm)):
                vectorize_inner(sch, sch.get_sblock(nm), lanes)
        try_(sch.decompose_reduction, out, key)
        sch.annotate(out, "ascendfuse.schedule", f"decode attention, {rows} query row(s) per task")
        return sch


def _rows_and_heads(sch, pv) -> tuple[int, int] | None:
    """(query rows per head, number of leading batch/head loops) of the P·V block ``out[..., i, d] +=
    P[..., i, j] * V[..., j, d]``: leading iterators index all three; i indexes P and the output only."""
    stmt = sch.get(pv)
    ivs = stmt.iter_vars
    if len(ivs) < 3 or ivs[-1].iter_type != tirx.IterVar.CommReduce:
        return None
    exts = [iv.dom.extent for iv in ivs]
    if any(not isinstance(e, tirx.IntImm) for e in exts):
        return None
    spatial = len(ivs) - 1
    lead = spatial - 2
    if lead < 1:
        return None
    return int(exts[lead]), lead


def _feeds(sch, blk, name: str) -> bool:
    return any(sch.get(c).name_hint == name for c in sch.get_consumers(blk))
