"""FoldConstant on high-level Relax, guarded against a TVM 0.27 bug.

Before legalization, TVM's FoldConstant runs an op's legalizer to see whether the call folds. For
``dynamic_strided_slice`` (ONNX Slice with starts/ends as inputs) the legalizer emits a ``call_tir(shape_func)``
binding into the function but the PrimFunc never reaches the module, so the build later fails with
"There is no definition of I.GlobalVar("shape_func")". TVM's default pipeline only folds after LegalizeOps,
where this cannot happen. Here the folded module is kept only if it is well formed; otherwise the unfolded one
goes on (the FoldConstant after LegalizeOps folds what is left). FoldConstant that raises (a legalizer that
cannot take an op whose input shape is known only at run time) leaves the module unfolded too.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..passbase import PyPass


def is_well_formed(mod: tvm.IRModule) -> bool:
    try:
        return bool(relax.analysis.check_well_formed(mod))   # well_formed() returns None (raises on error)
    except Exception:   # 0.27 raises for an undefined GlobalVar instead of returning False
        return False


def _constant_like(expr, bound: dict) -> bool:
    if isinstance(expr, (tvm.ir.GenericConst, relax.ShapeExpr, tvm.ir.StringImm, tirx.IntImm, tirx.FloatImm)):
        return True
    if isinstance(expr, relax.Tuple):
        return all(_constant_like(f, bound) for f in expr.fields)
    if isinstance(expr, relax.Var):
        value = bound.get(expr.__chandle__())
        return value is not None and _constant_like(value, bound)
    return False


def has_foldable_call(mod: tvm.IRModule) -> bool:
    """Whether some call has only constant(-like) arguments: otherwise FoldConstant has nothing to fold.

    FoldConstant legalizes every call of a high-level module just to look at it (0.1 s on a BERT layer
    where nothing folds); a constant call, e.g. the scaled weight BN folding leaves, is what it folds."""
    bound, found = {}, []

    def visit(e):
        if found:
            return
        if isinstance(e, relax.Call) and not isinstance(e.op, relax.GlobalVar) \
                and all(_constant_like(a, bound) for a in e.args):
            found.append(e)

    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in getattr(func.body, "blocks", []):
            for b in block.bindings:
                if isinstance(b, relax.VarBinding):
                    bound[b.var.__chandle__()] = b.value
        relax.analysis.post_order_visit(func.body, visit)
        if found:
            return True
    return False


class SafeFoldConstant(PyPass):
    def pass_name(self) -> str:
        return "AscendSafeFoldConstant"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        if not has_foldable_call(mod):
            return mod
        try:
            folded = relax.transform.FoldConstant()(mod)
        except Exception:  # noqa: BLE001 - an op whose legalizer raises (input shape known only at run time)
            return mod      # is left to LegalizeOps, which reports it (legalize.CheckedLegalizeOps)
        return folded if folded.same_as(mod) or is_well_formed(folded) else mod
