"""RMSNormFusionPass: recognise a decomposed RMSNorm as ``R.nn.rms_norm``.

Matches (multiplication/division order free, intermediates used only inside the pattern)::

    ms = mean(x ** 2 | x * x, axes, keepdims)
    y  = x * rsqrt(ms + eps) | x / sqrt(ms + eps) | x * (1 / sqrt(ms + eps))      [* gamma]

with trailing ``axes`` and a constant ``gamma`` varying only along them (scalar factors folded in).
Rewrites to ``rms_norm(x, gamma, axes, epsilon=eps)``; exact by the definition of rms_norm.
"""

from __future__ import annotations

from tvm import relax

from ..switches import RMS_NORM as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, flatten_product, static_dims, make_const, op_name
from ._norm import affine_param, keepdims_axes, trailing


class RMSNormFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        if op_name(graph.value(var)) not in ("relax.multiply", "relax.divide"):
            return None
        prod = flatten_product(graph, var, root=True)
        sqrt_keys = [k for k in prod.atoms if isinstance(k, tuple)]
        vars_ = [k for k in prod.atoms if not isinstance(k, tuple)]
        if len(prod.atoms) != 2 or len(sqrt_keys) != 1 or prod.atoms[sqrt_keys[0]] != -1 or prod.atoms[vars_[0]] != 1:
            return None
        x, ve = vars_[0], sqrt_keys[0][1]
        eps_add = graph.call(ve, "relax.add")
        if eps_add is None:
            return None
        eps, ms_expr = None, None
        for a, b in ((0, 1), (1, 0)):
            if graph.scalar(eps_add.args[b]) is not None:
                eps, ms_expr = graph.scalar(eps_add.args[b]), eps_add.args[a]
        ms = graph.call(ms_expr, "relax.mean") if ms_expr is not None else None
        if ms is None or eps is None or eps < 0:
            return None
        sq = flatten_product(graph, ms.args[0])
        if sq.coef != 1.0 or sq.consts or sq.atoms != {x: 2}:
            return None
        internal = prod.internal | sq.internal | {ve, ms_expr}
        x_shape = static_dims(x)
        if x_shape is None:
            raise Refusal(internal=internal, failed="input rank unknown")
        ndim = len(x_shape)
        axes = keepdims_axes(ms, ndim)
        if not trailing(axes, ndim):
            raise Refusal(internal=internal, failed=f"reduction axes {axes} are not trailing axes (keepdims)")
        scale = prod.const_factor()
        gamma = affine_param(prod.coef * (scale if scale is not None else 1.0), x_shape, axes, 1.0)
        if gamma is None:
            raise Refusal(internal=internal, failed="gamma does not have the normalised shape")
        value = relax.op.nn.rms_norm(x, make_const(gamma, str(x.ty.dtype)), axes, epsilon=eps)
        return Rewrite(var, value, internal, {"axes": str(axes)})
