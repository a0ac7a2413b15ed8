"""StaticShapeCanonicalizePass: shape computations on static tensors are evaluated, so the ops they feed get
static shapes before legalization.

Exporters write ``x.chunk(2, dim=1)`` or ``x.view(b, -1, c)`` as arithmetic on ``Shape(x)``: TVM's importer
turns it into ``shape_of`` / ``shape_to_tensor`` / ``take`` / ``divide`` / ``scatter_elements`` ... feeding a
``dynamic_strided_slice`` or a ``reshape`` whose output shape is then unknown (``R.Tensor(ndim=4)``), and every op
after it inherits the unknown shape. Legalization cannot emit a kernel for an op of unknown input shape
("emit_te now only supports Tensor that has ShapeExpr shape": torchvision's ShuffleNetV2 channel shuffle),
so TVM alone cannot compile such a model even though every value is known at compile time.

The pass walks the bindings in order and, while it re-emits them, evaluates small integer/bool values that
depend only on constants and on static shapes (``shape_of`` of a tensor whose shape is static, and the
arithmetic, indexing and scatter TVM's importer emits on it; numpy, at most ``MAX_ELEMENTS`` elements), and
boolean masks built from constants (``full`` -> ``tril``/``triu`` -> ``bitwise_not``: a causal mask, which
TVM cannot legalize: its ``full`` of a boolean fails). Then:

* ``dynamic_strided_slice(x, b, e, s)`` with known ``b, e, s`` becomes ``strided_slice(x, axes, b, e, s)``
  (same clamping semantics, static output shape);
* a shape argument (``reshape``, ``broadcast_to``, ...) that is a known ``Shape`` value becomes a ``ShapeExpr``;
* a known ``shape_of`` / ``tensor_to_shape`` becomes a ``ShapeExpr``, a known integer tensor a constant.

Re-emitting re-infers every later binding's type, so a repaired op's static shape reaches its consumers (and
the next ``shape_of``). Each binding whose shape went from unknown to static is recorded with the op that was
rewritten; a slice or reshape whose shape stays unknown (a value really read at run time) is recorded as not
repaired. Exact: the same values, computed at compile time instead of run time.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from ..fusion_pass import FusionPass
from ..report import CHECK_FAILED
from ..switches import STATIC_SHAPE as NAME

# Larger values are left to FoldConstant after legalization: shape arithmetic is a handful of elements.
MAX_ELEMENTS = 4096
# A boolean mask built in the graph (causal: full -> tril) has seq x seq elements; TVM cannot legalize a
# boolean ``full``, so it is evaluated here up to this size (1 byte an element).
MAX_MASK_ELEMENTS = 1 << 22

_SHAPE_CONSUMERS = ("relax.dynamic_strided_slice", "relax.reshape")


def _static_dims(expr) -> list[int] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    shape = ty.shape
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tirx.IntImm) for d in values):
        return None
    return [int(d) for d in values]


def _has_static_shape(ty) -> bool:
    if isinstance(ty, relax.TensorType):
        values = getattr(ty.shape, "values", None) if ty.shape is not None else None
        return values is not None and all(isinstance(d, tirx.IntImm) for d in values)
    if isinstance(ty, relax.TupleType):
        return all(_has_static_shape(f) for f in ty.fields)
    return True


def _int_attr(attrs, name, default=None):
    value = getattr(attrs, name, default) if attrs is not None else default
    return int(value) if value is not None else default


def _trunc_divide(a, b):
    """Integer division as TVM (and ONNX) define it for int tensors: rounding toward zero."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))


_BINARY = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.floor_divide": np.floor_divide, "relax.maximum": np.maximum, "relax.minimum": np.minimum,
    "relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
    "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal,
    "relax.logical_and": np.logical_and, "relax.logical_or": np.logical_or,
}


