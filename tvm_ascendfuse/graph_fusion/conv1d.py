"""Conv1dAsConv2dFusionPass: a 1-D convolution (and its per-channel epilogue) as a conv2d of height 1.

    y = act(conv1d(x, W) + b)      (NCW / OIW)
        ->  y = reshape(act(conv2d(reshape(x, (N, C, 1, W)), W[:, :, None, :]) + b[..., None]), (N, C, W_out))

Whisper's and other speech models' stems are conv1d + GELU. The conv patterns, the grouping and the conv
rule know conv2d (NCHW/OIHW) only; a height-1 conv2d is the same sum over the same taps, so the 1-D conv
reaches the conv kernel (cube implicit GEMM with its epilogue on the output block) instead of the fallback.
The epilogue moves into 4-D with it: the single-use chain of activations and of adds/multiplies by
per-channel constants right after the conv (a reshape between the conv and its epilogue would cut the
conv pattern). The reshape back to 3-D comes after the last epilogue op.

Exact: every output element is the same products summed in the same order; the epilogue ops are the same
elementwise ops on the same values, only indexed with one more unit axis. Taken when the conv1d has static
shapes, layouts NCW/OIW and a constant or variable weight; constants of the epilogue must vary along the
channel axis only (else the chain ends before them).
"""

from __future__ import annotations

from tvm import relax

from ..switches import CONV1D_AS_CONV2D as NAME
from ._graph import GraphRewritePass, Rewrite, int_list, make_const, op_name, static_shape

# elementwise ops of one tensor argument that may follow the conv in its epilogue
_UNARY = ("relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.relu", "relax.nn.silu", "relax.sigmoid",
          "relax.tanh", "relax.nn.leakyrelu", "relax.clip")
_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _channel_const(graph, expr, channels: int):
    """The constant as a (1, C or 1, 1, 1) array when it varies along the channel axis of an NCW tensor
    only (scalars included), else None."""
    arr = graph.const(expr)
    if arr is None or arr.ndim > 3:
        return None
    padded = arr.reshape((1,) * (3 - arr.ndim) + tuple(arr.shape))
    if padded.shape[0] != 1 or padded.shape[2] != 1 or padded.shape[1] not in (1, channels):
        return None
    return padded.reshape(1, padded.shape[1], 1, 1)


def _dtype(value):
    text = str(value) if value is not None else ""
    return None if text in ("", "void", "None") else text


class Conv1dAsConv2dFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        conv = graph.value(var)
        if op_name(conv) != "relax.nn.conv1d":
            return None
        a = conv.attrs
        out_layout = str(a.out_layout) if a.out_layout else str(a.data_layout)
        if (str(a.data_layout), str(a.kernel_layout), out_layout) != ("NCW", "OIW", "NCW"):
            return None
        x, w = conv.args
        x_shape, w_shape, out_shape = static_shape(x), static_shape(w), static_shape(var)
        if x_shape is None or w_shape is None or out_shape is None or len(x_shape) != 3:
            return None
        strides, dilation, padding = int_list(a.strides), int_list(a.dilation), int_list(a.padding)
        if strides is None or dilation is None or padding is None:
            return None
        pad = padding * 2 if len(padding) == 1 else padding
        w_arr = graph.const(w)
        w4 = (make_const(w_arr[:, :, None, :], str(w_arr.dtype)) if w_arr is not None
              else relax.op.reshape(w, (w_shape[0], w_shape[1], 1, w_shape[2])))
        # reshapes, not expand_dims: a reshape outside a kernel is a view (no copy kernel)
        x4 = relax.op.reshape(x, (x_shape[0], x_shape[1], 1, x_shape[2]))
        cur = relax.op.nn.conv2d(x4, w4, strides=(1, strides[0]),
                                 padding=(0, pad[0], 0, pad[1]), dilation=(1, dilation[0]),
                                 groups=int(a.groups), out_dtype=_dtype(a.out_dtype))
        # the epilogue: single-use elementwise ops right after the conv, redone in 4-D
        channels, root, internal, epilogue = out_shape[1], var, set(), []
        while graph.single_use(root):
            user = graph.users[root][0]
            val = graph.value(user) if user is not None else None
            name = op_name(val)
            if name in _UNARY and val.args[0].same_as(root):
                nxt = relax.Call(val.op, [cur, *val.args[1:]], val.attrs)
            elif name in _BINARY and static_shape(user) == out_shape:
                i = 0 if val.args[0].same_as(root) else 1
                c = _channel_const(graph, val.args[1 - i], channels)
                if c is None:
                    break
                args = [cur, make_const(c, str(user.ty.dtype))]
                nxt = relax.Call(val.op, args if i == 0 else args[::-1], val.attrs)
            else:
                break
            internal.add(root)
            root, cur = user, nxt
            epilogue.append(name.replace("relax.", ""))
        return Rewrite(root, relax.op.reshape(cur, out_shape), internal, {"epilogue": epilogue})
