"""AttentionKeyPadFusionPass: an attention over a key count no vector width divides gets whole-vector score rows.

``matmul(softmax(f(matmul(Q, Kᵀ))), V)`` with ``n`` keys (``f``: the scale and mask ops between the product and
the softmax) becomes, with ``n'`` = ``n`` rounded up to ``KEY_MULTIPLE``::

    Kᵀ' = pad(Kᵀ, last axis to n', zeros);  V' = pad(V, key axis to n', zeros)
    s' = f'(matmul(Q, Kᵀ')) + key_mask          (key_mask: 0 for the n keys, the dtype's lowest value after)
    out = matmul(softmax(s'), V')

``f'`` is ``f`` with every operand that runs along the keys (a mask row) padded with zeros; the key mask is
folded into the last mask add when there is one (the attention patterns take one add). Why: ViT's 197 keys
(14x14 patches + the class token) and CLIP's 77 are prime or odd, so no vector width divides a score row and
the attention kernel's scores, exponentials and probabilities ran scalar (a sixth of the speed it has at 200
keys). The pads are copies of K and V only.

Exact: a padded key's score is ``0 + lowest`` (or ``lowest`` twice, -inf), below any real score by far more
than exp's range, so its probability is exactly 0; a row keeps its n real keys, whose max, sum and
probabilities are those of the unpadded row; the padded V rows are zeros times zero probability.
Key counts a 4-lane vector divides (Whisper's 1500) and short rows are left alone.

The query rows get the same treatment (``query_row_pad``): 197 rows become 200 (Q and any mask with a row per
query padded with zero rows, the output sliced back to the real rows), so the attention kernel's blocks of 8
rows divide them and no product or softmax stage carries a row predicate; the slice goes into the kernel's
head-merge epilogue. Exact: every row is computed on its own, the padded rows are dropped.

The attention kernel takes the pads into its operand copies. With more keys per row, fewer query rows fit
a block of scores: Swin-T's 49 window rows against 64 padded keys get blocks of 7 rows, the count its
window-reverse epilogue follows exactly (``schedule/row_blocks.py``).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import ATTENTION_KEY_PAD as NAME
from ._graph import GraphRewritePass, Rewrite, op_name, static_dims

KEY_MULTIPLE = 16       # a 16-lane (AVX-512 / 64-byte) vector of float32
MIN_KEYS = 32           # shorter rows: the pads would cost about what the vectors save
ROW_MULTIPLE = 8        # query rows: the attention kernel's register block and smallest block of rows
MIN_QUERY_ROWS = 64     # fewer rows: the padded rows' share of the work outweighs the tail they remove
_SCORE_OPS = ("relax.multiply", "relax.divide", "relax.add", "relax.subtract")


def query_row_pad(rows) -> int:
    """Zero query rows added so that the attention kernel's blocks of query rows (multiples of its 8-row
    register block) divide the rows: 0 for short rows (Swin's 49-row windows would grow by a seventh) and
    for counts 8 divides."""
    if rows is None or rows < MIN_QUERY_ROWS or rows % ROW_MULTIPLE == 0:
        return 0
    return -rows % ROW_MULTIPLE


def needs_pad(keys: int) -> bool:
    """Key counts this pass pads: no 4-lane vector divides them and the rows are not short."""
    return keys >= MIN_KEYS and keys % 4 != 0


def _pad_last(expr, axis: int, rank: int, amount: int, value: float = 0.0):
    width = [0] * (2 * rank)
    width[2 * (rank + axis) + 1] = amount
    return relax.op.nn.pad(expr, width, pad_value=value)


class AttentionKeyPadFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        pv = graph.value(var)
        if op_name(pv) != "relax.matmul":
            return None
        p_var, v = pv.args
        if not graph.single_use(p_var) or op_name(graph.value(p_var)) != "relax.nn.softmax":
            return None
        sm = graph.value(p_var)
        s_dims = static_dims(sm.args[0])
        v_dims = static_dims(v)
        if not s_dims or not v_dims or len(v_dims) < 2 or s_dims[-1] is None:
            return None
        n = s_dims[-1]
        rank = len(s_dims)
        if int(sm.attrs.axis) not in (-1, rank - 1) or v_dims[-2] != n or not needs_pad(n):
            return None
        chain, cur = [], sm.args[0]          # the ops between Q·Kᵀ and the softmax, softmax side first
        while graph.single_use(cur) and op_name(graph.value(cur)) in _SCORE_OPS:
            chain.append(cur)
            call = graph.value(cur)
            nxt = [a for a in call.args if isinstance(a, relax.Var) and a in graph.var2val
                   and op_name(graph.value(a)) in (*_SCORE_OPS, "relax.matmul")
                   and (static_dims(a) or [None])[-1] == n and len(static_dims(a)) == rank]
            if len(nxt) != 1:
                return None
            cur = nxt[0]
        qk_var = cur
        qk = graph.value(cur) if graph.single_use(cur) else None
        if qk is None or op_name(qk) != "relax.matmul":
            return None
        kt_dims = static_dims(qk.args[1])
        if not kt_dims or kt_dims[-1] != n or str(var.ty.dtype) not in ("float32", "float16"):
            return None
        dtype = str(var.ty.dtype)
        padded = -(-n // KEY_MULTIPLE) * KEY_MULTIPLE
        extra = padded - n
        key_mask = np.zeros(padded, dtype)
        key_mask[n:] = np.finfo(dtype).min
        q_dims = static_dims(qk.args[0])
        rows = s_dims[-2] if rank >= 2 else None
        row_extra = query_row_pad(rows) if q_dims and len(q_dims) >= 2 and q_dims[-2] == rows else 0

        q = _pad_last(qk.args[0], -2, len(q_dims), row_extra) if row_extra else qk.args[0]
        value = relax.Call(qk.op, [q, _pad_last(qk.args[1], -1, len(kt_dims), extra)], qk.attrs)
        mask_folded = False
        for i, c in enumerate(reversed(chain)):
            call = graph.value(c)
            args = []
            for a in call.args:
                if a.same_as(cur):
                    args.append(value)
                    continue
                a_dims = static_dims(a)
                if a_dims is None or None in a_dims:
                    return None
                if a_dims and a_dims[-1] == n:
                    a = _pad_last(a, -1, len(a_dims), extra)
                elif a_dims and a_dims[-1] != 1:
                    return None
                if row_extra and len(a_dims) >= 2 and a_dims[-2] == rows:
                    a = _pad_last(a, -2, len(a_dims), row_extra)     # a mask with a row per query
                if i == len(chain) - 1 and op_name(call) == "relax.add":
                    a = relax.op.add(a, relax.const(key_mask))
                    mask_folded = True
                args.append(a)
            value = relax.Call(call.op, args, call.attrs)
            cur = c
        if not mask_folded:
            value = relax.op.add(value, relax.const(key_mask))
        probs = relax.Call(sm.op, [value], sm.attrs)
        v_pad = _pad_last(v, -2, len(v_dims), extra)
        out = relax.Call(pv.op, [probs, v_pad], pv.attrs)
        if row_extra:
            out = relax.op.strided_slice(out, axes=[rank - 2], begin=[0], end=[rows])
        internal = {p_var, qk_var, *chain}
        return Rewrite(var, out, internal, {"keys": n, "padded_keys": padded, "query_rows": rows,
                                            "padded_query_rows": rows + row_extra if rows else rows})
