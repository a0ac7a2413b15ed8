"""The dataflow graph before and after fusion, recorded into the report so that the HTML page
(``report_html.py``) can be drawn from ``fusion_result.json`` alone.

``graph_before``: the module as it enters the pipeline (the import): one node per operator call, the model's
inputs, edges along the dataflow; constants are not nodes (a node counts its constant operands).
``graph_after``: the module just before FuseTIR: one node per (legalized) op, and for every kernel the list
of its nodes, so each kernel can be drawn as a box around its ops. Compact form: a node is
``[label, shape]``, an edge ``[from, to]`` (node indices). A model with more than ``MAX_NODES`` nodes
records the counts only.
"""

from __future__ import annotations

import tvm
from tvm import relax

MAX_NODES = 4000
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _shape(ty) -> str:
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        return "x".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape)
    if isinstance(ty, relax.TupleType):
        return "(" + ", ".join(_shape(f) for f in ty.fields) + ")"
    return ""


def _arg_exprs(call: relax.Call) -> list:
    if isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CALL_TIR):
        args = call.args[1]
        return list(args.fields) if isinstance(args, relax.Tuple) else [args]
    out = []
    for a in call.args:
        out += list(a.fields) if isinstance(a, relax.Tuple) else [a]
    return out


def _label(call: relax.Call) -> str | None:
    if isinstance(call.op, tvm.ir.Op):
        if call.op.same_as(_CALL_TIR):
            return call.args[0].name_hint
        return call.op.name.replace("relax.", "")
    if isinstance(call.op, tvm.ir.GlobalVar):
        return call.op.name_hint
    return None


class _Graph:
    def __init__(self):
        self.nodes: list[list] = []
        self.edges: list[list[int]] = []
        self._seen: set = set()

    def node(self, label: str, shape: str) -> int:
        self.nodes.append([label, shape])
        return len(self.nodes) - 1

    def connect(self, sources, dst: int) -> None:
        for s in _flat(sources):
            if isinstance(s, int) and s >= 0 and (s, dst) not in self._seen:
                self._seen.add((s, dst))
                self.edges.append([s, dst])

    def to_dict(self, **extra) -> dict:
        return {"nodes": self.nodes, "edges": self.edges, **extra}


def _flat(x):
    if isinstance(x, (list, tuple)):
        for i in x:
            yield from _flat(i)
    elif x is not None:
        yield x


def _bindings(func: relax.Function):
    for block in func.body.blocks:
        yield from block.bindings


def _walk(graph: _Graph, func: relax.Function, env: dict, on_call) -> None:
    """Add a node per call of ``func`` (``on_call`` may take a call over: it returns what the var holds)."""
    for b in _bindings(func):
        val, var = b.value, b.var
        if isinstance(val, relax.Call):
            taken = on_call(val, var, env) if on_call else None
            if taken is not None:
                env[var] = taken
                continue
            label = _label(val)
            if label is None:
                continue
            consts = sum(isinstance(a, tvm.ir.GenericConst) for a in _arg_exprs(val))
            nid = graph.node(label + (f" +{consts}c" if consts else ""), _shape(var.ty))
            graph.connect([env.get(a) for a in _arg_exprs(val) if isinstance(a, relax.Var)], nid)
            env[var] = nid
        elif isinstance(val, relax.TupleGetItem):
            src = env.get(val.tuple_value)
            env[var] = src[val.index] if isinstance(src, list) and val.index < len(src) else src
        elif isinstance(val, relax.Tuple):
            env[var] = [env.get(f) for f in val.fields]
        elif isinstance(val, relax.Var):
            env[var] = env.get(val)


def graph_before(mod: tvm.IRModule, func: str = "main") -> dict:
    if func not in [gv.name_hint for gv in mod.get_global_vars()]:
        return {"nodes": [], "edges": []}
    f = mod[func]
    graph, env = _Graph(), {}
    for p in f.params:
        env[p] = graph.node(f"input {p.name}", _shape(p.ty))
    _walk(graph, f, env, None)
    outs = env.get(f.body.body)
    return graph.to_dict(inputs=len(f.params), outputs=[o for o in _flat(outs)])


def _is_group(func) -> bool:
    return isinstance(func, relax.Function) and bool(func.attrs) and "Primitive" in func.attrs


def graph_after(mod: tvm.IRModule, func: str = "main") -> dict:
    """``mod`` after grouping, before FuseTIR: main calls one Primitive function per kernel."""
    if func not in [gv.name_hint for gv in mod.get_global_vars()]:
        return {"nodes": [], "edges": [], "kernels": []}
    f = mod[func]
    graph, env, kernels = _Graph(), {}, []
    for p in f.params:
        env[p] = graph.node(f"input {p.name}", _shape(p.ty))

    def on_call(call, var, env):
        if isinstance(call.op, tvm.ir.GlobalVar) and _is_group(mod[call.op]):
            group = mod[call.op]
            inner = {p: env.get(a) for p, a in zip(group.params, call.args) if isinstance(a, relax.Var)}
            first = len(graph.nodes)
            _walk(graph, group, inner, None)
            kernels.append({"name": call.op.name_hint, "nodes": list(range(first, len(graph.nodes)))})
            out = inner.get(group.body.body)
            return out if out is not None else -1
        if isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CALL_TIR):
            nid = graph.node(call.args[0].name_hint, _shape(var.ty))
            graph.connect([env.get(a) for a in _arg_exprs(call) if isinstance(a, relax.Var)], nid)
            kernels.append({"name": call.args[0].name_hint, "nodes": [nid]})
            return nid
        return None

    _walk(graph, f, env, on_call)
    outs = env.get(f.body.body)
    return graph.to_dict(kernels=kernels, outputs=[o for o in _flat(outs) if o != -1])


def _bounded(g: dict) -> dict:
    if len(g.get("nodes", [])) > MAX_NODES:
        return {"omitted": f"{len(g['nodes'])} nodes (more than {MAX_NODES})", "nodes": [], "edges": [],
                "kernels": []}
    return g


def record_before(report, mod: tvm.IRModule) -> None:
    try:
        report.sections["graph_before"] = _bounded(graph_before(mod))
    except Exception as err:  # noqa: BLE001 - the drawing is report-only: never fail a build over it
        report.sections["graph_before"] = {"omitted": f"not recorded ({type(err).__name__}: {err})"}


def record_after(report, mod: tvm.IRModule) -> None:
    try:
        report.sections["graph_after"] = _bounded(graph_after(mod))
    except Exception as err:  # noqa: BLE001
        report.sections["graph_after"] = {"omitted": f"not recorded ({type(err).__name__}: {err})"}