def _evaluate_call(name: str, call, args: list) -> np.ndarray | None:
    """numpy value of a call on known small int/bool arrays, None when the op is not one we evaluate."""
    attrs = call.attrs
    if name in _BINARY:
        a, b = args
        out = _BINARY[name](a, b)
        return out if out.dtype == bool else out.astype(np.result_type(a, b))
    if name == "relax.divide":
        a, b = args
        if a.dtype.kind not in "iu" or b.dtype.kind not in "iu" or np.any(b == 0):
            return None
        return _trunc_divide(a, b)
    if name == "relax.negative":
        return np.negative(args[0])
    if name == "relax.logical_not" or (name == "relax.bitwise_not" and args[0].dtype == bool):
        return np.logical_not(args[0])
    if name == "relax.full":
        # ``full(shape, fill)``: the boolean/int masks exports build in the graph (causal ones)
        return np.full([int(d) for d in args[0]], args[1].reshape(()), dtype=str(attrs.dtype))
    if name in ("relax.tril", "relax.triu"):
        k = int(args[1].reshape(())) if len(args) > 1 else 0
        return (np.tril if name == "relax.tril" else np.triu)(args[0], k)
    if name == "relax.astype":
        return args[0].astype(str(attrs.dtype))
    if name == "relax.where":
        return np.where(*args)
    if name == "relax.take":
        data, idx = args
        axis = _int_attr(attrs, "axis", None)
        mode = str(getattr(attrs, "mode", "fast"))
        if axis is None:
            data, axis = data.reshape(-1), 0
        extent = data.shape[axis]
        if mode == "wrap":
            idx = np.mod(idx, extent)
        elif mode == "clip":
            idx = np.clip(idx, 0, extent - 1)
        elif np.any((idx < 0) | (idx >= extent)):
            return None      # "fast" does no index arithmetic: only in-range indices have a defined value
        return np.take(data, idx, axis=axis)
    if name == "relax.concat":
        (parts,) = args
        return np.concatenate(parts, axis=_int_attr(attrs, "axis", 0))
    if name == "relax.reshape":
        return args[0].reshape([int(d) for d in args[1]])
    if name == "relax.expand_dims":
        out = args[0]
        for ax in sorted(int(a) % (out.ndim + len(attrs.axis)) for a in attrs.axis):
            out = np.expand_dims(out, ax)
        return out
    if name == "relax.squeeze":
        axes = None if attrs.axis is None else tuple(int(a) for a in attrs.axis)
        return np.squeeze(args[0], axis=axes)
    if name == "relax.scatter_elements":
        data, idx, upd = args
        if str(getattr(attrs, "reduction", "update")) != "update" or data.ndim != 1:
            return None
        out = data.copy()
        out[np.mod(idx.reshape(-1), data.shape[0])] = upd.reshape(-1)
        return out
    return None


