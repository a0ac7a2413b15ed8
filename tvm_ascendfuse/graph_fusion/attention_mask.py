"""AttentionMaskFusionPass: a mask applied with ``where`` becomes the additive mask the attention kernels take.

Exports write a boolean attention mask as a select on the score, in either orientation::

    where(keep, s, fill)            (torch.where(mask, s, -inf); ONNX Where)
    where(masked, fill, s)          (s.masked_fill(~mask, -inf))

with ``fill`` a scalar constant, or ``full_like(s, c)`` / ``full(shape, c)`` of one. When every consumer of
the select is a softmax (the score of an attention), it is rewritten as ``s + where(keep, 0, fill)``
(``s + where(masked, fill, 0)``): the additive float mask of the attention pattern. With a constant
condition (a mask buffer, or a causal mask built in the graph from ``full``/``tril``/``arange`` and
evaluated by ``StaticShapeCanonicalizePass``) the new ``where`` is folded to a constant by the pipeline's
FoldConstant. Exact for finite scores: ``s + 0 = s``, and ``s + fill = fill`` for ``fill`` = -inf or a
finite fill at most -1e30 (the dtype's lowest value, as transformers uses: ``s + fill`` rounds to ``fill``
for any score below 1e22). Other fills (-1e4, -1e9) are refused: a row masked everywhere would get
``softmax(s)`` instead of the select's uniform row. The result has the broadcast shape of ``s``, the
condition and the fill, as the select has.

Second form, the NaN guard exports put after the softmax of a masked score (PyTorch's SDPA decomposition):
``where(isnan(p), 0, p)`` with ``p = softmax(s + mask)`` is ``p`` when the constant ``mask`` keeps a key in
every row: a softmax row is NaN only when all of it is -inf (for finite scores). Dropping it lets the
attention kernel go on to ``p.V``.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import ATTENTION_MASK as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, op_name

# A finite fill must absorb any score: s + fill rounds to fill for |s| < fill * 2**-24 (1e22 here).
_LOWEST = 1e30
_SOFTMAX = ("relax.nn.softmax", "relax.nn.log_softmax")


def _fill(graph, expr) -> float | None:
    """The value ``expr`` is filled with (a scalar constant, or full/full_like of one), else None."""
    value = graph.scalar(expr)
    if value is not None:
        return value
    call = graph.call(expr, "relax.full_like", "relax.full")
    if call is None:
        return None
    return graph.scalar(call.args[1])


class AttentionMaskFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    @staticmethod
    def _nan_guard(call, graph):
        """``where(isnan(p), 0, p)`` with ``p = softmax(s + mask)``: None if not this form, else a function of
        the root giving the Rewrite (the softmax) or raising the Refusal."""
        cond, zero, p = call.args
        isnan = graph.call(cond, "relax.isnan")
        soft = graph.call(p, "relax.nn.softmax")
        if isnan is None or soft is None or not isnan.args[0].same_as(p) or graph.scalar(zero) != 0.0:
            return None

        def rewrite(var):
            add = graph.call(soft.args[0], "relax.add")
            masks = [m for m in (graph.const(a) for a in add.args) if m is not None] if add is not None else []
            if len(masks) != 1:
                raise Refusal(internal={cond}, failed="the softmax's input has no constant additive mask, so a row "
                                                      "may be masked everywhere")
            mask = masks[0]
            axis = int(soft.attrs.axis) % len(var.ty.shape)
            axis -= len(var.ty.shape) - mask.ndim      # the mask broadcasts from the right
            if axis >= 0 and not np.isfinite(mask).any(axis=axis).all() or axis < 0 and not np.isfinite(mask).all():
                raise Refusal(internal={cond}, failed="the mask leaves a row with no key (a NaN the guard zeroes)")
            # the softmax itself in the guard's place (an alias binding would hide it from the patterns)
            return Rewrite(var, relax.op.nn.softmax(soft.args[0], soft.attrs.axis), {cond, p},
                           {"form": "where(isnan(softmax(s + mask)), 0, .)"})

        return rewrite

    def match(self, var, graph):
        call = graph.value(var)
        if op_name(call) != "relax.where":
            return None
        guard = self._nan_guard(call, graph)
        if guard is not None:
            return guard(var)
        users = graph.users.get(var, [])
        if not users or any(u is None or op_name(graph.value(u)) not in _SOFTMAX for u in users):
            return None
        cond, a, b = call.args
        dtype = str(var.ty.dtype)
        if "float" not in dtype:
            return None
        fill_b, fill_a = _fill(graph, b), _fill(graph, a)
        if fill_b is not None and fill_a is None:
            score, fill, keep_is_true = a, fill_b, True
        elif fill_a is not None and fill_b is None:
            score, fill, keep_is_true = b, fill_a, False
        else:
            return None
        if str(score.ty.dtype) != dtype:
            raise Refusal(failed=f"score dtype {score.ty.dtype} differs from the select's {dtype}")
        if not (np.isneginf(fill) or fill <= -_LOWEST):
            # s + fill == fill only when |s| is below fill's rounding step; a row masked everywhere then
            # still gets the select's uniform softmax instead of softmax(s)
            raise Refusal(failed=f"fill value {fill} is neither -inf nor below -{_LOWEST:g}")
        zero, low = relax.const(0.0, dtype), relax.const(fill, dtype)
        bias = relax.op.where(cond, zero, low) if keep_is_true else relax.op.where(cond, low, zero)
        form = "where(keep, s, fill)" if keep_is_true else "where(masked, fill, s)"
        return Rewrite(var, relax.op.add(score, bias), set(), {"form": form})
