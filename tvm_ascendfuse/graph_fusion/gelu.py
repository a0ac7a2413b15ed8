"""GeluFusionPass: recognise decomposed GELU as ``R.nn.gelu`` (erf form) or ``R.nn.gelu_tanh``.

Matches, with the factors multiplied in any order/association and constants compared with a relative
tolerance that covers their rounding in the dtype (1e-4 for fp32, 1e-3 fp16, 4e-3 bf16; a 16-bit model computed
in float32 by the precision phase is compared in its 16-bit dtype, ``FunctionGraph.const_dtype``)::

    0.5 * x * (1 + erf(x / sqrt(2)))               (or x * 0.70710678 inside erf)   -> gelu(x)
    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))                         -> gelu_tanh(x)

``x**3`` may be ``pow(x, 3)`` or ``x * x * x``. Every intermediate must be used only inside the pattern.
Exact: these are the definitions of the two ops (up to the rounding of the exported constants).
"""

from __future__ import annotations

import math

from tvm import relax

from ..switches import GELU as NAME
from ._graph import GraphRewritePass, Rewrite, close, flatten_product, op_name


_ERF_SCALE = 1.0 / math.sqrt(2.0)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def _one_plus(graph, expr, dt):
    """``(f, arg, f_var)`` for ``expr = f(arg) + 1`` with f erf or tanh, else None."""
    add = graph.call(expr, "relax.add")
    if add is None:
        return None
    for a, b in ((0, 1), (1, 0)):
        if close(graph.scalar(add.args[b]), 1.0, dt):
            inner = graph.call(add.args[a], "relax.erf", "relax.tanh")
            if inner is not None:
                return op_name(inner), inner.args[0], add.args[a]
    return None


def _scaled_x(graph, expr, x, scale, dt):
    """Internal vars if ``expr == scale * x``, else None."""
    p = flatten_product(graph, expr)
    if p.consts or p.atoms != {x: 1} or not close(p.coef, scale, dt):
        return None
    return p.internal


def _tanh_arg(graph, expr, x, dt):
    """Internal vars if ``expr == sqrt(2/pi) * (x + 0.044715 * x**3)``, else None."""
    p = flatten_product(graph, expr)
    if p.consts or len(p.atoms) != 1 or not close(p.coef, _TANH_SCALE, dt):
        return None
    (s, e), = p.atoms.items()
    add = graph.call(s, "relax.add") if e == 1 and not isinstance(s, tuple) else None
    if add is None:
        return None
    for a, b in ((0, 1), (1, 0)):
        if add.args[a].same_as(x):
            cube = flatten_product(graph, add.args[b])
            if not cube.consts and cube.atoms == {x: 3} and close(cube.coef, _CUBIC, dt):
                return p.internal | cube.internal | {s}
    return None


class GeluFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        if op_name(graph.value(var)) not in ("relax.multiply", "relax.divide"):
            return None
        dt = graph.const_dtype(str(var.ty.dtype))
        prod = flatten_product(graph, var, root=True)
        if prod.consts or len(prod.atoms) != 2 or not close(prod.coef, 0.5, dt) or any(
                isinstance(k, tuple) or e != 1 for k, e in prod.atoms.items()):
            return None
        a, b = prod.atoms
        for x, other in ((a, b), (b, a)):
            found = _one_plus(graph, other, dt)
            if found is None:
                continue
            kind, arg, f_var = found
            if kind == "relax.erf":
                inner = _scaled_x(graph, arg, x, _ERF_SCALE, dt)
                value = relax.op.nn.gelu(x)
            else:
                inner = _tanh_arg(graph, arg, x, dt)
                value = relax.op.nn.gelu_tanh(x)
            if inner is None:
                continue
            internal = prod.internal | inner | {other, f_var}
            return Rewrite(var, value, internal, {"form": kind.split(".")[-1]})
        return None
