"""DynamicQuantMatMulFusionPass: ONNX MatMulInteger (ORT ``quantize_dynamic``'s form) as a uint8 x int8 GEMM.

TVM's importer writes ``MatMulInteger(x_q, W_q, z_x, z_w)`` as an int32 matmul of widened operands::

    matmul(astype(x_q, int32) - astype(z_x, int32), astype(W_q, int32) - astype(z_w, int32), int32)

with ``x_q`` uint8 (``DynamicQuantizeLinear``: its zero point ``z_x`` is computed at run time) and ``W_q`` a
constant (``W_q - z_w`` is evaluated at compile time and must fit int8, which it does for int8 weights with
zero point 0). Rewritten as the int8 GEMM the int8 rule runs on the dot-product instructions::

    matmul(x_q, W_q, int32) - astype(z_x, int32) * sum_k W_q[k, :]

(the column sums a compile-time constant, the zero point a run-time scalar). Exact in integer arithmetic.
The scale multiply and bias after it stay and fuse into the kernel's epilogue.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import DYNAMIC_QUANT_MATMUL as NAME
from . import _quant
from ._graph import Refusal, Rewrite, static_shape


def _weight(graph, expr):
    """The int64 value of the weight operand: a constant, or ``W - z`` of constants (the importer's widening,
    folded or not)."""
    value = graph.const(expr)
    if value is not None:
        return value.astype("int64")
    sub = graph.call(expr, "relax.subtract")
    if sub is None:
        return None
    w, z = graph.const(sub.args[0]), graph.const(sub.args[1])
    return None if w is None or z is None else w.astype("int64") - z.astype("int64")


def _widened(graph, expr):
    """``astype(q, int32) - astype(z, int32)`` -> (q, z), else None."""
    sub = graph.call(expr, "relax.subtract")
    if sub is None:
        return None
    q, z = (graph.call(a, "relax.astype") for a in sub.args)
    if q is None or z is None:
        return None
    return q.args[0], z.args[0]


class DynamicQuantMatMulFusionPass(_quant.QuantRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        mm = graph.call(var, "relax.matmul")
        if mm is None or str(var.ty.dtype) != "int32":
            return None
        lhs = _widened(graph, mm.args[0])
        if lhs is None:
            return None
        x_q, z_x = lhs
        if str(x_q.ty.dtype) != "uint8" or static_shape(z_x) not in ((), (1,)):
            return None
        w = _weight(graph, mm.args[1])
        if w is None:
            raise Refusal(failed="weight is not a constant")
        if w.ndim != 2:
            raise Refusal(failed="weight is not 2-D", ndim=int(w.ndim))
        if w.min() < -128 or w.max() > 127:
            raise Refusal(failed="weight minus its zero point does not fit int8",
                          low=int(w.min()), high=int(w.max()))
        w8 = w.astype("int8")
        acc = relax.op.matmul(x_q, relax.const(w8, "int8"), out_dtype="int32")
        col_sums = relax.const(w8.astype("int64").sum(axis=0).astype("int32"), "int32")
        zp = relax.op.astype(relax.op.reshape(z_x, ()) if static_shape(z_x) == (1,) else z_x, "int32")
        value = relax.op.subtract(acc, relax.op.multiply(zp, col_sums))
        internal = {v for v in (mm.args[0],) if graph.single_use(v)}
        return Rewrite(var, value, internal, {"weight": "x".join(str(d) for d in w.shape)})
