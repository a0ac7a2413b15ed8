"""PackedQkvFusionPass: a packed in-projection (one GEMM whose output is cut into parts) becomes one GEMM
per part, for ``MatMulSiblingMergeFusionPass`` to merge as it merges separate Q/K/V projections.

    qkv = matmul(x, W) [+ b];  q, k, v = split / chunk / slices of qkv along the last axis
        ->  q = matmul(x, W[:, q cols]) [+ b[q cols]];  k = ...;  v = ...

GPT-2's ``c_attn`` and ``nn.MultiheadAttention``'s ``in_proj`` are packed this way (after
``LayoutChainFusionPass`` every part is one ``strided_slice`` of the last axis). Separate parts are what the
sibling merge expects: it merges them back into one GEMM, except for an attention's query projection when
the attention kernel computes it (``query_apart``), which a packed projection would otherwise hide.

Exact: every output column is the same dot product with the same weight column (and bias entry). Taken
when the weight is a 2-D constant, the bias (if any) a constant varying along the last axis only, and every
reader of the projection is a slice of its last axis with step 1.
"""

from __future__ import annotations

from tvm import relax

from ..switches import PACKED_QKV as NAME
from ._graph import GraphRewritePass, Rewrite, int_list, make_const, op_name, static_shape


def _last_axis_slice(graph, var, n: int):
    """(begin, end) when ``var`` is a step-1 slice of the last axis of a rank-r tensor of width ``n``."""
    val = graph.value(var)
    if op_name(val) != "relax.strided_slice":
        return None
    args = [int_list(a) for a in val.args[1:5]]
    if any(a is None for a in args[:3]):
        return None
    axes, begin, end = args[:3]
    strides = args[3] if len(args) > 3 and args[3] is not None else [1]
    rank = len(static_shape(val.args[0]) or ())
    if len(axes) != 1 or axes[0] % max(rank, 1) != rank - 1 or strides != [1]:
        return None
    b, e = begin[0], min(end[0], n)
    b = b + n if b < 0 else b
    e = e + n if e < 0 else e
    return (b, e) if 0 <= b < e <= n else None


class PackedQkvFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        val = graph.value(var)
        if op_name(val) != "relax.strided_slice":
            return None
        src = val.args[0]
        mm, bias, packed = graph.value(src), None, src
        if op_name(mm) == "relax.add":
            for i in (0, 1):
                inner = graph.value(mm.args[i])
                if op_name(inner) == "relax.matmul" and graph.single_use(mm.args[i]):
                    bias, mm = graph.const(mm.args[1 - i]), inner
                    break
            else:
                return None
            if bias is None:
                return None
        if op_name(mm) != "relax.matmul" or not isinstance(mm.args[0], relax.Var):
            return None
        w = graph.const(mm.args[1])
        out = static_shape(packed)
        if w is None or w.ndim != 2 or out is None:
            return None
        n = w.shape[1]
        if bias is not None and (bias.size != n or bias.shape[-1] != n):
            return None
        users = graph.users.get(packed, [])
        parts = [_last_axis_slice(graph, u, n) if u is not None else None for u in users]
        if len(users) < 2 or any(p is None for p in parts):
            return None
        b, e = _last_axis_slice(graph, var, n)
        dtype = str(w.dtype)
        value = relax.Call(mm.op, [mm.args[0], make_const(w[:, b:e], dtype)], mm.attrs)
        if bias is not None:
            value = relax.op.add(value, make_const(bias.reshape(-1)[b:e], str(packed.ty.dtype)))
        return Rewrite(var, value, set(), {"columns": [b, e], "parts": len(users)})
