"""ConvBiasAddFusionPass: put every constant per-channel bias of a conv2d into one canonical add.

Rewrites, for ``conv = conv2d(...)`` (NCHW output) and constants ``b, b1, b2`` that vary only along the
channel axis (scalars included)::

    add(b, conv)                      ->  add(conv, B)
    add(conv, reshape(b_1d, 1,C,1,1))  ->  add(conv, B)          (the reshape folded into the constant)
    add(add(conv, b1), b2)            ->  add(conv, B), B = b1 + b2   (any length, inner adds single-use)
    subtract(conv, b)                 ->  add(conv, B), B = -b

with ``B`` a constant of shape ``(1, C, 1, 1)``: the form the conv+bias patterns and BN folding expect.
Exact up to one float rounding of the summed constant (it is summed in float64 and rounded once).
An add that is already canonical is not a match.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import CONV_BIAS_ADD as NAME
from ._bias import bias_chain
from ._graph import GraphRewritePass, Rewrite, is_plain_const, make_const, static_shape


def _fits(arr: np.ndarray, out_shape: tuple) -> bool:
    if len(out_shape) != 4:
        return False
    padded = (1,) * (4 - arr.ndim) + tuple(arr.shape)
    return padded[0] == padded[2] == padded[3] == 1 and padded[1] in (1, out_shape[1])


class ConvBiasAddFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        chain = bias_chain(graph, var, ("relax.nn.conv2d",), _fits)
        if chain is None:
            return None
        conv = graph.value(chain.producer)
        if str(conv.attrs.out_layout) != "NCHW":
            return None
        out_shape = static_shape(var)
        canonical = (1, out_shape[1], 1, 1)
        if chain.steps == 1 and chain.producer_first and is_plain_const(chain.first_const, canonical):
            return None
        bias = np.broadcast_to(chain.total, canonical)
        value = relax.op.add(chain.producer, make_const(bias, str(var.ty.dtype)))
        return Rewrite(var, value, chain.internal, {"adds": chain.steps})
