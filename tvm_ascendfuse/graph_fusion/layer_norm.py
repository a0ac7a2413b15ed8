"""LayerNormFusionPass: recognise a decomposed LayerNorm (ONNX opset < 17 exports) as ``R.nn.layer_norm``.

Matches (multiplication/division order free, every intermediate used only inside the pattern)::

    mu = mean(x, axes, keepdims); d = x - mu
    v  = mean(d ** 2 | d * d, axes, keepdims)
    y  = d / sqrt(v + eps)  |  d * rsqrt(v + eps)  |  d * (1 / sqrt(v + eps))      [* gamma] [+ beta]

``axes`` must be the trailing axes; ``gamma``/``beta`` constants that vary only along them (scalars
included, and any scalar factor is folded into gamma). Rewrites to
``layer_norm(x, gamma, beta, axes, epsilon=eps)`` (gamma 1 / beta 0 when absent).

Exact: this is the definition of layer_norm (biased variance, eps inside the sqrt). Refused: other
axes, gamma/beta of a shape that is not the normalised shape.
Runs before RMSNormFusionPass, whose pattern matches the inner ``d / sqrt(mean(d^2) + eps) * gamma``.
"""

from __future__ import annotations

from tvm import relax

from ..switches import LAYER_NORM as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, flatten_product, static_dims, make_const, op_name
from ._norm import affine_param, keepdims_axes, trailing


class LayerNormFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        val = graph.value(var)
        core, beta, internal = var, None, set()
        if op_name(val) == "relax.add":
            for a, b in ((0, 1), (1, 0)):
                if graph.const(val.args[b]) is not None and graph.single_use(val.args[a]):
                    core, beta = val.args[a], graph.const(val.args[b])
                    internal.add(core)
                    break
        if op_name(graph.value(core)) not in ("relax.multiply", "relax.divide"):
            return None
        prod = flatten_product(graph, core, root=core.same_as(var))
        sqrt_keys = [k for k in prod.atoms if isinstance(k, tuple)]
        vars_ = [k for k in prod.atoms if not isinstance(k, tuple)]
        if len(prod.atoms) != 2 or len(sqrt_keys) != 1 or prod.atoms[sqrt_keys[0]] != -1 or prod.atoms[vars_[0]] != 1:
            return None
        d, ve = vars_[0], sqrt_keys[0][1]
        sub = graph.call(d, "relax.subtract")
        if sub is None:
            return None
        x = sub.args[0]
        mu = graph.call(sub.args[1], "relax.mean")
        eps_add = graph.call(ve, "relax.add")
        if mu is None or not mu.args[0].same_as(x) or eps_add is None:
            return None
        eps, var_expr = None, None
        for a, b in ((0, 1), (1, 0)):
            if graph.scalar(eps_add.args[b]) is not None:
                eps, var_expr = graph.scalar(eps_add.args[b]), eps_add.args[a]
        variance = graph.call(var_expr, "relax.mean") if var_expr is not None else None
        if variance is None or eps is None or eps < 0:
            return None
        sq = flatten_product(graph, variance.args[0])
        if sq.coef != 1.0 or sq.consts or sq.atoms != {d: 2}:
            return None
        internal |= prod.internal | sq.internal | {d, sub.args[1], ve, var_expr}
        x_shape = static_dims(x)
        if x_shape is None:
            raise Refusal(internal=internal, failed="input rank unknown")
        ndim = len(x_shape)
        axes = keepdims_axes(mu, ndim)
        if axes is None or axes != keepdims_axes(variance, ndim) or not trailing(axes, ndim):
            raise Refusal(internal=internal,
                          failed=f"reduction axes {axes} are not the same trailing axes with keepdims")
        scale = prod.const_factor()
        gamma = affine_param(prod.coef * (scale if scale is not None else 1.0), x_shape, axes, 1.0)
        beta_n = affine_param(beta, x_shape, axes, 0.0)
        if gamma is None or beta_n is None:
            raise Refusal(internal=internal, failed="gamma/beta do not have the normalised shape")
        dtype = str(x.ty.dtype)
        value = relax.op.nn.layer_norm(x, make_const(gamma, dtype), make_const(beta_n, dtype), axes, epsilon=eps)
        return Rewrite(var, value, internal, {"axes": str(axes)})
