"""BatchnormScaleFusionPass: an inference BatchNorm that no conv/matmul absorbed becomes a per-channel
multiply-add with constants.

Rewrites (constant parameters, ``training=False``)::

    y = batch_norm(x, gamma, beta, mean, var, axis=a, eps)[0]
      ->  y = x * s + t     s = gamma / sqrt(var + eps),  t = beta - mean * s
    with s, t constants shaped to broadcast along ``a`` only ((1, C, 1, 1) for NCHW)

Why: BatchNorm in front of an activation (DenseNet's pre-activation ``BN -> ReLU -> conv`` on a concat of
earlier outputs) cannot be folded into any weights, and TVM legalizes ``batch_norm`` into one kernel with a
tuple result (the output and the running statistics) that no fusion can join, so the BN and the ReLU after it
each became a kernel of their own. As a multiply-add it is a per-channel affine map the grouping can fuse,
with the ReLU, into the next conv's input prologue (applied per input tile as it is staged). Exact up to
rounding: ``(x - mean) * s + beta`` and ``x * s + (beta - mean * s)`` differ by one rounding of the folded
constant (computed in float64, rounded once to the tensor's dtype).

Runs after ConvBatchnormFusionPass, so BNs behind a conv or matmul are folded into its weights first. Refused
(recorded): parameters that are not constants, a BN axis whose length is unknown.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import BATCHNORM_SCALE as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, make_const, static_dims


class BatchnormScaleFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        item = graph.value(var)
        if not isinstance(item, relax.TupleGetItem) or int(item.index) != 0:
            return None
        bn = graph.call(item.tuple_value, "relax.nn.batch_norm")
        if bn is None or bool(bn.attrs.training):
            return None
        internal = {item.tuple_value}
        shape = static_dims(bn.args[0])
        if shape is None:
            raise Refusal(internal=internal, failed="input rank unknown")
        axis = int(bn.attrs.axis) % len(shape)
        channels = shape[axis]
        params = [graph.const(p) for p in bn.args[1:5]]
        if any(p is None for p in params):
            raise Refusal(internal=internal, failed="batch_norm parameters not constant", axis=axis)
        if channels is None or any(np.asarray(p).size != channels for p in params):
            raise Refusal(internal=internal, failed=f"parameters do not match {channels} channels", axis=axis)
        gamma, beta, mean, var_ = (np.asarray(p, dtype="float64").reshape(-1) for p in params)
        if not bool(bn.attrs.scale):
            gamma = np.ones(channels)
        if not bool(bn.attrs.center):
            beta = np.zeros(channels)
        scale = gamma / np.sqrt(var_ + float(bn.attrs.epsilon))
        shift = beta - mean * scale
        bshape = [channels if i == axis else 1 for i in range(len(shape))]
        dtype = str(var.ty.dtype)
        x = bn.args[0]
        value = relax.op.add(relax.op.multiply(x, make_const(scale.reshape(bshape), dtype)),
                             make_const(shift.reshape(bshape), dtype))
        return Rewrite(var, value, internal, {"channels": channels, "axis": axis})
