"""ConcatSplitFusionPass: move an elementwise op above a concat so each piece fuses with its producer.

Rule::

    f(concat([a, b, ...], axis))            ->  concat([f(a), f(b), ...], axis)
    g(concat([a, b, ...], axis), c_const)   ->  concat([g(a, c_a), g(b, c_b), ...], axis)   (either operand order)
    batch_norm(concat([a, b, ...]), P)[0]   ->  concat([batch_norm(a, P_a)[0], batch_norm(b, P_b)[0], ...])

``f`` is a unary elementwise op (relu, silu, gelu, sigmoid, tanh, exp, clip, leaky_relu, astype, ...),
``g`` a binary elementwise op with a constant; ``c_i`` is the slice of ``c`` that lines up with part ``i``
along ``axis`` (``c`` itself when it does not vary along ``axis``); for an inference ``batch_norm``
(constant parameters) ``P_i`` are the parameter slices of part ``i``'s channels when the BN axis is the
concat axis, else the whole parameters. Exact: each of these ops computes every output element from
the same-position input element (and per-channel constants), so it commutes with concatenation.

The BN case is why this pass runs before ConvBatchnormFusionPass: ``concat(conv_a, conv_b) -> BN ->
act`` (CSP blocks) becomes ``concat(conv_a' + b_a, conv_b' + b_b)`` after folding, and the activation,
moved in the next round, fuses into each conv.

Refused (recorded, left alone): the concat has other consumers (it would be computed anyway and the
op duplicated), or a part is not produced by an op used only by this concat (a function input, a
constant or a shared value: the moved op would have no producer to fuse into), or the constant would
broadcast the result to a larger shape. The pass repeats (up to 4 rounds) so a chain ``g(f(concat))``
moves as a whole; each move is one match.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import CONCAT_SPLIT as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, make_const, op_name, static_shape


UNARY = {"relax.nn.relu", "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.leakyrelu",
         "relax.sigmoid", "relax.tanh", "relax.exp", "relax.negative", "relax.abs", "relax.sqrt", "relax.erf",
         "relax.clip", "relax.astype", "relax.square", "relax.log", "relax.floor", "relax.ceil", "relax.round"}
BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
          "relax.power"}


class ConcatSplitFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME
    rounds = 4

    def match(self, var, graph):
        call = graph.value(var)
        if isinstance(call, relax.TupleGetItem):
            return self._match_batch_norm(var, call, graph)
        name = op_name(call)
        if name in UNARY:
            if any(isinstance(getattr(a, "ty", None), relax.TensorType) for a in call.args[1:]):
                return None
            pos, const = 0, None
        elif name in BINARY:
            pos = next((i for i in (0, 1) if graph.call(call.args[i], "relax.concat") is not None), None)
            if pos is None:
                return None
            const = graph.const(call.args[1 - pos])
            if const is None:
                return None
        else:
            return None
        found = _concat_parts(graph, call.args[pos], name)
        if found is None:
            return None
        parts, internal, out_shape, axis, detail = found
        pieces = _split_const(const, out_shape, axis, [static_shape(p) for p in parts.fields])
        if const is not None and pieces is None:
            raise Refusal(internal=internal, failed="constant would broadcast the result to a larger shape", **detail)
        new_parts = []
        for i, p in enumerate(parts.fields):
            args = list(call.args)
            args[pos] = p
            if const is not None:
                args[1 - pos] = make_const(pieces[i], str(const.dtype))
            new_parts.append(relax.Call(call.op, args, call.attrs))
        return Rewrite(var, relax.op.concat(new_parts, axis), internal, detail)

    @staticmethod
    def _match_batch_norm(var, item, graph):
        bn = graph.call(item.tuple_value, "relax.nn.batch_norm")
        if int(item.index) != 0 or bn is None or bool(bn.attrs.training):
            return None
        found = _concat_parts(graph, bn.args[0], "relax.nn.batch_norm")
        if found is None:
            return None
        parts, internal, out_shape, axis, detail = found
        internal.add(item.tuple_value)
        params = [graph.const(p) for p in bn.args[1:5]]
        if any(p is None for p in params):
            raise Refusal(internal=internal, failed="batch_norm parameters not constant", **detail)
        bn_axis = int(bn.attrs.axis) % len(out_shape)
        bounds = np.cumsum([0] + [static_shape(p)[axis] for p in parts.fields])
        new_parts = []
        for i, p in enumerate(parts.fields):
            sliced = [q[bounds[i]:bounds[i + 1]] if bn_axis == axis else q for q in params]
            consts = [make_const(q, str(q.dtype)) for q in sliced]
            new_parts.append(relax.TupleGetItem(relax.Call(bn.op, [p, *consts], bn.attrs), 0))
        return Rewrite(var, relax.op.concat(new_parts, axis), internal, detail)


def _concat_parts(graph, cat_var, op):
    """``(parts Tuple, internal, out_shape, axis, detail)`` if ``cat_var`` is a concat we may split.

    None if it is not a concat; raises Refusal if it is one but splitting would not help."""
    cat = graph.call(cat_var, "relax.concat")
    if cat is None:
        return None
    parts, internal = cat.args[0], {cat_var}
    if isinstance(parts, relax.Var):
        internal.add(parts)
        parts = graph.value(parts)
    if not isinstance(parts, relax.Tuple):
        return None
    detail = {"op": op.split(".")[-1], "parts": len(parts.fields)}
    if not graph.single_use(cat_var):
        raise Refusal(internal=internal, failed="concat has other consumers", **detail)
    for i, p in enumerate(parts.fields):
        producer = graph.value(p)
        if not isinstance(producer, (relax.Call, relax.TupleGetItem)) or not graph.single_use(p):
            raise Refusal(internal=internal, failed=f"part {i} has no single producer to fuse with", **detail)
    out_shape = static_shape(cat_var)
    if out_shape is None or any(static_shape(p) is None for p in parts.fields):
        raise Refusal(internal=internal, failed="dynamic shape", **detail)
    return parts, internal, out_shape, int(cat.attrs.axis) % len(out_shape), detail


def _split_const(const, out_shape, axis, part_shapes):
    """Per-part slices of ``const`` along ``axis`` (None if it does not fit ``out_shape``)."""
    if const is None:
        return None
    if const.ndim > len(out_shape) or any(s is None for s in part_shapes):
        return None
    padded = (1,) * (len(out_shape) - const.ndim) + tuple(const.shape)
    if any(d not in (1, o) for d, o in zip(padded, out_shape)):
        return None
    arr = const.reshape(padded)
    if padded[axis] == 1:
        return [const] * len(part_shapes)
    bounds = np.cumsum([0] + [s[axis] for s in part_shapes])
    return [np.take(arr, range(bounds[i], bounds[i + 1]), axis=axis) for i in range(len(part_shapes))]
