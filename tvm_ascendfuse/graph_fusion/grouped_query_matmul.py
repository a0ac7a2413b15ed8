"""GroupedQueryMatmulFusionPass: grouped-query attention's products read each KV head once, never a repeat.

A GQA/MQA export repeats each KV head for the query heads sharing it (``expand_dims -> broadcast_to ->
reshape``, transformers' ``repeat_kv``) and multiplies the query heads with the repeated K and V. Query head
``h`` reads KV head ``h // g`` (``g = heads / kv_heads``) and the heads sharing one KV head are consecutive,
so reshaping the query side ``(b, kv * g, s, x)`` to ``(b, kv, g * s, x)`` stacks them as rows of one product
with that KV head:

    matmul(q, permute(repeat(k)))  ->  reshape(matmul(reshape(q, (b, kv, g*s, d)), permute(k)), (b, h, s, L))
    matmul(p, repeat(v))           ->  reshape(matmul(reshape(p, (b, kv, g*s, L)), v), (b, h, s, d))

Exact: the same products and sums. The repeated K and V (``2 (g - 1) L d`` floats a layer and call) are no
longer written and read back, and each product has ``g`` times the rows over the same keys.

Only where no attention kernel takes the attention: a symbolic key count (a decode step built for every
cache length, which the attention patterns refuse). With static keys the attention patterns read the repeat
inside their own kernel (decode) or keep V's repeat apart on purpose (prefill).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..switches import GROUPED_QUERY_MATMUL as NAME
from ._graph import GraphRewritePass, Rewrite, int_list, op_name


def _dims(expr) -> list | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _same(a, b) -> bool:
    return bool(tvm.sym.Analyzer().can_prove_equal(a, b))


def _repeated(graph, expr):
    """(x, g) when ``expr`` is ``x`` (b, kv, L, d) with each head repeated ``g`` times along the head axis
    (``reshape(broadcast_to(expand_dims(x, 2), (b, kv, g, L, d)), (b, kv * g, L, d))``), else None."""
    reshape = graph.call(expr, "relax.reshape")
    spread = graph.call(reshape.args[0], "relax.broadcast_to") if reshape is not None else None
    inserted = graph.call(spread.args[0], "relax.expand_dims") if spread is not None else None
    if inserted is None or int_list(inserted.attrs.axis) != [2]:
        return None
    x = inserted.args[0]
    src, wide, out = _dims(x), _dims(spread), _dims(expr)
    if src is None or wide is None or out is None or len(src) != 4 or len(wide) != 5 or len(out) != 4:
        return None
    g = wide[2]
    if not isinstance(g, tvm.tirx.IntImm) or int(g) < 2:
        return None
    kept = [wide[0], wide[1], wide[3], wide[4]]
    if not all(_same(a, b) for a, b in zip(kept, src)) or not _same(out[1], src[1] * g):
        return None
    if not all(_same(a, b) for a, b in zip((out[0], out[2], out[3]), (src[0], src[2], src[3]))):
        return None
    return x, int(g)


def _symbolic(dim) -> bool:
    return not isinstance(dim, tvm.tirx.IntImm)


class GroupedQueryMatmulFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        mm = graph.value(var)
        if op_name(mm) != "relax.matmul":
            return None
        a, b = mm.args
        keys_side = graph.call(b, "relax.permute_dims")
        if keys_side is not None and int_list(keys_side.attrs.axes) == [0, 1, 3, 2]:
            found, which = _repeated(graph, keys_side.args[0]), "keys"
        else:
            found, which = _repeated(graph, b), "values"
        if found is None:
            return None
        kv, g = found
        rows, out = _dims(a), _dims(var)
        if rows is None or out is None or len(rows) != 4 or not _symbolic(_dims(kv)[2]):
            return None
        batch, heads, s, inner = rows
        kv_heads = _dims(kv)[1]
        if not _same(heads, kv_heads * g):
            return None
        stacked = relax.op.reshape(a, relax.ShapeExpr([batch, kv_heads, s * g, inner]))
        other = relax.op.permute_dims(kv, [0, 1, 3, 2]) if which == "keys" else kv
        product = relax.Call(mm.op, [stacked, other], mm.attrs)
        value = relax.op.reshape(product, relax.ShapeExpr(out))
        return Rewrite(var, value, set(), {"operand": which, "group": g})
