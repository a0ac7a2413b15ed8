"""ConvSiblingMergeFusionPass: convs of one input with the same window become one conv over more channels.

Rewrites (Inception's 1x1 branches over one input; each ``+ b_i`` and ``act`` optional, ``act`` the same op
for every sibling)::

    y_i = act(conv2d(x, W_i) + b_i)          for i = 1..k, same stride / padding / dilation / kernel size
        ->  y = act(conv2d(x, concat(W_1..W_k, axis=0)) + concat(b_1..b_k))
            y_i = strided_slice(y, axis 1, o_i : o_i + C_i)

Why: every sibling kernel reads ``x`` again, and each is a small conv (GoogLeNet's 16..64-channel reduce
convs) whose register blocks are short of output channels; merged, ``x`` is staged once and the conv has the
channels of all of them. The slices are layout ops: a consumer conv reads its part of ``y`` in place (its input
prologue), and a concat of a slice with other tensors reads it where it is. Exact: every output channel is
the same dot product over the same input window (a sibling without a bias gets zeros, ``z + 0 == z``), and a
per-element activation commutes with taking channels.

Siblings are grouped by their activation (relu / silu / sigmoid / gelu / clip with the same bounds, or none);
only a group of two or more merges. Weights and biases must be constants, layouts NCHW/OIHW, groups 1; the
conv's and bias's results must be used only by the next step of the sibling. Refused (recorded): siblings whose
results are combined elementwise later (they are better fused into one consumer as they are), kernels of
different sizes (SqueezeNet's expand 1x1 / 3x3 pair: padding the 1x1 to 3x3 would multiply its FLOPs by 9).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from ..report import CHECK_FAILED
from ..switches import CONV_SIBLING_MERGE as NAME
from ..fusion_pass import FusionPass
from ._graph import FunctionGraph, int_list, make_const, op_name, static_shape

# Activations that may follow each sibling (per element, so they commute with taking channels).
_ACTIVATIONS = ("relax.nn.relu", "relax.nn.silu", "relax.sigmoid", "relax.nn.gelu", "relax.nn.gelu_tanh",
                "relax.tanh", "relax.clip", "relax.nn.leakyrelu")
_COMBINE = ("relax.multiply", "relax.add", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum")


@dataclass
class Sibling:
    conv: relax.Var
    root: relax.Var                  # the binding that gets the slice (activation, bias add, or the conv)
    weight: np.ndarray               # (C_i, IC, KH, KW)
    bias: np.ndarray | None          # (C_i,)
    act: tuple | None                # (op name, its non-tensor arguments as text) or None
    act_call: relax.Call | None = None

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])


@dataclass
class Merge:
    data: relax.Expr
    call: relax.Call
    parts: list = field(default_factory=list)
    merged: relax.Var | None = None

    @property
    def offsets(self) -> list[int]:
        out, off = [], 0
        for s in self.parts:
            out.append(off)
            off += s.n
        return out


def _window(call) -> tuple:
    a = call.attrs
    return (tuple(int_list(a.strides)), tuple(int_list(a.padding)), tuple(int_list(a.dilation)), int(a.groups),
            str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout), str(a.out_dtype))


class ConvSiblingMergeFusionPass(FusionPass):
    """See the module docstring."""

    switch_name = NAME

    def transform_function(self, func, mod):
        graph = FunctionGraph.of(func)
        merges = self._plan(graph)
        if not merges:
            return func
        return _Emit(merges).visit_expr(func)

    def _plan(self, graph: FunctionGraph) -> list[Merge]:
        by_data: dict = {}
        for var in graph.order:
            sib = self._sibling(var, graph)
            if sib is not None:
                by_data.setdefault(graph.value(var).args[0], []).append(sib)
        merges = []
        for data, sibs in by_data.items():
            if len(sibs) < 2:
                continue
            combined = _combined(sibs, graph)
            if combined:
                self.refuse(CHECK_FAILED, "+".join(s.root.name for s in sibs),
                            failed="sibling results are combined elementwise later "
                                   f"({', '.join(sorted(s.root.name for s in combined))})")
                sibs = [s for s in sibs if s not in combined]
            groups: dict = {}
            for s in sibs:
                key = (_window(graph.value(s.conv)), tuple(s.weight.shape[1:]), str(s.weight.dtype), s.act,
                       str(s.root.ty.dtype))
                groups.setdefault(key, []).append(s)
            if len(groups) > 1 and len([g for g in groups.values() if len(g) > 1]) < len(groups):
                lone = [g[0] for g in groups.values() if len(g) == 1]
                self.refuse(CHECK_FAILED, "+".join(s.root.name for s in sibs),
                            failed=_why_apart(lone, sibs, graph), apart=[s.root.name for s in lone])
            for group in groups.values():
                if len(group) < 2:
                    continue
                detail = {"siblings": len(group), "channels": [s.n for s in group],
                          "kernel": list(group[0].weight.shape[2:]), "act": group[0].act[0].split(".")[-1]
                          if group[0].act else None}
                if self.take("+".join(s.root.name for s in group), **detail):
                    merges.append(Merge(data, graph.value(group[0].conv), group))
        return merges

    @staticmethod
    def _sibling(var, graph: FunctionGraph) -> Sibling | None:
        """``var = conv2d(x, W_const)`` (NCHW/OIHW, groups 1, static shapes), with its single constant
        per-channel bias add and single activation when it has them."""
        conv = graph.value(var)
        if op_name(conv) != "relax.nn.conv2d" or not isinstance(conv.args[0], relax.Var):
            return None
        win = _window(conv)
        if win[3] != 1 or win[4:7] != ("NCHW", "OIHW", "NCHW"):
            return None
        w = graph.const(conv.args[1])
        out = static_shape(var)
        if w is None or w.ndim != 4 or out is None or static_shape(conv.args[0]) is None:
            return None
        sib = Sibling(var, var, w, None, None)
        nxt = _single_user(var, graph)
        if nxt is not None and op_name(graph.value(nxt)) == "relax.add":
            add = graph.value(nxt)
            other = add.args[1] if add.args[0].same_as(var) else add.args[0]
            b = graph.const(other) if not other.same_as(var) else None
            # per output channel only: (1, C, 1, 1) or (C, 1, 1); a (C,) vector would broadcast along W
            if b is not None and tuple(b.shape) in ((1, sib.n, 1, 1), (sib.n, 1, 1)) and static_shape(nxt) == out:
                sib.root, sib.bias = nxt, b.reshape(-1)
                nxt = _single_user(nxt, graph)
        if nxt is not None and op_name(graph.value(nxt)) in _ACTIVATIONS:
            act = graph.value(nxt)
            if all(not isinstance(getattr(a, "ty", None), relax.TensorType) for a in act.args[1:]):
                sib.root = nxt
                sib.act = (op_name(act), str(act.attrs) if act.attrs is not None else "",
                           tuple(str(a) for a in act.args[1:]))
                sib.act_call = act
        return sib


def _single_user(var, graph):
    users = graph.users.get(var, [])
    return users[0] if len(users) == 1 and users[0] is not None else None


def _combined(sibs, graph) -> list:
    """Siblings whose results meet in one elementwise binding (directly)."""
    reach: dict = {}
    for s in sibs:
        for u in graph.users.get(s.root, []):
            if u is not None:
                reach.setdefault(u, []).append(s)
    out = []
    for user, group in reach.items():
        if len(group) > 1 and op_name(graph.value(user)) in _COMBINE:
            out += [s for s in group if s not in out]
    return out


def _why_apart(lone, sibs, graph) -> str:
    """Why the siblings in ``lone`` merge with none of the others."""
    ref = [s for s in sibs if s not in lone][0] if len(lone) < len(sibs) else sibs[0]
    for s in lone:
        if s is ref:
            continue
        if tuple(s.weight.shape[2:]) != tuple(ref.weight.shape[2:]):
            return (f"kernel sizes differ ({list(s.weight.shape[2:])} vs {list(ref.weight.shape[2:])}): a merged "
                    "conv would pad the smaller window with zeros")
        if _window(graph.value(s.conv)) != _window(graph.value(ref.conv)):
            return "stride, padding or dilation differ"
        if s.act != ref.act:
            return "different activations after the convs"
    return "no sibling with the same window, activation and dtype"


@relax.expr_functor.mutator
class _Emit(relax.PyExprMutator):
    """At the first sibling root: the merged conv (+ bias, + activation); every sibling root becomes its
    channel slice."""

    def __init__(self, merges: list[Merge]):
        super().__init__()
        self.part_of = {}
        for m in merges:
            for off, s in zip(m.offsets, m.parts):
                self.part_of[s.root] = (m, off, s)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        hit = self.part_of.get(binding.var)
        if hit is None:
            super().visit_var_binding_(binding)
            return
        m, off, s = hit
        if m.merged is None:
            m.merged = self._emit_merged(m)
        value = relax.op.strided_slice(m.merged, axes=[1], begin=[off], end=[off + s.n])
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _emit_merged(self, m: Merge) -> relax.Var:
        first = m.parts[0]
        w = np.concatenate([s.weight for s in m.parts], axis=0)
        data = self.visit_expr(m.data)
        merged = self.builder_.emit(relax.Call(m.call.op, [data, make_const(w, str(w.dtype))], m.call.attrs),
                                    name_hint="sibling_conv")
        if any(s.bias is not None for s in m.parts):
            dtype = str(first.root.ty.dtype)
            b = np.concatenate([s.bias if s.bias is not None else np.zeros(s.n) for s in m.parts])
            merged = self.builder_.emit(relax.op.add(merged, make_const(b.reshape(1, -1, 1, 1), dtype)),
                                        name_hint="sibling_bias")
        if first.act_call is not None:
            act = first.act_call
            merged = self.builder_.emit(relax.Call(act.op, [merged, *act.args[1:]], act.attrs),
                                        name_hint="sibling_act")
        return merged
