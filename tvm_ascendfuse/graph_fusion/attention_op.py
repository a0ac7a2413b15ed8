"""ScaledDotProductAttentionFusionPass: one-op attention written out as the chain the attention kernels fuse.

``R.nn.attention(q, k, v[, bias], scale, causal_mask)`` on (batch, seq, heads, head_dim) tensors, as the
PyTorch importer emits for ``scaled_dot_product_attention``, becomes what an ONNX export of attention is::

    s = matmul(permute_dims(q, [0, 2, 1, 3]), permute_dims(k, [0, 2, 3, 1])) * scale   (+ bias) (+ causal)
    out = permute_dims(matmul(softmax(s, -1), permute_dims(v, [0, 2, 1, 3])), [0, 2, 1, 3])

so that the attention pattern, the query/key/value sibling merge and the attention + projection kernel
take it with its projections (kept as one op, TVM lowers it as a kernel of its own between them). Exact:
this is the op's definition (TVM's legalization computes the same products, scale and softmax; its causal
mask keeps key ``j <= i + offset``, offset 0 for ``TopLeft`` and ``|seq_kv - seq_q|`` for ``BottomRight``).
The causal mask becomes an additive constant with the dtype's lowest value above the diagonal (exp of it
is 0, as for the masked-out entries of the op; every row keeps its diagonal, so none is all masked).
``scale=None`` is ``1/sqrt(head_dim)``. Refused: sliding windows, symbolic sequence lengths with a causal
mask (the constant mask needs them), key/query head dims that differ.

``TransposeChainFusionPass`` (next in the list) collapses the importer's transposes around the new ones.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from ..switches import SDPA_ATTENTION as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, static_dims, make_const, op_name


def causal_bias(seq_q: int, seq_kv: int, mode: str, dtype: str) -> np.ndarray:
    """(1, 1, seq_q, seq_kv): 0 where key j may be seen by query i, the dtype's lowest value elsewhere."""
    offset = 0 if mode == "TopLeft" else abs(seq_kv - seq_q)
    i = np.arange(seq_q)[:, None]
    j = np.arange(seq_kv)[None, :]
    low = np.finfo(np.dtype(dtype) if dtype != "bfloat16" else np.float32).min
    return np.where(j <= i + offset, 0.0, low)[None, None]


class ScaledDotProductAttentionFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        call = graph.value(var)
        if op_name(call) not in ("relax.nn.attention", "relax.nn.attention_bias"):
            return None
        q, k, v = call.args[:3]
        bias = call.args[3] if len(call.args) > 3 else None
        attrs = call.attrs
        if attrs.window_size is not None:
            raise Refusal(failed="sliding-window attention")
        qd, kd, vd = static_dims(q), static_dims(k), static_dims(v)
        if qd is None or kd is None or vd is None or len(qd) != 4:
            raise Refusal(failed="inputs are not 4-D tensors of known rank")
        head_dim = qd[3]
        if head_dim is None or kd[3] != head_dim:
            raise Refusal(failed=f"query head dim {qd[3]} vs key head dim {kd[3]}")
        dtype = str(var.ty.dtype)
        scale = float(attrs.scale.value) if attrs.scale is not None else 1.0 / math.sqrt(head_dim)
        s = relax.op.matmul(relax.op.permute_dims(q, [0, 2, 1, 3]), relax.op.permute_dims(k, [0, 2, 3, 1]))
        s = relax.op.multiply(s, relax.const(scale, dtype))
        if bias is not None:
            s = relax.op.add(s, bias)
        mode = str(attrs.causal_mask) if attrs.causal_mask is not None else None
        if mode is not None:
            if mode not in ("TopLeft", "BottomRight"):
                raise Refusal(failed=f"causal mask '{mode}'")
            if qd[1] is None or kd[1] is None:
                raise Refusal(failed="causal mask with a symbolic sequence length")
            s = relax.op.add(s, make_const(causal_bias(qd[1], kd[1], mode, dtype), dtype))
        o = relax.op.matmul(relax.op.nn.softmax(s, -1), relax.op.permute_dims(v, [0, 2, 1, 3]))
        value = relax.op.permute_dims(o, [0, 2, 1, 3])
        return Rewrite(var, value, set(), {"causal": mode or "none", "bias": bias is not None})