def _resolve_reshape(data, target: np.ndarray) -> np.ndarray | None:
    """A reshape target with its one -1 worked out from the static input, None when that is not possible."""
    dims = _static_dims(data)
    if dims is None or np.sum(target == -1) > 1 or np.any(target < -1):
        return None
    if not np.any(target == -1):
        return target
    known = int(np.prod(target[target != -1]))
    total = int(np.prod(dims))
    if known == 0 or total % known:
        return None
    return np.where(target == -1, total // known, target)


@relax.expr_functor.mutator
class _Canonicalize(relax.PyExprMutator):
    """Re-emits a function's bindings with known shape values evaluated; see the module docstring."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.known: dict = {}         # emitted var handle -> np.ndarray (int/bool values, shapes as int64)
        self.repaired: list = []      # (binding name, op, new shape)
        self.unresolved: list = []    # (binding name, op): a shape consumer whose shape stays unknown
        self.followed = 0             # bindings that became static because an input did

    # ---- values known at compile time ------------------------------------------------------------------
    def value(self, expr) -> np.ndarray | list | None:
        if isinstance(expr, relax.Var):
            return self.known.get(expr.__chandle__())
        if isinstance(expr, tvm.ir.GenericConst):
            dims = _static_dims(expr)
            if dims is None or int(np.prod(dims)) > MAX_ELEMENTS:   # never copy a weight just to look at it
                return None
            arr = expr.value.numpy()
            return arr if arr.dtype.kind in "biu" else None
        if isinstance(expr, relax.ShapeExpr):
            if all(isinstance(v, tirx.IntImm) for v in expr.values):
                return np.array([int(v) for v in expr.values], dtype=np.int64)
            return None
        if isinstance(expr, tirx.IntImm):        # an integer argument (tril/triu's diagonal)
            return np.array(int(expr.value), dtype=np.int64)
        if isinstance(expr, relax.Tuple):
            fields = [self.value(f) for f in expr.fields]
            return None if any(f is None for f in fields) else fields
        return None

    def evaluate(self, value) -> np.ndarray | None:
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
            return self.value(value)
        name = value.op.name
        if name == "relax.shape_of":
            dims = _static_dims(value.args[0])
            return None if dims is None else np.array(dims, dtype=np.int64)
        args = [self.value(a) for a in value.args]
        if name in ("relax.shape_to_tensor", "relax.tensor_to_shape"):
            return args[0] if args[0] is not None else None
        if any(a is None for a in args):
            return None
        try:
            out = _evaluate_call(name, value, args)
        except Exception:  # noqa: BLE001 - a value we cannot reproduce exactly stays a run-time value
            return None
        if out is None or out.dtype.kind not in "biu":
            return None
        if out.size > (MAX_MASK_ELEMENTS if out.dtype == bool else MAX_ELEMENTS):
            return None
        return out

    # ---- rewriting -------------------------------------------------------------------------------------
    def rewrite(self, value):
        """(value to emit instead of ``value``, a visited call; what was rewritten or None)."""
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
            return value, None
        name = value.op.name
        if name in ("relax.shape_of", "relax.tensor_to_shape"):
            known = self.evaluate(value)
            if known is None or np.any(known < 0):     # a -1 to infer is a reshape's business, not a shape
                return value, None
            return relax.ShapeExpr([int(v) for v in known.reshape(-1)]), None
        if name == "relax.dynamic_strided_slice":
            begin, end, strides = (self.value(a) for a in value.args[1:4])
            if begin is None or end is None or strides is None:
                return value, None
            new = relax.op.strided_slice(value.args[0], axes=list(range(len(begin))),
                                         begin=[int(v) for v in begin], end=[int(v) for v in end],
                                         strides=[int(v) for v in strides])
            return new, "dynamic_strided_slice with computed begin/end -> strided_slice"
        args, changed = [], False
        for a in value.args:
            if isinstance(a, relax.Var) and isinstance(a.ty, relax.ShapeType):
                known = self.value(a)
                if known is not None and name == "relax.reshape":
                    known = _resolve_reshape(value.args[0], known.reshape(-1))
                if known is not None and not np.any(known < 0):
                    a, changed = relax.ShapeExpr([int(v) for v in known.reshape(-1)]), True
            args.append(a)
        if changed:
            return (relax.Call(value.op, args, value.attrs, value.ty_args),
                    f"{name.replace('relax.', '')} with a computed shape -> static shape")
        known = self.evaluate(value)
        return (relax.const(known, str(known.dtype)), None) if known is not None else (value, None)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        new, what = self.rewrite(self.visit_expr(binding.value))
        new = self.builder_.normalize(new)
        var = binding.var
        if not tvm_ffi.structural_equal(new.ty, var.ty):
            cls = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
            var = cls(binding.var.name, new.ty)
            self.set_var_remap(binding.var, var)
        self.builder_.emit_normalized(relax.VarBinding(var, new))
        known = self.evaluate(new)
        if known is not None:
            self.known[var.__chandle__()] = known
        if _has_static_shape(binding.var.ty):
            return
        if _has_static_shape(new.ty):
            # the op whose shape argument was evaluated is the repair; its consumers followed (counted)
            if what is not None:
                self.repaired.append((binding.var.name, what, [int(d) for d in new.ty.shape.values]))
            else:
                self.followed += 1
            return
        op = new.op.name if isinstance(new, relax.Call) and isinstance(new.op, tvm.ir.Op) else None
        if op in _SHAPE_CONSUMERS:
            self.unresolved.append((binding.var.name, op.replace("relax.", "")))


class StaticShapeCanonicalizePass(FusionPass):
    """See the module docstring."""

    switch_name = NAME

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        self.report.touch(self.switch_name)
        if not any(isinstance(f, relax.Function) and not _static_everywhere(f) for f in mod.functions.values()):
            return mod
        return super().transform_module(mod)

    def transform_function(self, func: relax.Function, mod: tvm.IRModule) -> relax.Function:
        if _static_everywhere(func):
            return func
        worker = _Canonicalize(mod)
        new = worker.visit_expr(func)
        for where, what, shape in worker.repaired:
            self.take(where, rewritten=what, shape=str(shape))
        if worker.repaired:
            self.report.sections.setdefault("static_shapes", {})[func_name(func)] = {
                "repaired": len(worker.repaired), "bindings_made_static": len(worker.repaired) + worker.followed,
                "still_unknown": len(worker.unresolved)}
        for where, op in worker.unresolved:
            self.refuse(CHECK_FAILED, where, failed=f"{op} shape depends on values read at run time")
        if not self.enabled or not worker.repaired:
            return func
        return new


def func_name(func: relax.Function) -> str:
    return str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "main"


def _static_everywhere(func: relax.Function) -> bool:
    """No binding of unknown shape: nothing to repair (the common case; skips the re-emission)."""
    found = []

    def visit(e):
        if not found and isinstance(e, relax.Var) and isinstance(e.ty, relax.TensorType) \
                and not _has_static_shape(e.ty):
            found.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return not found
