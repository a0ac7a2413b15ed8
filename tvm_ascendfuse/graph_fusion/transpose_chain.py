"""TransposeChainFusionPass: a chain of ``permute_dims`` becomes one ``permute_dims`` (or none).

``permute_dims(permute_dims(x, a), b)`` is ``permute_dims(x, [a[b[i]] ...])``; a composition that is the
identity leaves ``x`` itself. Exact: both move the same elements to the same places. PyTorch exports
produce such chains around attention (heads to axis 1 for ``scaled_dot_product_attention``, back to axis 2
for ``R.nn.attention``, and back again); collapsed, the transposes look as in an ONNX export, which is the
form the attention patterns and the attention + projection kernel expect. Intermediates used elsewhere are
left in place for their other consumers.
"""

from __future__ import annotations

from tvm import relax

from ..switches import TRANSPOSE_CHAIN as NAME
from ._graph import GraphRewritePass, Rewrite, static_dims, int_list, op_name


def _axes(call, rank: int) -> list[int] | None:
    if call.attrs.axes is None:
        return list(reversed(range(rank)))
    axes = int_list(call.attrs.axes)
    return None if axes is None else [a % rank for a in axes]


class TransposeChainFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        call = graph.value(var)
        if op_name(call) != "relax.permute_dims":
            return None
        shape = static_dims(var)
        if shape is None:
            return None
        rank = len(shape)
        composed = _axes(call, rank)
        src, internal, steps, single = call.args[0], set(), 1, True
        while composed is not None:
            inner = graph.call(src, "relax.permute_dims")
            if inner is None:
                break
            inner_axes = _axes(inner, rank)
            if inner_axes is None:
                break
            composed = [inner_axes[i] for i in composed]
            single = single and graph.single_use(src)
            if single:
                internal.add(src)
            src, steps = inner.args[0], steps + 1
        if composed is None or steps == 1:
            return None
        value = src if composed == list(range(rank)) else relax.op.permute_dims(src, composed)
        return Rewrite(var, value, internal, {"transposes": steps, "axes": composed})
