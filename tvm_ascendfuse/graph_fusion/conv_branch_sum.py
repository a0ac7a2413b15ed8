"""ConvBranchSumFusionPass: a sum of conv branches over one input becomes one conv (structural
reparameterisation of RepVGG / MobileOne / ACNet / DBB blocks exported in their training form).

Rewrites (a tree of ``add`` s in any order and nesting; ``+ b_i`` and the affine branch optional)::

    y = sum_i (conv2d(x, W_i) + b_i)  [+ x * s + t]  [+ c]  [+ z ...]
      ->  y = conv2d(x, W) + b  [+ z ...]
    W = sum_i embed(W_i) + embed(diag(s)),   b = sum_i b_i + t + c

where ``embed`` zero-pads a ``kh x kw`` kernel to the largest ``KH x KW`` of the branches, centred, and the
identity / per-channel affine branch ``x * s + t`` (what an inference BatchNorm of ``x`` becomes, or ``x``
itself) is a ``KH x KW`` kernel with ``s[o]`` at its centre tap on input channel ``o`` of its group
(groups 1: ``W[o, o, c, c]``; depthwise: ``W[c, 0, c, c]``). ``z`` are other summands (not over ``x``), kept.

Why: MobileOne-S0 computes, per block, four depthwise 3x3 convs, a 1x1 depthwise conv and a BN of the input
and adds them; merged as siblings (concatenated outputs, then added back) that is several times the FLOPs of
the one conv they equal, and the 1x1 depthwise kernels run far below the machine's speed. Exact in real
arithmetic: every branch reads the same input window at the same output position (same stride, dilation,
groups, "same" centred padding), so the sum of the dot products is the dot product with the summed kernel.
The constants are summed in float64 and rounded once to the weight dtype.

Runs after ConvBatchnormFusionPass and BatchnormScaleFusionPass (BNs on the branches are folded into the
weights, the BN of ``x`` is ``x * s + t``) and before ConvSiblingMergeFusionPass, which would otherwise
concatenate the branches first. Branches: ``conv2d(x, W_const)`` NCHW/OIHW with static shapes, odd kernels,
symmetric padding ``dilation * (k // 2)`` on each axis. Refused (recorded, graph unchanged): non-constant
weights, branches over ``x`` with different strides / groups / dilation / layouts / dtypes, uncentred or
asymmetric padding, a branch (or partial sum of branches) also used outside the sum (it still has to be
computed), an affine branch when the channels differ, the stride is not 1, or the scale is not constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from ..switches import CONV_BRANCH_SUM as NAME
from ._graph import FunctionGraph, GraphRewritePass, Refusal, Rewrite, int_list, make_const, op_name, static_shape


@dataclass
class _Sum:
    """The leaves of one add tree, sorted by kind."""

    convs: list = field(default_factory=list)      # (var, conv call)
    affine: list = field(default_factory=list)     # (data, scale (1, C, 1, 1) float64 or None for 1, its multiply)
    consts: list = field(default_factory=list)     # constant summands (float64)
    others: list = field(default_factory=list)     # tensors kept as summands
    shared: list = field(default_factory=list)     # multi-use conv / add leaves and the inputs of their convs
    internal: set = field(default_factory=set)


def _window(call) -> tuple:
    a = call.attrs
    return (tuple(int_list(a.strides)), tuple(int_list(a.dilation)), int(a.groups), str(a.data_layout),
            str(a.kernel_layout), str(a.out_layout or a.data_layout), str(a.out_dtype))


class ConvBranchSumFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph: FunctionGraph):
        if op_name(graph.value(var)) != "relax.add":
            return None
        out_shape = static_shape(var)
        if out_shape is None or len(out_shape) != 4:
            return None
        tree = _Sum()
        _flatten(graph, var, tree, out_shape, root=True)
        datas = []     # conv inputs, in order of appearance
        for _, conv in tree.convs:
            if not any(conv.args[0].same_as(d) for d in datas):
                datas.append(conv.args[0])
        groups = []
        for data in datas:
            convs = [(v, c) for v, c in tree.convs if c.args[0].same_as(data)]
            affine = [t for t in tree.affine if t[0].same_as(data)]
            if len(convs) + len(affine) >= 2:
                groups.append((data, convs, affine))
        if not groups:
            return None
        names = "+".join(v.name for _, convs, _ in groups for v, _ in convs)
        internal = set(tree.internal) | {v for _, convs, _ in groups for v, _ in convs} \
            | {t[2] for _, _, affine in groups for t in affine if t[2] is not None}
        shared = [v for v, ins in tree.shared if any(d.same_as(g[0]) for g in groups for d in ins)]
        if shared:
            raise Refusal(internal=internal, branches=names,
                          failed="a branch over the same input is also used outside the sum (" +
                                 ", ".join(v.name for v in shared) + "): it would still have to be computed")
        dtype = str(var.ty.dtype)
        bias = np.zeros((1, out_shape[1], 1, 1))
        for c in tree.consts:
            bias = bias + c
        value, used, detail = None, set(), {"branches": [], "kernel": []}
        for data, convs, affine in groups:
            conv = _merge(graph, data, convs, affine, internal, names)
            value = conv if value is None else relax.op.add(value, conv)
            used |= {id(t) for t in affine}
            detail["branches"].append(len(convs) + len(affine))
            detail["kernel"].append([int(d) for d in conv.args[1].value.shape[2:]])
        value = relax.op.add(value, make_const(bias, dtype))
        # summands no group takes stay as they were
        grouped = {v for _, convs, _ in groups for v, _ in convs}
        for v, _ in tree.convs:
            if v not in grouped:
                value = relax.op.add(value, v)
        for t in tree.affine:
            if id(t) not in used:
                value = relax.op.add(value, t[2] if t[2] is not None else t[0])
        for other in tree.others:
            value = relax.op.add(value, other)
        return Rewrite(var, value, internal, detail)


def _flatten(graph: FunctionGraph, expr, tree: _Sum, out_shape: tuple, root: bool = False) -> None:
    """Sort the summands of ``expr`` into ``tree``; single-use adds are opened (they become internal)."""
    arr = graph.const(expr)
    if arr is not None:
        chan = _channel_const(arr, out_shape)
        tree.consts.append(chan) if chan is not None else tree.others.append(expr)
        return
    if static_shape(expr) != out_shape:
        tree.others.append(expr)              # a broadcast summand: kept as it is
        return
    val = graph.value(expr)
    name = op_name(val)
    single = root or graph.single_use(expr)
    if name == "relax.add" and single:
        if not root:
            tree.internal.add(expr)
        for arg in val.args:
            _flatten(graph, arg, tree, out_shape)
        return
    if name == "relax.nn.conv2d" and single:
        tree.convs.append((expr, val))
        return
    if name == "relax.multiply" and single:
        for a, b in ((0, 1), (1, 0)):
            s = graph.const(val.args[b])
            chan = None if s is None else _channel_const(s, out_shape)
            if chan is not None and static_shape(val.args[a]) == out_shape:
                tree.affine.append((val.args[a], chan, expr))   # internal only if a group takes it
                return
    if not single and name in ("relax.add", "relax.nn.conv2d"):
        tree.shared.append((expr, _conv_inputs(graph, expr)))
    # a tensor: a plain summand, or the identity branch of a group whose convs read it
    tree.affine.append((expr, None, None))


def _conv_inputs(graph, expr, depth: int = 8) -> list:
    """Inputs of the convs whose outputs are summed (through adds) into ``expr``."""
    val = graph.value(expr)
    name = op_name(val)
    if name == "relax.nn.conv2d":
        return [val.args[0]]
    if name == "relax.add" and depth > 0:
        return [d for a in val.args for d in _conv_inputs(graph, a, depth - 1)]
    return []


def _channel_const(arr: np.ndarray, out_shape: tuple) -> np.ndarray | None:
    """``arr`` as a (1, C, 1, 1) float64 array if it broadcasts onto NCHW ``out_shape`` along channels only."""
    if arr.ndim > 4:
        return None
    padded = (1,) * (4 - arr.ndim) + tuple(arr.shape)
    if padded[0] != 1 or padded[2] != 1 or padded[3] != 1 or padded[1] not in (1, out_shape[1]):
        return None
    return np.broadcast_to(arr.reshape(1, padded[1], 1, 1).astype("float64"), (1, out_shape[1], 1, 1))


def _merge(graph, data, convs, affine, internal, names) -> relax.Call:
    """One conv equal to the sum of the conv and identity/affine branches over ``data`` (biases apart)."""
    def refuse(failed: str, **more) -> Refusal:
        return Refusal(internal=internal, branches=names, failed=failed, **more)

    windows = {_window(c) for _, c in convs}
    if len(windows) > 1:
        raise refuse("branches differ in stride, dilation, groups, layout or dtype",
                     windows=[str(w[:3]) for w in sorted(windows)])
    strides, dilation, groups, dl, kl, ol, out_dtype = next(iter(windows))
    if (dl, kl, ol) != ("NCHW", "OIHW", "NCHW"):
        raise refuse(f"layouts {(dl, kl, ol)} are not NCHW/OIHW/NCHW")
    in_shape = static_shape(data)
    if in_shape is None:
        raise refuse("input shape not static")
    weights = []
    for v, c in convs:
        w = graph.const(c.args[1])
        if w is None:
            raise refuse(f"weights of '{v.name}' are not constant")
        kh, kw = int(w.shape[2]), int(w.shape[3])
        pad = int_list(c.attrs.padding)
        want = [dilation[0] * (kh // 2), dilation[1] * (kw // 2)] * 2
        if kh % 2 == 0 or kw % 2 == 0 or pad != want:
            raise refuse(f"'{v.name}' padding {pad} is not the centred {want} of its {kh}x{kw} kernel")
        weights.append(w)
    shapes = {tuple(w.shape[:2]) for w in weights}
    if len(shapes) > 1 or len({str(w.dtype) for w in weights}) > 1:
        raise refuse(f"weights differ in channels or dtype ({sorted(shapes)})")
    co, cig = next(iter(shapes))
    KH, KW = max(int(w.shape[2]) for w in weights), max(int(w.shape[3]) for w in weights)
    total = np.zeros((co, cig, KH, KW))
    for w in weights:
        dh, dw = (KH - w.shape[2]) // 2, (KW - w.shape[3]) // 2
        total[:, :, dh:dh + w.shape[2], dw:dw + w.shape[3]] += w.astype("float64")
    if affine:
        if co != in_shape[1] or tuple(strides) != (1, 1) or cig != co // groups:
            raise refuse(f"identity/affine branch of the input cannot be a conv kernel ({in_shape[1]} in, {co} out "
                         f"channels, stride {list(strides)}, groups {groups})")
        scale = sum(np.ones((1, co, 1, 1)) if s is None else np.broadcast_to(s, (1, co, 1, 1))
                    for _, s, _ in affine).reshape(-1)
        o = np.arange(co)
        total[o, o % cig, KH // 2, KW // 2] += scale
    attrs = convs[0][1].attrs
    pad = [dilation[0] * (KH // 2), dilation[1] * (KW // 2)] * 2
    return relax.op.nn.conv2d(data, make_const(total, str(weights[0].dtype)), strides=list(strides), padding=pad,
                              dilation=list(dilation), groups=groups, data_layout=dl, kernel_layout=kl,
                              out_layout=ol, out_dtype=attrs.out_dtype)
