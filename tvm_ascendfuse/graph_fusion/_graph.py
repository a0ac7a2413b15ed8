"""Shared machinery of the graph-fusion passes: a read-only view of one Relax function's dataflow
(producers, live consumers, constant values, flattened products) and a base pass that plans rewrites on
that view and then applies them in one mutation.

Why plan-then-apply: bindings are scanned from the last to the first, so the largest match (the one whose
root is furthest down) claims its intermediates first and a smaller match inside it is not also taken.
Every rewrite keeps the root binding's variable, so its consumers need no remapping; the now dead
intermediates are removed by DeadCodeElimination in ``FusionPass.transform_module``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..fusion_pass import FusionPass
from ..ir import STORED_FLOAT_ATTR, op_name, static_dims, static_shape  # noqa: F401 - the passes import them from here
from ..report import CHECK_FAILED

GenericConst = tvm.ir.GenericConst

# Ops whose application to a constant is itself a constant we can evaluate with numpy.
_CONST_LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.astype")


def int_list(values) -> list[int] | None:
    """A Relax attribute/argument holding integers (Array, Tuple of IntImm, ShapeExpr) as Python ints."""
    if values is None:
        return None
    if isinstance(values, relax.ShapeExpr):
        values = values.values
    elif isinstance(values, relax.Tuple):
        values = values.fields
    try:
        return [int(v.value) if hasattr(v, "value") else int(v) for v in values]
    except (TypeError, ValueError):
        return None


# How far an exported constant may be from its mathematical value and still be that value: the
# rounding of the dtype (bf16 keeps 8 significant bits, fp16 11) plus a margin for constants written
# with a few digits (1.4142).
CONST_RTOL = {"float16": 1e-3, "bfloat16": 4e-3}


def close(value: float | None, expected: float, dtype: str = "float32") -> bool:
    rtol = CONST_RTOL.get(dtype, 1e-4)
    return value is not None and abs(value - expected) <= rtol * abs(expected) + 1e-12


def is_plain_const(expr, shape) -> bool:
    """``expr`` is a literal constant (not a chain over one) of exactly ``shape``."""
    return isinstance(expr, GenericConst) and tuple(int(d) for d in expr.value.shape) == tuple(shape)


def make_const(array: np.ndarray, dtype: str) -> relax.Expr:
    return relax.const(np.ascontiguousarray(np.asarray(array).astype(dtype)), dtype)


_LAST_GRAPH: list = []     # the FunctionGraph built last (FunctionGraph.of)


class FunctionGraph:
    """Producers and live consumers of every bound variable of one function.

    Dead bindings (in dataflow blocks, whose bindings are pure) are ignored, so a value whose only other
    consumer is dead code (e.g. BatchNorm's unused statistics outputs) still counts as single-use.
    """

    def __init__(self, func: relax.Function):
        self.func = func
        attrs = func.attrs
        # the 16-bit dtype a model stored its floats in before the precision phase widened them, or None
        self.stored_float = str(attrs[STORED_FLOAT_ATTR]) if attrs is not None and STORED_FLOAT_ATTR in attrs \
            else None
        self.var2val = relax.analysis.get_var2val(func)
        self.order: list[relax.Var] = []                    # candidate roots, in binding order
        self.users: dict[Any, list] = defaultdict(list)   # var -> live binding vars using it (None = returned)
        live = set(relax.analysis.free_vars(func.body.body))
        kept = []
        for block in reversed(list(func.body.blocks)):
            pure = isinstance(block, relax.DataflowBlock)
            for binding in reversed(list(block.bindings)):
                if pure and binding.var not in live:
                    continue
                used = relax.analysis.free_vars(binding.value)
                live.update(used)
                kept.append((binding, used))
        for binding, used in reversed(kept):
            if isinstance(binding, relax.VarBinding):   # match_cast roots are never rewritten
                self.order.append(binding.var)
            for var in used:
                self.users[var].append(binding.var)
        for var in relax.analysis.free_vars(func.body.body):
            self.users[var].append(None)

    @classmethod
    def of(cls, func: relax.Function) -> "FunctionGraph":
        """The graph of ``func``, shared with the previous caller asking for the same function object (the
        graph-fusion passes run one after another over one function; most leave it unchanged, and building
        the graph walks every binding). Graphs are read-only to their users."""
        if _LAST_GRAPH and _LAST_GRAPH[0].func.same_as(func):
            return _LAST_GRAPH[0]
        graph = cls(func)
        _LAST_GRAPH[:] = [graph]
        return graph

    def const_dtype(self, dtype: str) -> str:
        """The dtype whose rounding the constants of a ``dtype`` computation carry (``close``): the model's
        16-bit dtype for a float32 computation the precision phase widened from it, else ``dtype``."""
        return self.stored_float if dtype == "float32" and self.stored_float else dtype

    # ---- producers ----------------------------------------------------------------------------------
    def value(self, expr):
        """The value bound to ``expr`` if it is a bound variable, else None."""
        if isinstance(expr, relax.Var):
            return self.var2val.get(expr)
        return None

    def call(self, expr, *ops: str):
        """The Call producing ``expr`` if its op is one of ``ops``."""
        val = self.value(expr)
        return val if op_name(val) in ops else None

    def single_use(self, var) -> bool:
        return isinstance(var, relax.Var) and var in self.var2val and len(self.users.get(var, [])) == 1

    def outside_users(self, var, inside: set) -> list:
        """Users of ``var`` that are not in ``inside`` (the function output counts as outside)."""
        return [u for u in self.users.get(var, []) if u is None or u not in inside]

    # ---- constants ----------------------------------------------------------------------------------
    def const(self, expr) -> np.ndarray | None:
        """The numpy value of a constant, or of a reshape/transpose/... chain over a constant."""
        if isinstance(expr, GenericConst):
            return expr.value.numpy()
        val = self.value(expr)
        if isinstance(val, GenericConst):
            return val.value.numpy()
        name = op_name(val)
        if name == "relax.dequantize":      # a quantized weight the pipeline keeps int8 until the int8 passes
            return self._dequantized(expr, val)
        if name not in _CONST_LAYOUT_OPS:
            return None
        src = self.const(val.args[0])
        if src is None:
            return None
        out_shape = static_shape(expr)
        if name == "relax.permute_dims":
            axes = int_list(val.attrs.axes) if val.attrs.axes is not None else None
            res = np.transpose(src, axes)
        elif name == "relax.astype":
            res = src.astype(str(val.attrs.dtype))
        else:  # reshape / expand_dims / squeeze: only the shape changes
            if out_shape is None:
                return None
            res = src.reshape(out_shape)
        if out_shape is not None and tuple(res.shape) != out_shape:
            return None
        return res

    def const_shape(self, expr) -> tuple[tuple, str] | None:
        """(shape, dtype) of what ``const(expr)`` returns, without copying any data (None when it returns
        None): a pass that needs a large weight's values only for some of its candidates asks this first."""
        if isinstance(expr, GenericConst):
            return tuple(int(d) for d in expr.value.shape), str(expr.value.dtype)
        val = self.value(expr)
        if isinstance(val, GenericConst):
            return tuple(int(d) for d in val.value.shape), str(val.value.dtype)
        name = op_name(val)
        if name == "relax.dequantize":
            src = self.const_shape(val.args[0])
            return None if src is None else (src[0], str(val.attrs.out_dtype))
        if name not in _CONST_LAYOUT_OPS:
            return None
        src = self.const_shape(val.args[0])
        if src is None:
            return None
        shape, dtype = src
        out_shape = static_shape(expr)
        if name == "relax.permute_dims":
            axes = int_list(val.attrs.axes) if val.attrs.axes is not None else list(range(len(shape)))[::-1]
            res = tuple(shape[a] for a in axes)
        elif name == "relax.astype":
            res, dtype = shape, str(val.attrs.dtype)
        else:
            if out_shape is None:
                return None
            res = tuple(out_shape)
        if out_shape is not None and res != tuple(out_shape):
            return None
        return res, dtype

    def _dequantized(self, expr, val) -> np.ndarray | None:
        """``dequantize(q, scale, zero_point, axis)`` of constants, as TVM computes it (float32)."""
        q, scale, zp = (self.const(a) for a in val.args[:3])
        if q is None or scale is None or zp is None:
            return None
        shape = [1] * q.ndim
        if scale.size > 1 or zp.size > 1:
            axis = int(val.attrs.axis) % q.ndim
            shape[axis] = q.shape[axis]
        res = (q.astype("int32") - zp.astype("int32").reshape(shape)) * scale.astype("float32").reshape(shape)
        return res.astype(str(val.attrs.out_dtype))

    def scalar(self, expr) -> float | None:
        """The value of a one-element constant (shape () or all ones), else None."""
        shape = static_shape(expr)
        if shape is None or int(np.prod(shape)) != 1:   # don't copy a large constant just to look at it
            return None
        arr = self.const(expr)
        if arr is None or arr.size != 1:
            return None
        return float(arr.reshape(()))


# ---- products ---------------------------------------------------------------------------------------
@dataclass
class Product:
    """``coef * prod(atom ** exp) * prod(const ** exp)``: a multiply/divide/power tree, flattened.

    Only single-use intermediates are opened (they become ``internal``); a multi-use variable stays an atom,
    so a value that is also needed elsewhere is never absorbed into a rewrite.
    ``sqrt(v)`` and ``rsqrt(v)`` become the atom ``("sqrt", v)`` with exponent +1 / -1.
    """

    coef: float = 1.0
    atoms: dict = field(default_factory=dict)
    consts: list = field(default_factory=list)   # (array, exponent) of non-scalar constants
    internal: set = field(default_factory=set)

    def add_atom(self, key, exp: float) -> None:
        self.atoms[key] = self.atoms.get(key, 0) + exp
        if self.atoms[key] == 0:
            del self.atoms[key]

    def merge(self, other: "Product", exp: float = 1.0) -> None:
        self.coef *= other.coef ** exp
        for key, e in other.atoms.items():
            self.add_atom(key, e * exp)
        self.consts += [(arr, e * exp) for arr, e in other.consts]
        self.internal |= other.internal

    def const_factor(self) -> np.ndarray | None:
        """The product of the non-scalar constants (None if there are none)."""
        out = None
        for arr, e in self.consts:
            term = arr.astype("float64") ** e
            out = term if out is None else out * term
        return out


def flatten_product(graph: FunctionGraph, expr, root: bool = False) -> Product:
    """Flatten ``expr`` (or, with ``root``, the value bound to the root variable ``expr``)."""
    prod = Product()
    scal = graph.scalar(expr)
    if scal is not None:
        prod.coef = scal
        return prod
    arr = graph.const(expr)
    if arr is not None:
        prod.consts.append((arr, 1.0))
        return prod
    if not root and not graph.single_use(expr):
        prod.add_atom(expr, 1.0)
        return prod
    val = graph.value(expr)
    name = op_name(val)
    if name == "relax.multiply":
        prod.merge(flatten_product(graph, val.args[0]))
        prod.merge(flatten_product(graph, val.args[1]))
    elif name == "relax.divide":
        prod.merge(flatten_product(graph, val.args[0]))
        prod.merge(flatten_product(graph, val.args[1]), -1.0)
    elif name == "relax.power" and graph.scalar(val.args[1]) in (2.0, 3.0):
        prod.merge(flatten_product(graph, val.args[0]), graph.scalar(val.args[1]))
    elif name in ("relax.sqrt", "relax.rsqrt"):
        prod.add_atom(("sqrt", val.args[0]), 1.0 if name == "relax.sqrt" else -1.0)
    else:
        prod.add_atom(expr, 1.0)
        return prod
    if not root:
        prod.internal.add(expr)
    return prod


# ---- the pass base ----------------------------------------------------------------------------------
@dataclass
class Rewrite:
    """One planned rewrite: ``root`` (a bound variable) gets ``value``; ``internal`` are the bindings the
    rewrite absorbs (they must have no consumer outside the match)."""

    root: relax.Var
    value: relax.Expr
    internal: set = field(default_factory=set)
    detail: dict = field(default_factory=dict)


class Refusal(Exception):
    """Raised by a matcher for a recognised pattern that fails a check: recorded, graph left alone.

    ``internal`` (the bindings the pattern would have absorbed) keeps smaller matches inside the refused
    one from being reported again as separate refusals (they may still be rewritten if they pass)."""

    def __init__(self, reason: str = CHECK_FAILED, internal: set | None = None, **detail):
        super().__init__(reason)
        self.reason = reason
        self.internal = set(internal or ())
        self.detail = detail


class GraphRewritePass(FusionPass):
    """Subclasses implement ``match(var, graph) -> Rewrite | None`` (raise ``Refusal`` to reject a match).

    ``rounds`` > 1 repeats plan+apply so that a rewrite can enable another one of the same pass (used by
    the split pass for chains of elementwise ops); a switched-off pass plans once and records those matches.
    """

    rounds: int = 1

    def match(self, var: relax.Var, graph: FunctionGraph) -> Rewrite | None:
        raise NotImplementedError

    def transform_function(self, func: relax.Function, mod: tvm.IRModule) -> relax.Function:
        current = func
        for _ in range(self.rounds):
            plan = self._plan(FunctionGraph.of(current))
            if not plan:
                break
            current = _Apply(plan).visit_expr(current)
        return current     # dead intermediates go in FusionPass.transform_module's DeadCodeElimination

    def _plan(self, graph: FunctionGraph) -> dict:
        plan, claimed, refused = {}, set(), set()
        for var in reversed(graph.order):
            if var in claimed:
                continue
            try:
                found = self.match(var, graph)
            except Refusal as refusal:
                if var not in refused:
                    self.refuse(refusal.reason, var.name, **refusal.detail)
                refused |= refusal.internal
                continue
            except Exception as err:  # noqa: BLE001  a matcher bug must not break compilation: leave alone
                self.refuse(CHECK_FAILED, var.name, failed=f"matcher error {type(err).__name__}: {err}")
                continue
            if found is None or found.internal & claimed:
                continue
            problem = self._check(found, graph)
            if problem is not None:
                if var not in refused:
                    self.refuse(CHECK_FAILED, var.name, failed=problem, **found.detail)
                refused |= found.internal
                continue
            claimed |= found.internal | {found.root}
            if self.take(var.name, **found.detail):
                plan[found.root] = found.value
        return plan

    @staticmethod
    def _check(found: Rewrite, graph: FunctionGraph) -> str | None:
        inside = found.internal | {found.root}
        for var in found.internal:
            if graph.outside_users(var, inside):
                return f"intermediate '{var.name}' has consumers outside the pattern"
        new_ty = _infer_type(found.value)
        if new_ty is None or not tvm_ffi.structural_equal(new_ty, found.root.ty):
            return f"rewritten value has type {new_ty}, expected {found.root.ty}"
        return None


def _infer_type(expr):
    bb = relax.BlockBuilder()
    bb._begin_binding_block()
    try:
        return bb.emit(expr).ty
    except Exception:  # a malformed candidate is a refusal, not a crash
        return None
    finally:
        bb._end_block()


@relax.expr_functor.mutator
class _Apply(relax.PyExprMutator):
    """Replaces the value of each planned root binding, keeping the root variable."""

    def __init__(self, plan: dict):
        super().__init__()
        self.plan = plan

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        new = self.plan.get(binding.var)
        if new is None:
            super().visit_var_binding_(binding)
            return
        value = self.builder_.normalize(self.visit_expr(new))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


@relax.expr_functor.mutator
class Rewire(relax.PyExprMutator):
    """Uses of an aliased variable read its source instead; the alias binding is dropped when it is a dataflow
    variable (an output variable keeps a binding, so the function still returns it)."""

    def __init__(self, alias: dict):
        super().__init__()
        self.alias = alias

    def _source(self, var):
        while var in self.alias:
            var = self.alias[var]
        return var

    def visit_var_(self, var):
        if var in self.alias:
            return self.visit_expr(self._source(var))
        return super().visit_var_(var)

    def visit_dataflow_var_(self, var):
        if var in self.alias:
            return self.visit_expr(self._source(var))
        return super().visit_dataflow_var_(var)

    def visit_var_binding_(self, binding):
        if binding.var in self.alias and isinstance(binding.var, relax.DataflowVar):
            return
        super().visit_var_binding_(binding)
