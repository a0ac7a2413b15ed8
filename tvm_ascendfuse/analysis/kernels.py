"""What the compiled module launches: kernels, and the source ops each one contains."""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from ..ir import is_call_tir


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
    """For each Primitive Relax function: the ops it holds and the pattern that formed it, if any."""
    out = {}
    for gv, func in mod.functions.items():
        if _is_group(func):
            ops = [n for n in (_runs(c) for c in _calls(func.body)) if n]
            out[gv.name_hint] = {"ops": ops, "pattern": str(func.attrs["Composite"]) if "Composite" in func.attrs else None}
    return out


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
    rows = []
    for name, n in counts.items():
        g = groups.get(name)
        rows.append({"name": name, "launches": n, "ops": g["ops"] if g else [name],
                     "pattern": g["pattern"] if g else None, "fused": bool(g) and len(g["ops"]) > 1})
    return rows
