"""MatMulQuantFusionPass: a matmul of a dequantized int8 activation and a dequantized int8 constant weight
computed in int8 with int32 accumulation.

Rewrites, for ``x_q`` per-tensor int8 or uint8 and ``W_q`` an int8 constant of shape (K, N) (directly or
transposed: ONNX Gemm's ``transB``) with per-tensor or per-column scales and a zero zero point::

    matmul(dequantize(x_q, s_x, z_x), dequantize(W_q, s_w, 0))
      ->  astype(matmul(x_u, W_q, int32) - z_u * sum_k W_q[k, :], float32) * (s_x * s_w)

with ``x_u``/``z_u`` the activation as uint8 (``_quant``). The bias add, activation and the next quantize
stay as they are and fuse into the kernel's epilogue. Exact in integer arithmetic.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import MATMUL_QUANT as NAME
from . import _quant
from ._graph import Refusal, Rewrite


class MatMulQuantFusionPass(_quant.QuantRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        mm = graph.call(var, "relax.matmul")
        if mm is None:
            return None
        act = _quant.activation(graph, mm.args[0])
        if act is None:
            return None
        if str(var.ty.dtype) != "float32":
            raise Refusal(failed="matmul output is not float32", dtype=str(var.ty.dtype))
        w = _quant.weight(graph, mm.args[1], out_axis=1)
        if w is None:
            raise Refusal(failed="weight is not a dequantized int8 constant")
        if w.q.ndim != 2:
            raise Refusal(failed="weight is not 2-D", ndim=int(w.q.ndim))
        x_u, zp = _quant.as_uint8(graph, act)
        acc = relax.op.matmul(x_u, relax.const(w.q, "int8"), out_dtype="int32")
        scale = (np.float64(act.scale) * w.scale.astype("float64")).astype("float32")
        value = _quant.requantized(acc, w.q.astype("int64").sum(axis=0), zp, scale, (-1,))
        return Rewrite(var, value, {act.dq} if graph.single_use(act.dq) else set(),
                       {"activation": act.dtype, "scales": "per-channel" if w.per_channel else "per-tensor"})
