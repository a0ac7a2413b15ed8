"""Helpers the precision passes share: which Relax functions hold 16-bit float tensors, and a module with
some functions replaced."""

from __future__ import annotations

import tvm
from tvm import relax

from .modes import SIXTEEN_BIT


def dtype_of(expr) -> str | None:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def sixteen_bit_dtypes(func: relax.Function) -> set:
    found = set()

    def visit(e):
        d = dtype_of(e) if isinstance(e, (relax.Var, relax.Call, tvm.ir.GenericConst)) else None
        if d in SIXTEEN_BIT:
            found.add(d)

    relax.analysis.post_order_visit(func, visit)
    for p in func.params:
        if dtype_of(p) in SIXTEEN_BIT:
            found.add(dtype_of(p))
    return found


def sixteen_bit_functions(mod: tvm.IRModule):
    """(global var, function, its 16-bit dtypes) for every Relax function of ``mod`` holding 16-bit float
    tensors, fused (``Primitive``) functions left out."""
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or (func.attrs and "Primitive" in func.attrs):
            continue
        found = sixteen_bit_dtypes(func)
        if found:
            yield gv, func, found


def with_functions(mod: tvm.IRModule, updates: dict) -> tvm.IRModule:
    """``mod`` with the functions of ``updates`` (global var -> function) replaced (``mod`` if none)."""
    if not updates:
        return mod
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in updates.items():
        mod[gv] = func
    return mod
