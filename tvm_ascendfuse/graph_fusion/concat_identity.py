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
from ._graph import FunctionGraph


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
        return _Rewire(alias).visit_expr(func)


@relax.expr_functor.mutator
class _Rewire(relax.PyExprMutator):
    """Uses of an aliased variable read its source instead; the alias binding is dropped when it is a dataflow
    variable (an output variable keeps a binding, so the function still returns it)."""

    def __init__(self, alias: dict):
        super().__init__()
        self.alias = alias

    def _source(self, var):
        while var in self.alias:
            var = self.alias[var]
        return var

    def visit_var_(self, var):
        if var in self.alias:
            return self.visit_expr(self._source(var))
        return super().visit_var_(var)

    def visit_dataflow_var_(self, var):
        if var in self.alias:
            return self.visit_expr(self._source(var))
        return super().visit_dataflow_var_(var)

    def visit_var_binding_(self, binding):
        if binding.var in self.alias and isinstance(binding.var, relax.DataflowVar):
            return
        super().visit_var_binding_(binding)
