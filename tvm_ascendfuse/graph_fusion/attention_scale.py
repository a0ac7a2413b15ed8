"""AttentionScaleFusionPass: a scalar scale on the operands of an attention score moves onto the score.

``matmul(q * a, kᵀ * b)`` (or ``q / a``, a scale on one operand only) whose product is softmaxed becomes
``matmul(q, kᵀ) * (a·b)``: the form the attention patterns take (their scale sits between Q·Kᵀ and the
softmax). PyTorch's decomposed ``scaled_dot_product_attention`` scales q and k by √scale each (so do
``nn.MultiheadAttention`` exports); some models scale q before the product. Left in front of the product,
the scales are elementwise kernels of their own (compute in front of a cube operand is not fused).

Exact in real arithmetic (a product of sums times scalars); in floating point the score differs by the
rounding of one multiply, as between any two orders of the same scaling.
"""

from __future__ import annotations

from tvm import relax

from ..switches import ATTENTION_SCALE as NAME
from ._graph import GraphRewritePass, Rewrite, op_name

_SCORE = ("relax.multiply", "relax.divide", "relax.add", "relax.subtract", "relax.astype")


def _scaled(graph, expr):
    """(x, factor, var) for ``expr = x * c`` / ``c * x`` / ``x / c`` with a scalar constant ``c`` and
    ``expr`` read only here; else None."""
    if not graph.single_use(expr):
        return None
    val = graph.value(expr)
    name = op_name(val)
    if name == "relax.multiply":
        for i in (0, 1):
            c = graph.scalar(val.args[1 - i])
            if c is not None:
                return val.args[i], c, expr
    elif name == "relax.divide":
        c = graph.scalar(val.args[1])
        if c:
            return val.args[0], 1.0 / c, expr
    return None


def softmaxed(graph, var) -> bool:
    """Does ``var`` reach a softmax through scale/mask ops only?"""
    stack, seen = [var], set()
    while stack:
        for u in graph.users.get(stack.pop(), []):
            if u is None or u in seen:
                continue
            seen.add(u)
            name = op_name(graph.value(u))
            if name == "relax.nn.softmax":
                return True
            if name in _SCORE:
                stack.append(u)
    return False


class AttentionScaleFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        mm = graph.value(var)
        if op_name(mm) != "relax.matmul" or not softmaxed(graph, var):
            return None
        args, factor, internal = list(mm.args), 1.0, set()
        for i in (0, 1):
            found = _scaled(graph, args[i])
            if found is not None:
                args[i], f, v = found
                factor *= f
                internal.add(v)
        if not internal:
            return None
        dtype = str(var.ty.dtype)
        value = relax.op.multiply(relax.Call(mm.op, args, mm.attrs), relax.const(factor, dtype))
        return Rewrite(var, value, internal, {"operands_scaled": len(internal), "scale": round(factor, 6)})
