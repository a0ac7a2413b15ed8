"""PrepackConstantWeights: run the weight re-layouts that schedules requested once, at compile time.

A GEMM/conv schedule re-lays out a constant weight through a copy block annotated
``meta_schedule.layout_rewrite_preproc`` (``layout.py``). This pass moves those blocks into their own
PrimFuncs called on the weights (``relax.transform.SplitLayoutRewritePreproc``), evaluates the calls whose
weight is a constant (``FoldConstant``), and drops the packing PrimFuncs nobody calls any more. A weight
that is not a constant (a model parameter passed at run time) keeps its packing call, run per inference:
still exact. Modules without such blocks are returned unchanged (TVM's split pass asserts on PrimFuncs it
cannot read, so it is not run needlessly).

Pipeline position: ``AttachAttrLayoutFreeBuffers`` -> ApplyUBSchedules -> PrepackConstantWeights ->
(UB verification, lowering).

``FoldConstantCopies`` evaluates those packing calls with numpy instead: FoldConstant compiles each packing
PrimFunc with LLVM (tens of ms per weight, a large share of compiling a small model) only to run a copy.
A packing PrimFunc is one block under a loop nest storing ``out[f(v)] = w[g(v)]`` with integer index
arithmetic; ``eval_copy_primfunc`` evaluates exactly that (gathers and scatters, no arithmetic on the
values, so the result is bit-identical) and declines anything else, which FoldConstant then folds as before.
Elements a packing never writes (tile padding) are zero here, uninitialised memory in FoldConstant's result.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from ..ir import is_call_tir
from ..passbase import PyPass
from .layout import PREPROC_ANNOTATION


def has_prepack_blocks(mod: tvm.IRModule) -> bool:
    found = []

    def visit(block):
        if PREPROC_ANNOTATION in block.annotations:
            found.append(block)

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func, (s_tir.SBlock, visit))
            if found:
                return True
    return False


class PrepackConstantWeights(PyPass):
    def __init__(self, fold=None):
        self.fold = fold    # a FoldConstant-like pass; default relax.transform.FoldConstant()

    def pass_name(self) -> str:
        return "AscendPrepackConstantWeights"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        if not has_prepack_blocks(mod):
            return mod
        fold = self.fold if self.fold is not None else relax.transform.FoldConstant()
        # CanonicalizeBindings: a packing call with several outputs folds into a tuple of constants read through
        # TupleGetItem; resolved to the constants, the tuple binding becomes dead and DCE drops it. Left in, VM
        # codegen converted every such weight twice (its constant dedup hashes the data: slow on large weights).
        return tvm.transform.Sequential([relax.transform.SplitLayoutRewritePreproc(), FoldConstantCopies(), fold,
                                         relax.transform.CanonicalizeBindings(),
                                         relax.transform.DeadCodeElimination()])(mod)


class NotACopy(Exception):
    """The PrimFunc is not a pure index-remapping copy; leave it to FoldConstant."""


_INT_OPS = {
    tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod, tirx.Min: np.minimum, tirx.Max: np.maximum,
    tirx.LT: np.less, tirx.LE: np.less_equal, tirx.GT: np.greater, tirx.GE: np.greater_equal,
    tirx.EQ: np.equal, tirx.NE: np.not_equal, tirx.And: np.logical_and, tirx.Or: np.logical_or,
}
_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def _np_dtype(dtype: str):
    if dtype not in ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"):
        raise NotACopy(f"dtype {dtype}")
    return np.dtype(dtype)


def _is_index(e) -> bool:
    """An integer expression that reads no buffer: index arithmetic, never arithmetic on weight values."""
    if not str(e.ty).startswith(("int", "uint", "bool")):
        return False
    loads = []
    tvm_ffi.structural_walk(e, (tvm.ir.TensorLoad, loads.append))
    return not loads


class _Eval:
    """Evaluates index expressions (and a loaded value) over the iteration grid, as broadcast numpy arrays.

    Variables are keyed by their object handle (a PrimExpr's ``==`` builds an expression, not a bool)."""

    def __init__(self, env: dict, arrays: dict):
        self.env, self.arrays = env, arrays
        self.guarded = 0      # > 0 inside a select: a load there may index out of bounds where not taken

    def __call__(self, e):
        if isinstance(e, tvm.ir.Var):
            if e.__chandle__() in self.env:
                return self.env[e.__chandle__()]
            raise NotACopy(f"free variable {e}")
        if isinstance(e, tirx.IntImm):
            return np.int64(e.value)
        if isinstance(e, tirx.FloatImm):
            return e.value
        if type(e) in _INT_OPS:
            if not (_is_index(e.a) and _is_index(e.b)):
                raise NotACopy("arithmetic on values")    # only index arithmetic: values are copied as-is
            a, b = self(e.a), self(e.b)
            if type(e) in (tirx.FloorDiv, tirx.FloorMod) and np.any(np.asarray(b) == 0):
                raise NotACopy("division by zero")
            return _INT_OPS[type(e)](a, b)
        if isinstance(e, tirx.Not):
            return np.logical_not(self(e.a))
        if isinstance(e, tirx.Cast):
            if not (_is_index(e) and _is_index(e.value)):
                raise NotACopy("cast of a value")     # a value cast would change bits, not copy them
            return self(e.value)
        if isinstance(e, tirx.Select):
            return self._where(e.condition, e.true_value, e.false_value)
        if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op) and e.op.same_as(_IF_THEN_ELSE):
            return self._where(*e.args)
        if isinstance(e, tvm.ir.TensorLoad):
            src = self.arrays.get(e.source.__chandle__())
            if src is None:
                raise NotACopy("load from a non-parameter buffer")
            idx = [np.asarray(self(i)) for i in e.indices]
            if len(idx) != src.ndim:
                raise NotACopy("load rank")
            if self.guarded:
                # the branch of a select not taken may index out of bounds: clip, the select drops those
                idx = [np.clip(i, 0, n - 1) for i, n in zip(idx, src.shape)]
            elif any(i.size and (i.min() < 0 or i.max() >= n) for i, n in zip(idx, src.shape)):
                raise NotACopy("load out of bounds")
            return src[tuple(idx)]
        raise NotACopy(f"expression {type(e).__name__}")

    def _where(self, cond, a, b):
        c = self(cond)
        self.guarded += 1
        try:
            return np.where(c, self(a), self(b))
        finally:
            self.guarded -= 1


