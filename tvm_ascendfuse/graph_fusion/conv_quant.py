"""Conv2DQuantFusionPass: a conv2d of two dequantized int8 tensors computed in int8 (int32 accumulation).

Rewrites, for an NCHW/OIHW conv2d (not grouped) whose input is ``dequantize(x_q, s_x, z_x)`` (per-tensor,
int8 or uint8) and whose weight is ``dequantize(W_q, s_w, 0, axis=0)`` of an int8 constant (per-tensor or
per-output-channel)::

    conv2d(dequantize(x_q), dequantize(W_q))
      ->  astype(conv2d(pad(x_u, z_u), W_q, int32) - z_u * sum(W_q[o]), float32) * (s_x * s_w[o])

with ``x_u`` the activation as uint8 and ``z_u`` its zero point (``_quant``). The border holds ``z_u`` (the
quantized zero; ``_quant.conv_padding``), so the zero-point correction is one constant per output channel
everywhere, borders included. Bias, activation, residual and the next ``quantize`` stay
as they are: the grouping fuses them into the int8 conv's epilogue. Exact in integer arithmetic; the float
result differs from the dequantized conv only by float32 rounding. Channel counts off the int8 kernel's
steps (an image's 3 input channels, 24 output channels) get zero weights up to them and the result is
sliced back (``_quant.padded_in_channels``, ``padded_out_channels``). Depthwise convs are
``depthwise_conv_quant``'s; other grouped convs keep the dequantized fp32 form.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import CONV2D_QUANT as NAME
from . import _quant
from ._graph import Refusal, Rewrite, int_list


class Conv2DQuantFusionPass(_quant.QuantRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        conv = graph.call(var, "relax.nn.conv2d")
        if conv is None:
            return None
        act = _quant.activation(graph, conv.args[0])
        if act is None:
            return None
        attrs = conv.attrs
        if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW"):
            raise Refusal(failed="conv layout is not NCHW/OIHW", layout=str(attrs.data_layout))
        if int(attrs.groups) != 1:
            return None      # depthwise_conv_quant's (which refuses the other grouped convs with the reason)
        if str(var.ty.dtype) != "float32":
            raise Refusal(failed="conv output is not float32", dtype=str(var.ty.dtype))
        w = _quant.weight(graph, conv.args[1], out_axis=0)
        if w is None:
            raise Refusal(failed="weight is not a dequantized int8 constant")
        x_u, zp = _quant.as_uint8(graph, act)
        top, left, bottom, right = int_list(attrs.padding)
        w_q, out_channels = _quant.padded_out_channels(_quant.padded_in_channels(w.q))
        x_u, padding = _quant.conv_padding(x_u, zp, (top, left, bottom, right), w_q.shape[1] - w.q.shape[1])
        acc = relax.op.nn.conv2d(x_u, relax.const(w_q, "int8"), strides=int_list(attrs.strides), padding=padding,
                                 dilation=int_list(attrs.dilation), out_dtype="int32")
        if w_q.shape[0] != out_channels:
            acc = relax.op.strided_slice(acc, axes=[1], begin=[0], end=[out_channels])
        col_sums = w.q.reshape(w.q.shape[0], -1).astype("int64").sum(axis=1)
        scale = (np.float64(act.scale) * w.scale.astype("float64")).astype("float32")
        value = _quant.requantized(acc, col_sums, zp, scale, (1, -1, 1, 1))
        return Rewrite(var, value, {act.dq} if graph.single_use(act.dq) else set(),
                       {"activation": act.dtype, "scales": "per-channel" if w.per_channel else "per-tensor",
                        "padded": bool(top or left or bottom or right)})
