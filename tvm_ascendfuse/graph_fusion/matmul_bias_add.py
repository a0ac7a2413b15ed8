"""MatMulBiasAddFusionPass: canonical ``matmul(x, W_const) + b_const`` so matmul+bias patterns match.

Rewrites (ONNX ``Gemm(transB=1)`` imports as ``matmul(x, permute_dims(W)) + b``)::

    matmul(x, permute_dims(W_const))  ->  matmul(x, W_const.T)      [kind "fold_weight"]
        (any reshape/permute_dims/astype chain over a constant operand, either side, becomes a constant)
    add(b, mm) / add(mm, b) with b a reshaped or broadcast constant, subtract(mm, b),
    add(add(mm, b1), b2) (inner adds single-use)
                                      ->  add(mm, B), B 1-D of length N  [kind "merge_bias"]

where ``b, b1, b2`` vary only along the last (output-feature) axis. Each rewrite is one match, with its
``kind`` in the report. Exact: the folded constants are the same values (layout changes are exact, summed
biases are summed in float64 and rounded once). An add that is already canonical is not a match.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import MATMUL_BIAS_ADD as NAME
from ._bias import bias_chain
from ._graph import GenericConst, GraphRewritePass, Rewrite, is_plain_const, make_const, op_name, static_shape


def _fits(arr: np.ndarray, out_shape: tuple) -> bool:
    if not out_shape:
        return False
    padded = (1,) * (len(out_shape) - arr.ndim) + tuple(arr.shape)
    return all(d == 1 for d in padded[:-1]) and padded[-1] in (1, out_shape[-1])


class MatMulBiasAddFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        val = graph.value(var)
        if op_name(val) == "relax.matmul":
            return self._fold_weight(var, val, graph)
        chain = bias_chain(graph, var, ("relax.matmul",), _fits)
        if chain is None:
            return None
        out_shape = static_shape(var)
        canonical = (out_shape[-1],)
        if chain.steps == 1 and chain.producer_first and is_plain_const(chain.first_const, canonical):
            return None
        if chain.total.ndim > len(out_shape) or len(out_shape) < 1:
            return None
        bias = np.broadcast_to(chain.total.reshape(-1), canonical)
        value = relax.op.add(chain.producer, make_const(bias, str(var.ty.dtype)))
        return Rewrite(var, value, chain.internal, {"kind": "merge_bias", "adds": chain.steps})

    @staticmethod
    def _fold_weight(var, mm, graph):
        args, folded = list(mm.args), False
        for i, arg in enumerate(args):
            if isinstance(arg, GenericConst):
                continue
            arr = graph.const(arg)
            if arr is not None:
                args[i], folded = make_const(arr, str(arr.dtype)), True
        if not folded:
            return None
        return Rewrite(var, relax.Call(mm.op, args, mm.attrs), set(), {"kind": "fold_weight"})