def _static_shape(var) -> tuple[int, ...]:
    t = var.ty
    if not isinstance(t, tirx.BufferType) or not all(isinstance(d, tirx.IntImm) for d in t.shape):
        raise NotACopy("parameter without a static buffer shape")
    return tuple(int(d) for d in t.shape)


def eval_copy_primfunc(func: tirx.PrimFunc, inputs: list[np.ndarray]) -> np.ndarray:
    """Run ``func`` (inputs..., one output) on numpy ``inputs`` when it is a copy; else NotACopy."""
    outs = eval_copy_outputs(func, inputs)
    if len(outs) != 1:
        raise NotACopy("more than one output")
    return outs[0]


def eval_copy_outputs(func: tirx.PrimFunc, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run ``func`` (inputs..., outputs...) on numpy ``inputs`` when its body is a sequence of copy nests, one
    per output (several weights packed by one PrimFunc); else NotACopy."""
    params = list(func.params)
    outs = params[len(inputs):]
    if not outs:
        raise NotACopy("no output parameter")
    root = func.body
    if not isinstance(root, s_tir.SBlockRealize) or root.block.alloc_buffers or root.block.match_buffers \
            or root.block.init is not None:
        raise NotACopy("root block")
    arrays = {}
    for p, x in zip(params, inputs):
        if _static_shape(p) != tuple(x.shape) or _np_dtype(str(p.ty.dtype)) != x.dtype:
            raise NotACopy("input shape/dtype")
        arrays[p.__chandle__()] = x
    body = root.block.body
    nests = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    results = {}
    for nest in nests:
        loops, realize = _copy_nest(nest)
        store = realize.block.body
        k = next((i for i, o in enumerate(outs) if store.buffer.same_as(o)), None)
        if k is None or k in results:
            raise NotACopy("a nest stores to a non-output buffer or to an output written before")
        results[k] = _eval_nest(loops, realize, store, arrays, outs[k])
    if len(results) != len(outs):
        raise NotACopy("an output is never written")
    return [results[k] for k in range(len(outs))]


def _copy_nest(stmt):
    loops = []
    while isinstance(stmt, tirx.For):
        if not (isinstance(stmt.min, tirx.IntImm) and isinstance(stmt.extent, tirx.IntImm)):
            raise NotACopy("loop bounds")
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, s_tir.SBlockRealize):
        raise NotACopy("not one block under a loop nest")
    block = stmt.block
    if block.init is not None or block.alloc_buffers or block.match_buffers \
            or not isinstance(block.body, tirx.BufferStore):
        raise NotACopy("block body")
    return loops, stmt


def _eval_nest(loops, stmt, store, arrays, out_var) -> np.ndarray:
    out_shape, out_dtype = _static_shape(out_var), _np_dtype(str(out_var.ty.dtype))
    inputs = list(arrays.values())
    fast = _split_reorder(loops, stmt, store, arrays, out_shape)
    if fast is not None:
        return fast.astype(out_dtype, copy=False)
    # Index arithmetic stays in broadcast (outer-product) shapes, so it costs O(sum of extents); only the
    # gather of the values, the flat store index and the scatter touch every element.
    ndim = len(loops)
    grid = tuple(int(l.extent) for l in loops)
    itype = np.int32 if max(int(np.prod(grid)), int(np.prod(out_shape)), *(x.size for x in inputs)) < 2**31 \
        else np.int64
    env = {}
    for i, loop in enumerate(loops):
        shape = [1] * ndim
        shape[i] = grid[i]
        start = int(loop.min)
        env[loop.loop_var.__chandle__()] = np.arange(start, start + grid[i], dtype=itype).reshape(shape)
    outer = _Eval(env, arrays)
    for iv, value in zip(stmt.block.iter_vars, stmt.iter_values):
        env[iv.var.__chandle__()] = outer(value)
    ev = _Eval(env, arrays)
    idx = [np.asarray(ev(i)) for i in store.indices]
    if len(idx) != len(out_shape):
        raise NotACopy("store rank")
    pred = np.asarray(ev(stmt.predicate), dtype=bool)
    ev.guarded = int(not (pred.ndim == 0 and bool(pred)))   # loads where the predicate is false are dropped
    values = np.asarray(ev(store.value))
    if pred.ndim == 0 and bool(pred):
        select = None
    else:
        select = np.broadcast_to(pred, grid)
        idx = [np.broadcast_to(i, grid)[select] for i in idx]
        values = np.broadcast_to(values, grid)[select]
    for i, n in zip(idx, out_shape):
        if i.size and (i.min() < 0 or i.max() >= n):
            raise NotACopy("store out of bounds")
    strides = np.cumprod((1,) + out_shape[::-1][:-1])[::-1] if out_shape else ()
    flat = sum((i.astype(itype, copy=False) * itype(st) for i, st in zip(idx, strides)), itype(0))
    flat = np.broadcast_to(flat, grid if select is None else flat.shape).ravel()
    total = int(np.prod(out_shape))
    written = np.zeros(total, dtype=bool)
    written[flat] = True
    if int(np.count_nonzero(written)) != flat.size:
        raise NotACopy("an element is written twice")   # order would matter; not a plain re-layout
    out = np.zeros(total, dtype=out_dtype)
    out[flat] = np.broadcast_to(values, grid if select is None else values.shape).ravel().astype(out_dtype,
                                                                                                 copy=False)
    return out.reshape(out_shape)


def _split_reorder(loops, realize, store, arrays, out_shape):
    """The usual packing, ``out[.., v // c, .., v % c, ..] = w[v0, .., vn]`` over exactly w's domain, as a
    pad + reshape + transpose (a strided copy instead of an element-wise scatter); None for other forms."""
    load = store.value
    if not (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate) == 1) \
            or not isinstance(load, tvm.ir.TensorLoad) or load.source.__chandle__() not in arrays:
        return None
    x = arrays[load.source.__chandle__()]
    if len(loops) != x.ndim or len(realize.iter_values) != x.ndim:
        return None
    axis_of = {}
    for k, (loop, value, iv, index) in enumerate(zip(loops, realize.iter_values, realize.block.iter_vars,
                                                     load.indices)):
        if int(loop.min) != 0 or int(loop.extent) != x.shape[k] or not value.same_as(loop.loop_var) \
                or not index.same_as(iv.var):
            return None
        axis_of[iv.var.__chandle__()] = k
    pieces = []          # per output dim: (axis, "full" | "outer" | "inner", factor)
    for e in store.indices:
        if isinstance(e, tvm.ir.Var) and e.__chandle__() in axis_of:
            pieces.append((axis_of[e.__chandle__()], "full", 1))
        elif isinstance(e, (tirx.FloorDiv, tirx.FloorMod)) and isinstance(e.a, tvm.ir.Var) \
                and e.a.__chandle__() in axis_of and isinstance(e.b, tirx.IntImm) and int(e.b) > 0:
            pieces.append((axis_of[e.a.__chandle__()], "outer" if isinstance(e, tirx.FloorDiv) else "inner",
                           int(e.b)))
        else:
            return None
    per_axis = {}
    for axis, kind, c in pieces:
        per_axis.setdefault(axis, []).append((kind, c))
    if sorted(per_axis) != list(range(x.ndim)):
        return None
    split_shape, pad, names = [], [], []
    for k in range(x.ndim):
        kinds = sorted(per_axis[k])
        n = x.shape[k]
        if kinds == [("full", 1)]:
            split_shape.append(n)
            pad.append((0, 0))
            names.append((k, "full"))
        elif len(kinds) == 2 and kinds[0][0] == "inner" and kinds[1][0] == "outer" and kinds[0][1] == kinds[1][1]:
            c = kinds[0][1]
            outer = -(-n // c)
            split_shape += [outer, c]
            pad.append((0, outer * c - n))
            names += [(k, "outer"), (k, "inner")]
        else:
            return None
    order = [names.index((axis, kind)) for axis, kind, _ in pieces]
    y = np.pad(x, pad) if any(p[1] for p in pad) else x
    y = y.reshape(split_shape).transpose(order)
    if tuple(y.shape) != tuple(out_shape):
        return None
    return y    # a strided view: _to_tensor copies it once, straight into the constant's memory


@relax.expr_functor.mutator
class _FoldCopies(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod_ = mod
        self.cache: dict = {}     # (callee, constant ids) -> folded constant: one pack per weight and layout
        self.folded = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not is_call_tir(call):
            return call
        callee, args = call.args[0], call.args[1]
        if len(call.args) > 2 or not isinstance(args, relax.Tuple) \
                or not all(isinstance(a, tvm.ir.GenericConst) for a in args.fields):
            return call
        func = self.mod_.functions.get(callee) if isinstance(callee, tvm.ir.GlobalVar) else None
        if not isinstance(func, tirx.PrimFunc):
            return call
        key = (callee.name_hint, tuple(a.__chandle__() for a in args.fields))   # the module keeps them alive
        if key not in self.cache:
            try:
                values = eval_copy_outputs(func, [_as_numpy(a.value) for a in args.fields])
            except NotACopy:
                return call
            types = list(call.ty.fields) if isinstance(call.ty, relax.TupleType) else [call.ty]
            if len(types) != len(values) or not all(_matches(t, v) for t, v in zip(types, values)):
                return call
            consts = [relax.const(_to_tensor(v)) for v in values]
            self.cache[key] = relax.Tuple(consts) if isinstance(call.ty, relax.TupleType) else consts[0]
        self.folded += 1
        return self.cache[key]


def _to_tensor(value: np.ndarray):
    """A TVM tensor holding ``value`` (any strides), written with one copy into its own memory. A contiguous
    copy first and then ``tvm.runtime.tensor`` (or ``relax.const(ndarray)``, which also casts with a copy)
    cost fresh pages twice (measured several times slower on a decoder block's weights)."""
    out = tvm.runtime.empty(value.shape, str(value.dtype))
    try:
        np.copyto(np.from_dlpack(out), value)
    except Exception:  # noqa: BLE001 - a dtype numpy cannot view through DLPack
        out = tvm.runtime.tensor(np.ascontiguousarray(value))
    return out


def _as_numpy(tensor) -> np.ndarray:
    """A read-only numpy view of a constant (no copy: the weights of a model are tens of MB); a copy when the
    dtype has no DLPack view in numpy."""
    try:
        view = np.from_dlpack(tensor)
    except Exception:  # noqa: BLE001 - e.g. a dtype numpy cannot view
        return tensor.numpy()
    view.flags.writeable = False
    return view


def _matches(ty, value: np.ndarray) -> bool:
    return isinstance(ty, relax.TensorType) and ty.shape is not None \
        and tuple(int(d) for d in ty.shape.values) == value.shape and str(ty.dtype) == str(value.dtype)


def fold_constant_copies(mod: tvm.IRModule) -> tvm.IRModule:
    """Replace every ``call_tir`` of a copy PrimFunc on constants by its numpy-computed constant."""
    folder = _FoldCopies(mod)
    changed = False
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            before = folder.folded
            new = folder.visit_expr(func)
            if folder.folded != before:
                folder.builder_.update_func(gv, new)
                changed = True
    return folder.builder_.get() if changed else mod


class FoldConstantCopies(PyPass):
    def pass_name(self) -> str:
        return "AscendFoldConstantCopies"

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        return fold_constant_copies(mod)
