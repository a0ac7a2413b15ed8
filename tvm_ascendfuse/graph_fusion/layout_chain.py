"""LayoutChainFusionPass: a chain of layout ops becomes the one canonical chain with the same effect.

Exporters move heads around in many ways: ``split`` + per-part ``reshape``/``transpose`` (GPT-2's packed
Q|K|V), ``reshape`` → ``unsqueeze`` → ``transpose`` → ``squeeze`` → ``take(index)`` → ``reshape`` →
``transpose`` → ``reshape`` (``nn.MultiheadAttention``'s packed in-projection, seq-first), reshapes to 2-D
and back around GEMMs. Whatever the ops, a chain of layout ops from a tensor ``x`` to ``y`` only moves
elements, so it equals the shortest chain of the form

    strided_slice(x) (one box)  ->  reshape  ->  permute_dims  ->  reshape

that moves them the same way (``_layout.express``), which is what an ONNX export of BERT has and what the
attention patterns (head split of a merged projection: slice → reshape → permute) and the sibling merge
read. Rewritten: every chain end (a layout op read by something other than a layout op) whose canonical
chain has fewer ops, or as many ops but none of split/take/expand_dims/squeeze/flatten. ``broadcast_to``
ends a chain (it repeats elements, e.g. GQA's key/value heads, which the attention kernel reads in place).

Exact: the rewritten chain is checked to give every element from the same source element (the index maps
are compared with numpy). Intermediates with other readers stay for them.
"""

from __future__ import annotations

from ..switches import LAYOUT_CHAIN as NAME
from ._graph import GraphRewritePass, Rewrite, op_name
from ._layout import chain_to, express_chain, is_layout

_CANONICAL = ("relax.reshape", "relax.permute_dims", "relax.strided_slice")


def chain_op(graph, var) -> bool:
    """A layout op this pass follows (everything ``is_layout`` knows except ``broadcast_to``)."""
    return is_layout(graph, var) and op_name(graph.value(var)) != "relax.broadcast_to"


class LayoutChainFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        if not chain_op(graph, var):
            return None
        users = graph.users.get(var, [])
        if users and all(u is not None and chain_op(graph, u) for u in users):
            return None                      # not the end of a chain: its readers' chains include it
        src, ops = chain_to(graph, var, stop=lambda v: not chain_op(graph, v))
        if not ops:
            return None
        layout = express_chain(graph, src, ops)
        if layout is None:
            return None
        odd = any(op_name(graph.value(v)) not in _CANONICAL for v in ops)
        if layout.ops > len(ops) or (layout.ops == len(ops) and not odd):
            return None
        internal = set()
        for v in reversed(ops[:-1]):         # up to the first value something else reads too
            if not graph.single_use(v):
                break
            internal.add(v)
        return Rewrite(var, layout.emit(src), internal, {"ops_before": len(ops), "ops_after": layout.ops})
