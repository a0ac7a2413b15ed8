"""FocusConvFusionPass: YOLOv5's Focus (space-to-depth by four strided slices + concat) followed by a
stride-1 conv becomes one stride-2 conv on the original input.

Matches ``conv2d(concat([x[..., a0::2, b0::2], ..., x[..., a3::2, b3::2]], axis=1), W)`` where the four
``(a_i, b_i)`` are the four parity phases in any order (read from the ``strided_slice`` attributes),
the conv is k_h x k_w, stride 1, dilation 1, groups 1, NCHW/OIHW, with constant ``W`` and padding
``(t, l, b, r)``. Rewrites it as ``conv2d(x, W2, strides=2, padding=(2t, 2l, 2b, 2r))`` with
``W2[o, c, 2r + a_i, 2s + b_i] = W[o, i*C + c, r, s]`` (a 2k_h x 2k_w kernel).

Exact: block ``i`` of the concat is ``z_i[c, u, v] = x[c, 2u + a_i, 2v + b_i]``, so the original conv reads
``x[c, 2(y + r - t) + a_i, 2(x' + s - l) + b_i]``, which is what the stride-2 conv with the interleaved
kernel reads at tap ``(2r + a_i, 2s + b_i)`` with padding ``2t, 2l``. A padded (out-of-range) position of
``z`` is exactly an out-of-range position of ``x`` (H and W are even), so zero padding agrees, and the
output sizes are equal. The same multiply-adds are done in a different order (fp rounding only).
Anything that is not exactly the four parity phases (other steps/begins, other axes, odd sizes, a
concat that is used elsewhere) is refused and left alone.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..switches import FOCUS_CONV as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, int_list, make_const, static_shape


_PHASES = {(0, 0), (0, 1), (1, 0), (1, 1)}


def _phase(sl, shape) -> tuple[int, int] | None:
    """(row, column) start of a stride-2 slice covering axes 2 and 3 of ``shape`` fully, else None."""
    axes, begin, end = int_list(sl.args[1]), int_list(sl.args[2]), int_list(sl.args[3])
    strides = int_list(sl.args[4]) if len(sl.args) > 4 and sl.args[4] is not None else None
    if None in (axes, begin, end) or strides is None or not len(axes) == len(begin) == len(end) == len(strides):
        return None
    spec = {}
    for ax, b, e, s in zip(axes, begin, end, strides):
        ax %= 4
        if ax in spec:
            return None
        spec[ax] = (b, e, s)
    for ax in (0, 1):                     # batch and channel axes, if named, must be taken whole
        if ax in spec:
            b, e, s = spec[ax]
            if b != 0 or s != 1 or e < shape[ax]:
                return None
    if 2 not in spec or 3 not in spec:
        return None
    phase = []
    for ax in (2, 3):
        b, e, s = spec[ax]
        if s != 2 or b not in (0, 1) or e < shape[ax]:
            return None
        phase.append(b)
    return tuple(phase)


class FocusConvFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        conv = graph.call(var, "relax.nn.conv2d")
        if conv is None:
            return None
        cat = graph.call(conv.args[0], "relax.concat")
        if cat is None:
            return None
        parts = cat.args[0]
        internal = {conv.args[0]}
        if isinstance(parts, relax.Var):
            internal.add(parts)
            parts = graph.value(parts)
        if not isinstance(parts, relax.Tuple) or len(parts.fields) != 4:
            return None
        slices = [graph.call(p, "relax.strided_slice") for p in parts.fields]
        if any(s is None for s in slices):
            return None
        x = slices[0].args[0]
        if any(not s.args[0].same_as(x) for s in slices):
            return None
        # A conv over a concat of four strided slices of one tensor: a Focus candidate from here on.
        xs = static_shape(x)
        if xs is None or len(xs) != 4:
            raise Refusal(failed="input is not a static 4-D tensor")
        if int(cat.attrs.axis) % 4 != 1:
            raise Refusal(failed=f"concat axis {int(cat.attrs.axis)} is not the channel axis")
        if xs[2] % 2 or xs[3] % 2:
            raise Refusal(failed=f"odd spatial size {xs[2]}x{xs[3]}")
        phases = [_phase(s, xs) for s in slices]
        if None in phases or set(phases) != _PHASES:
            raise Refusal(failed=f"slices are not the four stride-2 parity phases: {phases}")
        a = conv.attrs
        layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout))
        if layouts != ("NCHW", "OIHW", "NCHW"):
            raise Refusal(failed=f"layouts {layouts}")
        if int_list(a.strides) != [1, 1] or int_list(a.dilation) != [1, 1] or int(a.groups) != 1:
            raise Refusal(failed="conv is not stride 1, dilation 1, groups 1")
        weight = graph.const(conv.args[1])
        if weight is None:
            raise Refusal(failed="weights not constant")
        out_ch, in_ch, kh, kw = weight.shape
        channels = xs[1]
        if in_ch != 4 * channels:
            raise Refusal(failed=f"conv expects {in_ch} channels, Focus gives {4 * channels}")
        new_w = np.zeros((out_ch, channels, 2 * kh, 2 * kw), dtype=weight.dtype)
        for i, (pa, pb) in enumerate(phases):
            new_w[:, :, pa::2, pb::2] = weight[:, i * channels:(i + 1) * channels]
        pad = [2 * p for p in int_list(a.padding)]
        new = relax.op.nn.conv2d(x, make_const(new_w, str(weight.dtype)), strides=[2, 2], padding=pad,
                                 dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW",
                                 out_layout="NCHW", out_dtype=a.out_dtype)
        return Rewrite(var, new, internal, {"kernel": f"{kh}x{kw} -> {2 * kh}x{2 * kw}", "phases": str(phases)})
