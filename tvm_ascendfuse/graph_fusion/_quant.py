"""Shared reading of quantized tensors for the int8 passes (``conv_quant``, ``matmul_quant``).

An ONNX QDQ model reaches Relax as ``dequantize(x_q, s, z)`` in front of every conv/matmul input; a weight
is ``dequantize(W_q, s_w, z_w, axis)`` of an integer constant (the pipeline keeps it unfolded until these
passes ran). The int8 form of ``op(dequantize(x_q), dequantize(W_q))`` used here is

    s_x * s_w[o] * (op(x_u, W_q) - z_u * sum_k W_q[k, o])

with ``x_u`` the activation as uint8 and ``z_u`` its zero point: the x86 int8 dot product multiplies
unsigned by signed bytes, so an int8 activation is moved to uint8 by adding 128 to it and to its zero
point (exact: ``q + 128`` lies in 0..255). The column sums are compile-time constants; a zero weight zero
point is required (every symmetric weight quantizer writes one), a nonzero one is refused with its value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

from ._graph import FunctionGraph, GraphRewritePass, Refusal, op_name, static_shape

INT_TYPES = ("int8", "uint8")


@dataclass
class QuantActivation:
    """``dequantize(q, scale, zero_point)`` with one scale and one zero point (per tensor)."""

    dq: relax.Var          # the dequantize binding
    q: relax.Expr          # its integer input
    dtype: str
    scale: float
    zero_point: int


@dataclass
class QuantWeight:
    """An integer constant weight, its per-output-channel scales (1-D, one per output channel)."""

    q: np.ndarray          # int8, in the layout the op reads (conv: OIHW, matmul: K x N)
    scale: np.ndarray      # float32, shape (out_channels,)
    per_channel: bool


def activation(graph: FunctionGraph, expr) -> QuantActivation | None:
    """``expr`` as a per-tensor dequantize of an int8/uint8 tensor (None when it is not one)."""
    val = graph.call(expr, "relax.dequantize")
    if val is None:
        return None
    q = val.args[0]
    dtype = str(q.ty.dtype) if hasattr(q.ty, "dtype") else None
    if dtype not in INT_TYPES or graph.const(q) is not None:
        return None
    scale, zp = graph.const(val.args[1]), graph.const(val.args[2])
    if scale is None or zp is None:
        raise Refusal(failed="activation scale or zero point is not a constant")
    if scale.size != 1 or zp.size != 1:
        raise Refusal(failed="per-channel activation scales are not supported (int8 kernels take one scale)",
                      scales=int(scale.size))
    return QuantActivation(expr, q, dtype, float(scale.reshape(())), int(zp.reshape(())))


def weight(graph: FunctionGraph, expr, out_axis: int) -> QuantWeight | None:
    """``expr`` as ``dequantize(W_q)`` of an int8 constant, possibly under ``permute_dims`` (ONNX Gemm's
    transposed weight), with scales along ``out_axis`` of the weight as the op reads it. None when
    ``expr`` is not a dequantized constant; ``Refusal`` for a form the int8 kernels cannot take."""
    perm = None
    val = graph.value(expr)
    if op_name(val) == "relax.permute_dims":
        shape = static_shape(val.args[0])
        if shape is None:
            return None
        perm = [int(a) for a in val.attrs.axes] if val.attrs.axes is not None else list(range(len(shape)))[::-1]
        val = graph.value(val.args[0])
    if op_name(val) != "relax.dequantize":
        return None
    q = graph.const(val.args[0])
    scale, zp = graph.const(val.args[1]), graph.const(val.args[2])
    if q is None or scale is None or zp is None:
        return None
    if str(q.dtype) != "int8":
        raise Refusal(failed="weights are not int8 (the int8 dot product takes signed bytes)", dtype=str(q.dtype))
    if np.any(zp != 0):
        raise Refusal(failed="weight zero point is not 0", zero_point=int(np.abs(zp).max()))
    src_axis = int(val.attrs.axis) % q.ndim
    if perm is not None:
        q = np.transpose(q, perm)
        src_axis = perm.index(src_axis)
    n_out = q.shape[out_axis]
    if scale.size == 1:
        scales = np.full((n_out,), float(scale.reshape(())), "float32")
    elif src_axis == out_axis and scale.size == n_out:
        scales = scale.astype("float32").reshape(-1)
    else:
        raise Refusal(failed="weight scales are not per output channel", axis=src_axis, scales=int(scale.size))
    return QuantWeight(np.ascontiguousarray(q), scales, scale.size > 1)


def as_uint8(graph: FunctionGraph, act: QuantActivation) -> tuple[relax.Expr, int]:
    """The activation as uint8 and its zero point. An int8 tensor produced by a ``quantize`` with the
    dequantize's scale and zero point is quantized to uint8 with the zero point + 128 instead (the same
    values + 128, one kernel fewer); any other int8 tensor gets 128 added."""
    if act.dtype == "uint8":
        return act.q, act.zero_point
    zp = act.zero_point + 128
    val = graph.call(act.q, "relax.quantize")
    # only when the quantize writes exactly what the dequantize reads (same scale and zero point)
    if val is not None and graph.scalar(val.args[1]) == act.scale and graph.scalar(val.args[2]) == act.zero_point:
        return relax.op.quantize(val.args[0], val.args[1], relax.const(zp, "uint8"), int(val.attrs.axis),
                                 "uint8"), zp
    wide = relax.op.add(relax.op.astype(act.q, "int32"), relax.const(128, "int32"))
    return relax.op.astype(wide, "uint8"), zp


# Output channels of an int8 conv/GEMM come in whole accumulator vectors (16 int32 lanes of 512 bits): a weight
# with another count gets zero rows up to the next multiple and the result is sliced back, so the int8 rule
# (which takes whole vectors only) keeps the conv; the padded channels are computed and never stored.
OUT_CHANNEL_MULTIPLE = 16


def padded_out_channels(w_q: np.ndarray) -> tuple[np.ndarray, int]:
    """(``w_q`` with zero output channels up to a multiple of OUT_CHANNEL_MULTIPLE, its own count)."""
    n = w_q.shape[0]
    extra = -n % OUT_CHANNEL_MULTIPLE
    if not extra:
        return w_q, n
    return np.concatenate([w_q, np.zeros((extra, *w_q.shape[1:]), w_q.dtype)]), n


# Input channels of an int8 conv are summed 4 bytes at a time (one dot-product step): an image's 3 channels
# get a fourth, zero in the weight (its data value never counts).
IN_CHANNEL_MULTIPLE = 4


def conv_padding(x_u: relax.Expr, zp: int, padding, extra_channels: int = 0) -> tuple[relax.Expr, list[int]]:
    """The conv's input and the padding the conv itself applies. The border must hold the quantized zero:
    with a zero point of 0 (an activation after ReLU, quantized on [0, max]) that is the conv's own zero
    padding, which stays inside the conv's kernel; any other zero point gets an explicit ``pad`` by it,
    which the grouping may place in the producer's kernel (the int8 rules then run that epilogue apart).
    ``extra_channels``: channels appended to the input (``padded_in_channels``), in the same ``pad``."""
    top, left, bottom, right = padding
    if not extra_channels and (zp == 0 or not (top or left or bottom or right)):
        return x_u, [top, left, bottom, right]
    return relax.op.nn.pad(x_u, [0, 0, 0, extra_channels, top, bottom, left, right], pad_value=float(zp)), \
        [0, 0, 0, 0]


def padded_in_channels(w_q: np.ndarray) -> np.ndarray:
    """An OIHW ``w_q`` with zero input channels up to a multiple of IN_CHANNEL_MULTIPLE."""
    extra = -w_q.shape[1] % IN_CHANNEL_MULTIPLE
    if not extra:
        return w_q
    return np.concatenate([w_q, np.zeros((w_q.shape[0], extra, *w_q.shape[2:]), w_q.dtype)], axis=1)


def requantized(acc: relax.Expr, col_sums: np.ndarray, zp: int, scale: np.ndarray, shape: tuple) -> relax.Expr:
    """``(acc - zp * col_sums) * scale`` as float32, with the per-channel constants in ``shape``."""
    corr = (zp * col_sums.astype("int64")).astype("int32").reshape(shape)
    centered = relax.op.subtract(acc, relax.const(corr, "int32")) if zp else acc
    return relax.op.multiply(relax.op.astype(centered, "float32"),
                             relax.const(scale.astype("float32").reshape(shape), "float32"))


class QuantRewritePass(GraphRewritePass):
    """An int8 rewrite: several convs/matmuls reading one activation each re-quantize it to uint8; common
    subexpression elimination leaves one such quantize."""

    def transform_module(self, mod):
        out = super().transform_module(mod)
        return out if out.same_as(mod) else relax.transform.EliminateCommonSubexpr()(out)
