"""DepthwiseConv2DQuantFusionPass: a depthwise conv2d of two dequantized int8 tensors computed on the integers.

Rewrites, for an NCHW/OIHW conv2d with one input channel per output channel (groups == channels, as
MobileNet's and EfficientNet's 3x3 blocks) whose input is ``dequantize(x_q, s_x, z_x)`` (per-tensor, int8 or
uint8) and whose weight is ``dequantize(W_q, s_w, 0, axis=0)`` of an int8 constant::

    conv2d(dequantize(x_q), dequantize(W_q), groups=C)
      ->  astype(conv2d(pad(x_u, z_u), W_q, groups=C, int32) - z_u * sum(W_q[c]), float32) * (s_x * s_w[c])

the same algebra as ``conv_quant`` (``_quant``): the padding holds the quantized zero ``z_u``, so the zero-point
correction is one constant per channel, borders included. Why a pass of its own: the kernel it makes reads
and writes bytes instead of float32 (the dequantize in front of a depthwise conv otherwise lands in the
producer's epilogue, which then writes the tensor in float32 four times over), and the depthwise schedule
(``schedule/depthwise_int8.py``) is not the dot-product one: no reduction over channels to feed VNNI.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import DEPTHWISE_CONV2D_QUANT as NAME
from . import _quant
from ._graph import Refusal, Rewrite, int_list


class DepthwiseConv2DQuantFusionPass(_quant.QuantRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        conv = graph.call(var, "relax.nn.conv2d")
        if conv is None:
            return None
        attrs = conv.attrs
        groups = int(attrs.groups)
        if groups == 1:
            return None      # conv_quant's
        act = _quant.activation(graph, conv.args[0])
        if act is None:
            return None
        if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW"):
            raise Refusal(failed="conv layout is not NCHW/OIHW", layout=str(attrs.data_layout))
        in_shape = [int(d) for d in conv.args[0].ty.shape] if conv.args[0].ty.shape is not None else None
        w = _quant.weight(graph, conv.args[1], out_axis=0)
        if w is None:
            raise Refusal(failed="weight is not a dequantized int8 constant")
        if in_shape is None or len(in_shape) != 4 or in_shape[1] != groups or w.q.shape[:2] != (groups, 1):
            raise Refusal(failed="grouped conv with several channels per group stays dequantized fp32 "
                                 "(only the depthwise form has an int8 rewrite)",
                          groups=groups, weight=list(w.q.shape))
        if str(var.ty.dtype) != "float32":
            raise Refusal(failed="conv output is not float32", dtype=str(var.ty.dtype))
        x_u, zp = _quant.as_uint8(graph, act)
        top, left, bottom, right = int_list(attrs.padding)
        x_u, padding = _quant.conv_padding(x_u, zp, (top, left, bottom, right))
        acc = relax.op.nn.conv2d(x_u, relax.const(w.q, "int8"), strides=int_list(attrs.strides), padding=padding,
                                 dilation=int_list(attrs.dilation), groups=groups, out_dtype="int32")
        col_sums = w.q.reshape(w.q.shape[0], -1).astype("int64").sum(axis=1)
        scale = (np.float64(act.scale) * w.scale.astype("float64")).astype("float32")
        value = _quant.requantized(acc, col_sums, zp, scale, (1, -1, 1, 1))
        return Rewrite(var, value, {act.dq} if graph.single_use(act.dq) else set(),
                       {"activation": act.dtype, "channels": groups,
                        "scales": "per-channel" if w.per_channel else "per-tensor",
                        "padded": bool(top or left or bottom or right)})
