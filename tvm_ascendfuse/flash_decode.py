"""The flash-decoding attention kernel: a few query rows over a key count known only at run time.

A decode step's attention has one query row per head (a few with grouped-query heads stacked) and a cache of
``L`` keys whose length changes every step. The one-kernel attention (``schedule/decode_attention.py``) keeps
a whole score row on chip, which needs ``L`` at compile time; the ops written out (scores, scale and mask,
softmax, P·V) are four kernels with every score written to GM and read back three times. This kernel splits
the keys into chunks of ``CHUNK`` and computes each chunk's partial softmax independently (its maximum, its
sum of exponentials and its exponential-weighted sum of value rows), then merges the chunks' partials with
the usual rescaling (Dao et al.'s flash-decoding, CANN's IncreFlashAttention):

    per (batch, kv head, chunk c), rows m:   s_j = (q_m · k_j) ∘ chain            j in chunk c, j < L
                                             mx_c = max_j s_j;  l_c = sum_j e^(s_j - mx_c)
                                             o_c  = sum_j e^(s_j - mx_c) v_j
    merge, per (batch, kv head), rows m:     M = max_c mx_c;  out = sum_c e^(mx_c - M) o_c / sum_c e^(mx_c - M) l_c

Exact in real arithmetic (the same softmax, summed in another order). A chunk's scores stay on chip (``CHUNK``
floats a row), whatever ``L`` is, and the ``(batch, kv head, chunk)`` tasks keep every core busy at batch 1.

``chain``: the ops between the product and the softmax, in order, each a multiply or divide by a scalar or an
add of a tensor (the attention mask) broadcast over the scores (the space they are written in: per query head
``(b, heads, rows, L)``, or per KV head with the query heads stacked as rows). Keys past ``L`` in the last chunk
are excluded (weight 0), as are keys whose score is -inf (a chunk of only those contributes nothing).
Keys past ``L`` score the dtype's lowest value for the chunk maximum, so they never raise it.

This module is the kernel's math (TE), shared by the graph pass that emits it
(``graph_fusion/incre_flash_attention.py``) and the rule that schedules it (``schedule/flash_decode.py``), which
recognises it by ``BLOCKS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

# keys per chunk: 128 keys x 4 rows of scores and exponentials is 4 KiB on chip; a 512-key cache is four
# tasks per head; the merge reads (D + 2) floats per chunk and row
CHUNK = 128

SCORE, LOGIT, CHUNK_MAX, EXP, CHUNK_SUM, CHUNK_OUT = ("ifa_score", "ifa_logit", "ifa_chunk_max", "ifa_exp",
                                                      "ifa_chunk_sum", "ifa_chunk_out")
# the chunk maximum as the merge reads it: a copy written by the chunk's task (the maximum itself is read by
# the chunk's exponentials, and a block computed inside the task may have no reader outside it)
CHUNK_MAX_OUT = "ifa_chunk_max_out"
MAX, WEIGHT, DEN, NUM, OUT = "ifa_max", "ifa_weight", "ifa_den", "ifa_num", "ifa_out"
# per-chunk blocks (one task each), then the merge
CHUNK_BLOCKS = (SCORE, LOGIT, CHUNK_MAX, CHUNK_MAX_OUT, EXP, CHUNK_SUM, CHUNK_OUT)
MERGE_BLOCKS = (MAX, WEIGHT, DEN, NUM, OUT)
BLOCKS = CHUNK_BLOCKS + MERGE_BLOCKS


@dataclass(frozen=True)
class ScoreSpace:
    """How a stacked score index ``(b, kv_head, m, j)`` maps to the index space the chain's ops are written
    in: ``stacked`` False means per query head, ``(b, kv_head * group + m // rows, m % rows, j)``."""

    group: int = 1          # query heads per KV head
    rows: int = 1           # query rows per head
    stacked: bool = True    # the chain reads the stacked scores directly

    def index(self, b, h, m, j):
        if self.stacked:
            return b, h, m, j
        return b, h * self.group + tirx.floordiv(m, self.rows), tirx.floormod(m, self.rows), j


def _broadcast(tensor: te.Tensor, index) -> tirx.PrimExpr:
    """``tensor`` read at ``index`` (4 indices) with numpy broadcasting: dims right-aligned, size-1 dims at 0."""
    shape = list(tensor.shape)
    idx = list(index)[len(index) - len(shape):]
    return tensor(*[tirx.const(0, "int64") if isinstance(d, tirx.IntImm) and int(d) == 1 else i
                    for d, i in zip(shape, idx)])


def _i64(x):
    """A static extent as an int64 constant; symbolic ones are Relax's int64 variables already."""
    return tirx.IntImm("int64", int(x)) if isinstance(x, (int, tirx.IntImm)) else x


def flash_decode(q: te.Tensor, k: te.Tensor, v: te.Tensor, *operands: te.Tensor, chain=(),
                 space: ScoreSpace = ScoreSpace(), chunk: int = CHUNK) -> te.Tensor:
    """``softmax(chain(q · kᵀ)) · v`` for ``q`` (B, H, M, D), ``k`` (B, H, L, D), ``v`` (B, H, L, Dv) with
    ``L`` symbolic; ``chain``: ``(op, arg)`` with op "multiply"/"divide" and a float, or "add" and the index
    of a tensor in ``operands``. Returns (B, H, M, Dv)."""
    # every extent int64 (Relax's shapes are): a fused loop over extents of two widths binds its parts through
    # casts, which the schedule's affine checks refuse
    batch, heads, rows, dim = (_i64(x) for x in q.shape)
    length = _i64(k.shape[2])
    dv = _i64(v.shape[3])
    chunk = tirx.IntImm("int64", chunk)
    n_chunks = tirx.floordiv(length + chunk - 1, chunk)
    dtype = q.dtype
    lowest = tirx.min_value(dtype)
    neg_inf = tirx.const(float("-inf"), dtype)

    def key(c, j):
        return tirx.min(c * chunk + j, length - 1)

    def valid(c, j):
        return c * chunk + j < length

    d = te.reduce_axis((tirx.IntImm("int64", 0), dim), "d")
    score = te.compute((batch, heads, n_chunks, rows, chunk),
                       lambda b, h, c, m, j: te.sum(q[b, h, m, d] * k[b, h, key(c, j), d], axis=d), name=SCORE)

    def logit(b, h, c, m, j):
        x = score[b, h, c, m, j]
        at = space.index(b, h, m, key(c, j))
        for op, arg in chain:
            if op == "multiply":
                x = x * tirx.const(arg, dtype)
            elif op == "divide":
                x = x / tirx.const(arg, dtype)
            elif op == "add":
                x = x + _broadcast(operands[arg], at)
            else:
                raise ValueError(f"flash_decode chain op must be multiply, divide or add, not {op!r}")
        return tirx.Select(valid(c, j), x, lowest)

    logits = te.compute(score.shape, logit, name=LOGIT)
    j1 = te.reduce_axis((tirx.IntImm("int64", 0), chunk), "j")
    cmax = te.compute((batch, heads, n_chunks, rows), lambda b, h, c, m: te.max(logits[b, h, c, m, j1], axis=j1),
                      name=CHUNK_MAX)

    def weight(b, h, c, m, j):
        # a key past L weighs 0; so does one scored -inf, also when every key of the chunk is (exp(-inf - -inf)
        # is NaN). A key masked with the dtype's lowest value keeps its softmax meaning: e^(lowest - max) is 0
        # next to any real score, and a row masked everywhere is uniform, as softmax makes it.
        s = logits[b, h, c, m, j]
        return tirx.Select(tirx.all(valid(c, j), s > neg_inf), te.exp(s - cmax[b, h, c, m]), tirx.const(0, dtype))

    ex = te.compute(score.shape, weight, name=EXP)
    j2 = te.reduce_axis((tirx.IntImm("int64", 0), chunk), "j")
    csum = te.compute(cmax.shape, lambda b, h, c, m: te.sum(ex[b, h, c, m, j2], axis=j2), name=CHUNK_SUM)
    j3 = te.reduce_axis((tirx.IntImm("int64", 0), chunk), "j")
    cout = te.compute((batch, heads, n_chunks, rows, dv),
                      lambda b, h, c, m, e: te.sum(ex[b, h, c, m, j3] * v[b, h, key(c, j3), e], axis=j3),
                      name=CHUNK_OUT)
    cmax_out = te.compute(cmax.shape, lambda b, h, c, m: cmax[b, h, c, m], name=CHUNK_MAX_OUT)
    c1 = te.reduce_axis((tirx.IntImm("int64", 0), n_chunks), "c")
    gmax = te.compute((batch, heads, rows), lambda b, h, m: te.max(cmax_out[b, h, c1, m], axis=c1), name=MAX)
    w = te.compute(cmax.shape, lambda b, h, c, m: tirx.Select(
        cmax_out[b, h, c, m] > neg_inf, te.exp(cmax_out[b, h, c, m] - gmax[b, h, m]), tirx.const(0, dtype)),
        name=WEIGHT)
    c2 = te.reduce_axis((tirx.IntImm("int64", 0), n_chunks), "c")
    den = te.compute(gmax.shape, lambda b, h, m: te.sum(w[b, h, c2, m] * csum[b, h, c2, m], axis=c2), name=DEN)
    c3 = te.reduce_axis((tirx.IntImm("int64", 0), n_chunks), "c")
    num = te.compute((batch, heads, rows, dv),
                     lambda b, h, m, e: te.sum(w[b, h, c3, m] * cout[b, h, c3, m, e], axis=c3), name=NUM)
    return te.compute(num.shape, lambda b, h, m, e: num[b, h, m, e] / den[b, h, m], name=OUT)
