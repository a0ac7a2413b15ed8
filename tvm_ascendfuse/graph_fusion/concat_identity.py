"""ConcatIdentityFusionPass: a concat of a single tensor is that tensor.

Rewrites::

    y = concat([x], axis)   ->   y = x

Why: PyTorch exports ``torch.cat([x])`` as a one-input Concat (DenseNet's first layer of every dense block
concatenates the list of features holding only the block input). Kept, it is an injective op the grouping
fuses somewhere as a copy, and a kernel holding both ``x`` and its copy writes the same tensor twice (DenseNet's
stem conv + max-pool kernel wrote the pooled features and their one-part concat, and no rule scheduled it).
Exact. Binding the result to ``x`` itself is not expressible in a dataflow block (every binding has a value),
so the concat's consumers are rewired to ``x`` and the dead binding is removed.
"""

from __future__ import annotations

from tvm import relax

from ..switches import CONCAT_IDENTITY as NAME
from ..fusion_pass import FusionPass
from ._graph import FunctionGraph, Rewire


class ConcatIdentityFusionPass(FusionPass):
    """See the module docstring."""

    switch_name = NAME

    def transform_function(self, func, mod):
        graph = FunctionGraph.of(func)
        alias = {}
        for var in graph.order:
            call = graph.call(var, "relax.concat")
            if call is None:
                continue
            parts = call.args[0]
            if isinstance(parts, relax.Var):
                parts = graph.value(parts)
            if not isinstance(parts, relax.Tuple) or len(parts.fields) != 1:
                continue
            if self.take(var.name, parts=1):
                alias[var] = parts.fields[0]
        if not alias:
            return func
        return Rewire(alias).visit_expr(func)
