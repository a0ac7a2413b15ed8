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


def _var_bindings(func: relax.Function):
    """(block, binding, the values bound so far by handle, this one included) of each variable binding of
    ``func``, in order."""
    bound = {}
    for block in getattr(func.body, "blocks", []):
        for b in block.bindings:
            if isinstance(b, relax.VarBinding):
                bound[b.var.__chandle__()] = b.value
                yield block, b, bound


def has_constant_item(mod: tvm.IRModule) -> bool:
    """Whether some binding takes an item of a tuple of constants (directly or through a variable)."""
    return any(isinstance(b.value, relax.TupleGetItem) and _constant_like(b.value.tuple_value, bound)
               for func in mod.functions.values() if isinstance(func, relax.Function)
               for _, b, bound in _var_bindings(func))


def constant_bindings(func: relax.Function, keep: tuple = ()) -> list:
    """The dataflow bindings FoldConstant would fold: calls of ops whose arguments are constant(-like),
    directly or through such bindings, in binding order; calls of the ops in ``keep`` (and what is computed
    from them) are not picked."""
    picked, folded = [], set()

    def const_like(e, bound) -> bool:
        if isinstance(e, relax.Var) and e.__chandle__() in folded:
            return True
        if isinstance(e, relax.Tuple):
            return all(const_like(f, bound) for f in e.fields)
        return _constant_like(e, bound)

    for block, b, bound in _var_bindings(func):
        v = b.value
        if isinstance(block, relax.DataflowBlock) and isinstance(v, relax.Call) \
                and not isinstance(v.op, relax.GlobalVar) \
                and not (isinstance(v.op, tvm.ir.Op) and v.op.name in keep) \
                and (all(const_like(a, bound) for a in v.args) or static_shape_of(v) is not None):
            picked.append(b)
            folded.add(b.var.__chandle__())
    return picked


def static_shape_of(call: relax.Call) -> relax.ShapeExpr | None:
    """The value of ``shape_of(x)`` when ``x``'s shape is static (FoldConstant folds it, and what is
    computed from it), else None."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.shape_of" and len(call.args) == 1):
        return None
    shape = getattr(call.args[0].ty, "shape", None)
    dims = getattr(shape, "values", None)
    if dims is None or not all(isinstance(d, tirx.IntImm) for d in dims):
        return None
    return relax.ShapeExpr([int(d) for d in dims])


def fold_bindings(func: relax.Function, picked: list) -> relax.Function | None:
    """``func`` with the ``picked`` bindings (``constant_bindings``) replaced by their folded values.

    FoldConstant legalizes every call of a high-level function just to look at it (seconds on GPT-2, where
    one ``shape_of`` of a constant folds); here it runs on a function of the constant bindings alone. None
    when that function cannot be formed (a binding reads a value outside it)."""
    needed = {b.var.__chandle__() for b in picked}
    keep = []
    for block in func.body.blocks:
        for b in block.bindings:
            if b.var.__chandle__() in needed or (isinstance(b, relax.VarBinding) and _constant_like(b.value, {})):
                keep.append(b)
    inside = {b.var.__chandle__() for b in keep}
    for b in keep:
        if isinstance(b.value, relax.Call) and static_shape_of(b.value) is not None:
            continue            # becomes its shape in the function below
        if any(v.__chandle__() not in inside for v in relax.analysis.free_vars(b.value)):
            return None
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            for b in keep:
                shape = static_shape_of(b.value) if isinstance(b.value, relax.Call) else None
                bb.emit_normalized(b if shape is None else relax.VarBinding(b.var, shape))
            out = bb.emit_output(relax.Tuple([b.var for b in picked]))
        bb.emit_func_output(out)
    folded = relax.transform.FoldConstant()(bb.get())["main"]
    values = relax.analysis.get_var2val(folded)
    result = values.get(folded.body.body) if isinstance(folded.body.body, relax.Var) else folded.body.body
    if not isinstance(result, relax.Tuple) or len(result.fields) != len(picked):
        return None
    plan = {}
    for b, field in zip(picked, result.fields):
        value = values.get(field, field) if isinstance(field, relax.Var) else field
        if not isinstance(value, relax.Var) and _constant_like(value, {}):
            plan[b.var] = value
    return _Fold(plan).visit_expr(func) if plan else func


@relax.expr_functor.mutator
class _Fold(relax.PyExprMutator):
    """Each planned binding gets its folded value; uses of a binding folded to a tensor constant read the
    constant itself, as FoldConstant leaves them."""

    def __init__(self, plan: dict):
        super().__init__()
        self.plan = plan
        self.inline = {v.__chandle__(): c for v, c in plan.items() if isinstance(c, tvm.ir.GenericConst)}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        new = self.plan.get(binding.var)
        if new is None:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, new))

    def visit_dataflow_var_(self, op):
        return self.inline.get(op.__chandle__()) or super().visit_dataflow_var_(op)

    def visit_var_(self, op):
        return self.inline.get(op.__chandle__()) or super().visit_var_(op)


class SafeFoldConstant(PyPass):
    """``keep``: ops left unfolded on constant inputs (the pipeline's first fold keeps ``relax.dequantize``
    of quantized weights, so the int8 passes read the integer weights and their scales); then the module is
    folded only when the kept ops leave other foldable calls, and only those are folded."""

    def __init__(self, keep: tuple = ()):
        self.keep = tuple(keep)

    def pass_name(self) -> str:
        return "AscendSafeFoldConstant"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        if not has_foldable_call(mod):
            return mod
        try:
            folded = self._fold(mod, self.keep)
            if has_constant_item(folded):
                # A multi-output op folds to a tuple of constants, and an item taken from it is not folded,
                # nor is what is computed from it: NF-ResNet's weight standardisation (batch_norm over the
                # weight, then a reshape to OIHW) left every conv reading a weight computed at run time and
                # unpacked (17-58 GFLOP/s). Items of constant tuples become their constants, then fold on.
                folded = self._fold(relax.transform.CanonicalizeBindings()(folded), self.keep)
        except Exception:  # noqa: BLE001 - an op whose legalizer raises (input shape known only at run time)
            return mod      # is left to LegalizeOps, which reports it (legalize.CheckedLegalizeOps)
        return folded if folded.same_as(mod) or is_well_formed(folded) else mod

    @staticmethod
    def _fold(mod: tvm.IRModule, keep: tuple = ()) -> tvm.IRModule:
        """FoldConstant's result, computed on the constant bindings of each function alone
        (``fold_bindings``), or by FoldConstant on the module when those do not form a function."""
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            picked = constant_bindings(func, keep)
            if not picked:
                continue
            new = fold_bindings(func, picked)
            if new is None:
                if keep:    # FoldConstant on the whole module would fold the kept ops too
                    continue
                return relax.transform.FoldConstant()(mod)
            if not new.same_as(func):
                updates[gv] = new
        if not updates:
            return mod
        out = mod.clone()
        for gv, func in updates.items():
            out[gv] = func
        return out
