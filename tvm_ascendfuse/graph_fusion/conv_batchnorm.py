"""ConvBatchnormFusionPass: fold inference BatchNorm into the weights and bias of the conv (or matmul)
that produces its input.

Rewrites (the forms TVM's ONNX importer produces, bias optional)::

    bn = batch_norm(conv2d(x, W) [+ b], gamma, beta, mean, var, axis=1, training=False); y = bn[0]
      ->  y = conv2d(x, W * s[:, None, None, None]) + ((b - mean) * s + beta).reshape(1, C, 1, 1)
    with s = gamma / sqrt(var + eps)

and the same for ``matmul(x, W_const) [+ b]`` with BN on the last axis (``W * s[None, :]``, bias ``(N,)``).

Exact: inference BN is the per-channel affine map ``(t - mean) * s + beta``; scaling output channel ``o``
of the conv by ``s[o]`` equals scaling weight slice ``W[o]`` (this holds for grouped and depthwise convs
too, whose weight's first axis is still the output channel). The constants are computed in float64 and
rounded once to the weight dtype. Needs constant weights, bias and BN parameters; refuses otherwise, and
when the conv output or the BN statistics outputs have other consumers.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import CONV_BATCHNORM as NAME
from ._graph import FunctionGraph, GraphRewritePass, Refusal, Rewrite, static_dims, make_const, op_name


def _channel_bias(arr: np.ndarray, out_shape: tuple, axis: int) -> np.ndarray | None:
    """``arr`` as a 1-D per-channel vector if it broadcasts onto ``out_shape`` varying only along ``axis``."""
    if arr.ndim > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - arr.ndim) + tuple(arr.shape)
    channels = out_shape[axis]
    for i, d in enumerate(padded):
        if i != axis and d != 1:
            return None
    if padded[axis] not in (1, channels):
        return None
    return np.broadcast_to(arr.reshape(-1), (channels,)).astype("float64")


class ConvBatchnormFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph: FunctionGraph):
        item = graph.value(var)
        if not isinstance(item, relax.TupleGetItem) or int(item.index) != 0:
            return None
        bn = graph.call(item.tuple_value, "relax.nn.batch_norm")
        if bn is None or bool(bn.attrs.training):
            return None
        data = bn.args[0]
        internal = {item.tuple_value, data}
        producer, bias_expr = graph.value(data), None
        if op_name(producer) == "relax.add":
            for a, b in ((0, 1), (1, 0)):
                if op_name(graph.value(producer.args[a])) in ("relax.nn.conv2d", "relax.matmul") \
                        and graph.const(producer.args[b]) is not None:
                    internal.add(producer.args[a])
                    producer, bias_expr = graph.value(producer.args[a]), producer.args[b]
                    break
            else:
                return None
        kind = op_name(producer)
        if kind not in ("relax.nn.conv2d", "relax.matmul"):
            return None
        detail = {"producer": kind.split(".")[-1], "bias": bias_expr is not None}

        def refusal(failed: str) -> Refusal:
            return Refusal(internal=internal, failed=failed, **detail)

        shape = static_dims(data)
        if shape is None:
            raise refusal("output rank unknown")
        axis = int(bn.attrs.axis) % len(shape)
        if kind == "relax.nn.conv2d":
            attrs = producer.attrs
            layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
            if layouts != ("NCHW", "OIHW", "NCHW") or axis != 1:
                raise refusal(f"layouts {layouts} / BN axis {axis} not NCHW/OIHW/axis 1")
        elif axis != len(shape) - 1:
            raise refusal(f"BN axis {axis} is not the matmul's output-feature axis")

        weight = graph.const(producer.args[1])
        if weight is None:
            raise refusal("weights not constant")
        if kind == "relax.matmul" and weight.ndim != 2:
            raise refusal(f"matmul weight has rank {weight.ndim}, expected 2")
        params = [graph.const(p) for p in bn.args[1:5]]
        if any(p is None for p in params):
            raise refusal("batch_norm parameters not constant")
        channels = int(np.asarray(params[0]).size)
        if weight.shape[0 if kind == "relax.nn.conv2d" else 1] != channels:
            raise refusal(f"weight shape {weight.shape} does not match {channels} BN channels")
        out_shape = tuple(channels if i == axis else 1 for i in range(len(shape)))   # bias may only vary on axis
        gamma, beta, mean, var_ = (_channel_bias(p, (channels,), 0) for p in params)
        if any(p is None for p in (gamma, beta, mean, var_)):
            raise refusal("batch_norm parameters are not per-channel vectors")
        bias = np.zeros(channels)
        if bias_expr is not None:
            bias = _channel_bias(graph.const(bias_expr), out_shape, axis)
            if bias is None:
                raise refusal("bias is not a per-channel constant")

        if not bool(bn.attrs.scale):
            gamma = np.ones(channels)
        if not bool(bn.attrs.center):
            beta = np.zeros(channels)
        scale = gamma / np.sqrt(var_ + float(bn.attrs.epsilon))
        new_bias = (bias - mean) * scale + beta
        wdtype = str(weight.dtype)
        out_dtype = str(data.ty.dtype)
        if kind == "relax.nn.conv2d":
            w_new = weight.astype("float64") * scale[:, None, None, None]
            conv = relax.Call(producer.op, [producer.args[0], make_const(w_new, wdtype)], producer.attrs)
            value = relax.op.add(conv, make_const(new_bias.reshape(1, channels, 1, 1), out_dtype))
        else:
            w_new = weight.astype("float64") * scale[None, :]
            mm = relax.Call(producer.op, [producer.args[0], make_const(w_new, wdtype)], producer.attrs)
            value = relax.op.add(mm, make_const(new_bias, out_dtype))
        return Rewrite(var, value, internal, detail)
