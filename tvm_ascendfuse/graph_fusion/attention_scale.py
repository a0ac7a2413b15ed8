"""AttentionScaleFusionPass: a scalar scale on the operands of an attention score moves onto the score.

``matmul(q * a, kᵀ * b)`` (or ``q / a``, a scale on one operand only; the scale possibly in front of the
operand's head split, reshapes and transposes) whose product is softmaxed becomes ``matmul(q, kᵀ) * (a·b)``: the form the attention patterns take (their scale sits between Q·Kᵀ and the
softmax). PyTorch's decomposed ``scaled_dot_product_attention`` scales q and k by √scale each (so do
``nn.MultiheadAttention`` exports); some models scale q before the product. Left in front of the product,
the scales are elementwise kernels of their own (compute in front of a cube operand is not fused).

Exact in real arithmetic (a product of sums times scalars); in floating point the score differs by the
rounding of one multiply, as between any two orders of the same scaling.
"""

from __future__ import annotations

from tvm import relax

from ..switches import ATTENTION_SCALE as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, op_name, static_shape

_SCORE = ("relax.multiply", "relax.divide", "relax.add", "relax.subtract", "relax.astype")


# Layout ops a scalar scale commutes with: Whisper scales its query projection before splitting it into
# heads (``(x·Wq + b) * s -> reshape -> transpose -> matmul``), so the scale sits behind them.
_LAYOUT = ("relax.reshape", "relax.permute_dims")


def _scaled(graph, expr):
    """(x', factor, vars) for an operand ``expr`` that is ``x * c`` / ``c * x`` / ``x / c`` (a scalar constant
    ``c``), possibly behind reshapes and transposes (then ``x'`` is those layout ops applied to ``x``); every
    var on the way read only here. Else None."""
    layout, cur = [], expr
    while graph.single_use(cur) and op_name(graph.value(cur)) in _LAYOUT:
        layout.append(cur)
        cur = graph.value(cur).args[0]
    found = _scaled_directly(graph, cur)
    if found is None:
        return None
    x, factor, var = found
    for v in reversed(layout):
        val = graph.value(v)
        x = relax.Call(val.op, [x, *val.args[1:]], val.attrs)
    return x, factor, {var, *layout}


def _scaled_directly(graph, expr):
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
        args, factor, internal, scaled = list(mm.args), 1.0, set(), 0
        for i in (0, 1):
            found = _scaled(graph, args[i])
            if found is not None:
                args[i], f, vs = found
                factor *= f
                internal |= vs
                scaled += 1
        if not internal:
            return None
        if len(internal) > scaled:
            # through a head split the scale leaves a projection epilogue (free there) for the score, which
            # only pays when the attention becomes one kernel: that needs cube_m complete score rows (the
            # score, its scaled copy, the probabilities) in UB. Whisper's 1500 keys need 288000 B of 188416:
            # moved anyway, the score kernel did the multiply and the query projection left its K|V sibling
            # (measured 1.16x slower end to end)
            shape = static_shape(var)
            target = self.target
            need = 3 * min(target.cube_m, shape[-2]) * shape[-1] * 4 if shape else None
            if need is None or need > target.ub_usable:
                raise Refusal(internal=internal, failed="score rows of the attention do not fit UB",
                              bytes_needed=need, bytes_available=target.ub_usable)
        dtype = str(var.ty.dtype)
        value = relax.op.multiply(relax.Call(mm.op, args, mm.attrs), relax.const(factor, dtype))
        return Rewrite(var, value, internal, {"operands_scaled": scaled, "scale": round(factor, 6)})
