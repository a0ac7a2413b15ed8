"""FlashDecodeRule: the flash-decoding attention kernel (``tvm_ascendfuse/flash_decode.py``) on the host.

The kernel comes in as TE writes it: per (batch, KV head, chunk of keys) the scores, their maximum, the
exponentials, their sum and the exponential-weighted sum of value rows; then the merge of the chunks. Schedule:

* one parallel task per (batch, KV head, chunk): every per-chunk block under it, the chunk's scores and
  exponentials in UB (rows x ``CHUNK`` floats each, whatever the key count), the key and value rows read
  contiguously from the cache once;
* the scores ``q·k_j`` as vector partial sums along the head dimension (one key row is one contiguous run), the
  chunk maximum and sum as vector partial sums along the keys, the exponentials vectorised along the keys;
* the weighted value sum with the keys outermost and the value dimension in vector registers;
* the merge: one parallel task per (batch, KV head): the rescaling weights inlined, the value dimension in
  vector registers.

Declined: a kernel whose blocks are not the flash-decoding kernel's, one whose head dimension the host's
vector lanes do not divide.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from .. import flash_decode as fd
from ..target import AscendTarget
from .base import UB_SCOPE, ScheduleRule
from .common import new_schedule, ok, root_blocks, try_
from .fast_math import use_fast_math
from .hostvec import host_vector
from .partial_sums import vector_partial_sums, vectorize_partial_sums


class FlashDecodeRule(ScheduleRule):
    """See the module docstring."""

    name = "flash-decode"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(use_fast_math(func))
        names = [sch.get(b).name_hint for b in root_blocks(sch)]
        if sorted(names) != sorted(fd.BLOCKS):
            return None
        lanes = host_vector(host).lanes("float32")
        out = sch.get_sblock(fd.CHUNK_OUT)
        dv = sch.get(out).writes[0].source.shape[-1]
        if not isinstance(dv, tirx.IntImm) or int(dv) % lanes:
            return None
        for name in (fd.LOGIT, fd.WEIGHT):
            if not ok(sch.compute_inline, sch.get_sblock(name)):
                return None
        # rfactor needs each reduction at the root, before anything moves
        partials = []
        for name in (fd.SCORE, fd.CHUNK_MAX, fd.CHUNK_SUM):
            rf = vector_partial_sums(sch, sch.get_sblock(name), lanes)
            if rf is not None:
                partials.append(sch.get(rf).name_hint)

        # the merge first, per (batch, KV head): TE orders its blocks among the per-chunk ones, whose move
        # under the chunk task needs every consumer after that task
        res = sch.get_sblock(fd.OUT)
        merge = sch.fuse(*sch.get_loops(res)[:2])
        for name in (fd.NUM, fd.DEN, fd.MAX):
            if not ok(sch.compute_at, sch.get_sblock(name), merge, preserve_unit_loops=True):
                return None
        sch.parallel(merge)
        num = sch.get_sblock(fd.NUM)
        m, e, c = sch.get_loops(num)[-3:]
        sch.reorder(c, m, e)
        ok(sch.vectorize, e)
        try_(sch.decompose_reduction, num, c)
        ok(sch.vectorize, sch.get_loops(res)[-1])
        # per (batch, KV head, chunk): everything under one parallel task
        # the chunk's sum reads the exponentials too and the copy of the maximum reads the maximum: their
        # (batch, head, chunk) loops merged with the value sum's, so that every reader of a block moved under
        # the task is in it
        sums = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith(fd.CHUNK_SUM)]
        heads = [_chunk_major(sch, b) for b in [out, sch.get_sblock(fd.CHUNK_MAX_OUT)] + sums]
        task = try_(sch.merge, *heads) if len(heads) > 1 else heads[0]
        if task is None:
            return None
        producers = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith((fd.SCORE, fd.CHUNK_MAX, fd.EXP))
                     and sch.get(b).name_hint != fd.CHUNK_MAX_OUT]
        for blk in reversed(producers):
            if not ok(sch.compute_at, blk, task, preserve_unit_loops=True):
                return None
        for name in (fd.SCORE, fd.EXP):
            ok(sch.set_scope, sch.get_sblock(name), 0, UB_SCOPE)
        sch.parallel(task)

        # the weighted value rows: keys outermost, the value dimension in vector registers
        m, e, j = sch.get_loops(out)[-3:]
        sch.reorder(j, m, e)
        try_(sch.unroll, m)
        ok(sch.vectorize, e)
        try_(sch.decompose_reduction, out, j)
        for name in partials:
            vectorize_partial_sums(sch, sch.get_sblock(name))
        inner = sch.get_loops(sch.get_sblock(fd.EXP))[-1]
        ok(sch.vectorize, inner)

        sch.annotate(out, "ascendfuse.schedule", f"flash decoding, {fd.CHUNK} keys per task")
        return sch


def _chunk_major(sch, block):
    """The block's (batch, head, chunk) loops fused chunk-major: the chunk count is symbolic, and only a fused
    index divided by a constant (batch x heads) keeps the bindings affine, which parallel needs."""
    b, h, c = sch.get_loops(block)[:3]
    sch.reorder(c, b, h)
    return sch.fuse(c, b, h)
