"""What the compiled module launches: kernels, and the source ops each one contains."""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from ..ir import is_call_tir
from ..kinds import op_kind, product_rows
from ..rule_specs import GroupShape, group_shape, predict_rule


def _is_group(func) -> bool:
    return isinstance(func, relax.Function) and bool(func.attrs) and "Primitive" in func.attrs


def _calls(expr):
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def _runs(call) -> str | None:
    """What a call runs: the PrimFunc of a call_tir, the op, or the function called."""
    if is_call_tir(call):
        return call.args[0].name_hint
    if isinstance(call.op, tvm.ir.Op):
        return call.op.name
    if isinstance(call.op, tvm.ir.GlobalVar):
        return call.op.name_hint
    return None


def relax_op_count(mod: tvm.IRModule) -> int:
    """Operator calls in the entry functions (what a user calls 'ops before')."""
    skip = {"relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed"}
    n = 0
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and not _is_group(func):
            n += sum(1 for c in _calls(func.body) if isinstance(c.op, tvm.ir.Op) and c.op.name not in skip)
            n += sum(1 for c in _calls(func.body) if is_call_tir(c))
    return n


def groups_before_fuse_tir(mod: tvm.IRModule) -> dict[str, dict]:
    """For each Primitive Relax function: the ops it holds, the pattern that formed it, if any, and its shape
    in the rule table's terms (``rule_specs.GroupShape``: the ops' kinds in program order)."""
    out = {}
    for gv, func in mod.functions.items():
        if _is_group(func):
            ops = [n for n in (_runs(c) for c in _calls(func.body)) if n]
            out[gv.name_hint] = {"ops": ops, "pattern": str(func.attrs["Composite"]) if "Composite" in func.attrs else None,
                                 "shape": group_function_shape(func, mod)}
    return out


def group_function_shape(func, mod: tvm.IRModule) -> GroupShape | None:
    """The ``GroupShape`` of a Primitive function made of call_tirs (None for any other body): what the
    schedule phase will see once FuseTIR has made one kernel of it."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return None
    kinds, producers, rows = [], [], []
    made: dict = {}                      # var -> positions of the call_tirs whose values it holds
    for block in body.blocks:
        for b in block.bindings:
            v = getattr(b, "value", None)
            if not is_call_tir(v):
                # plumbing (a tuple of results, an item of one, a rebinding): holds what its parts hold
                made[b.var] = set().union(*(made.get(x, set()) for x in _vars_of(v))) if v is not None else set()
                continue
            prim = _function(mod, v.args[0])
            kinds.append(op_kind(prim))
            rows.append(product_rows(prim))
            args = v.args[1].fields if isinstance(v.args[1], relax.Tuple) else [v.args[1]]
            producers.append(set().union(*(made.get(a, set()) for a in args)))
            made[b.var] = {len(kinds) - 1}
    if not kinds:
        return None
    outputs = set().union(*(made.get(v, set()) for v in _vars_of(body.body)))
    return group_shape(kinds, producers, outputs, rows)


def _function(mod, gv):
    try:
        return mod[gv]
    except (KeyError, ValueError, RuntimeError):   # not in this module (TVM raises RuntimeError subclasses)
        return None


def _vars_of(expr) -> list:
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def launched_kernels(mod: tvm.IRModule) -> list[str]:
    """Names of the PrimFuncs called with call_tir from the entry functions, in call order."""
    names = []
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and not _is_group(func):
            names += [c.args[0].name_hint for c in _calls(func.body) if is_call_tir(c)]
    return names


def launch_count(mod: tvm.IRModule) -> int:
    return len(launched_kernels(mod))


def kernel_table(mod_after: tvm.IRModule, groups: dict[str, dict]) -> list[dict]:
    """One row per distinct launched kernel with its source ops and launch count."""
    counts = Counter(launched_kernels(mod_after))
    funcs = {gv.name_hint: f for gv, f in mod_after.functions.items()}
    rows = []
    for name, n in counts.items():
        g = groups.get(name)
        row = {"name": name, "launches": n, "ops": g["ops"] if g else [name],
               "pattern": g["pattern"] if g else None, "fused": bool(g) and len(g["ops"]) > 1}
        shape = g.get("shape") if g else (group_shape(op_kind(funcs[name]), [set()], (), [product_rows(funcs[name])])
                                          if name in funcs else None)
        sizes = symbolic_sizes(funcs[name]) if name in funcs else []
        if sizes:
            row["symbolic"] = sizes
        if shape is not None:
            # the rule table's view of the kernel: the rule the schedule phase is expected to pick
            row["kinds"] = shape.kinds
            row["predicted_rule"] = predict_rule(shape).name
        rows.append(row)
    return rows


def symbolic_sizes(func) -> list[str]:
    """Names of the symbolic sizes a function's tensors depend on (a decode step's cache length): the
    variables in its parameters' shapes (a PrimFunc's buffers and size arguments, a Relax function's
    tensors)."""
    if isinstance(func, tvm.tirx.PrimFunc):
        buffers = [p for p in func.params if isinstance(p.ty, tvm.tirx.BufferType)]
        shapes = [p.ty.shape for p in buffers]
        names = {p.name for p in func.params if not isinstance(p.ty, tvm.tirx.BufferType)}
    else:
        shapes = [p.ty.shape.values for p in func.params
                  if isinstance(p.ty, relax.TensorType) and isinstance(p.ty.shape, relax.ShapeExpr)]
        names = set()
    for shape in shapes:
        for dim in shape:
            if not isinstance(dim, tvm.tirx.IntImm):
                names.update(v.name for v in tvm.tirx.analysis.undefined_vars(dim))
    return sorted(names)
