"""SwishFusionPass: recognise ``x * sigmoid(x)`` (either order) as ``R.nn.silu(x)``.

Exact: it is the definition of SiLU/Swish-1. The sigmoid must be used only by this multiply.
"""

from __future__ import annotations

from tvm import relax

from ..switches import SWISH as NAME
from ._graph import GraphRewritePass, Rewrite, op_name


class SwishFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        mul = graph.value(var)
        if op_name(mul) != "relax.multiply":
            return None
        for a, b in ((0, 1), (1, 0)):
            sig = graph.call(mul.args[b], "relax.sigmoid")
            if sig is not None and sig.args[0].same_as(mul.args[a]):
                return Rewrite(var, relax.op.nn.silu(mul.args[a]), {mul.args[b]})
        return None
