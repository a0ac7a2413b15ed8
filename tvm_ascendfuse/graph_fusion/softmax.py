"""SoftmaxFusionPass: recognise a decomposed softmax as ``R.nn.softmax``.

Matches ``e = exp(x - max(x, axis, keepdims)); y = e / sum(e, axis, keepdims)`` (also ``e * (1 / s)``,
and ``exp(x)`` without the max subtraction) with one and the same reduction axis; rewrites to
``softmax(x, axis)``. Exact: subtracting the row maximum cancels in the ratio, so both forms equal
softmax by definition (softmax itself subtracts the max, so it never overflows where the plain form does).
The exp and sum must be used only inside the pattern.
"""

from __future__ import annotations

from tvm import relax

from ..switches import SOFTMAX as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, static_dims, flatten_product, op_name
from ._norm import keepdims_axes


class SoftmaxFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        if op_name(graph.value(var)) not in ("relax.multiply", "relax.divide"):
            return None
        prod = flatten_product(graph, var, root=True)
        if prod.consts or prod.coef != 1.0 or len(prod.atoms) != 2:
            return None
        num = [k for k, e in prod.atoms.items() if e == 1 and not isinstance(k, tuple)]
        den = [k for k, e in prod.atoms.items() if e == -1 and not isinstance(k, tuple)]
        if len(num) != 1 or len(den) != 1:
            return None
        e_var, s_var = num[0], den[0]
        exp = graph.call(e_var, "relax.exp")
        total = graph.call(s_var, "relax.sum")
        if exp is None or total is None or not total.args[0].same_as(e_var):
            return None
        x, internal = exp.args[0], prod.internal | {e_var, s_var}
        shape = static_dims(x)
        if shape is None:
            raise Refusal(internal=internal, failed="input rank unknown")
        axes = keepdims_axes(total, len(shape))
        sub = graph.call(x, "relax.subtract")
        if sub is not None:
            mx = graph.call(sub.args[1], "relax.max")
            if mx is not None and mx.args[0].same_as(sub.args[0]) and keepdims_axes(mx, len(shape)) == axes:
                internal |= {x, sub.args[1]}
                x = sub.args[0]
        if axes is None or len(axes) != 1:
            raise Refusal(internal=internal, failed=f"sum over axes {axes} is not one axis with keepdims")
        return Rewrite(var, relax.op.nn.softmax(x, axes[0]), internal, {"axis": axes[0]})
