"""GM traffic and FLOPs counted on the TIR of each kernel, and per-model totals.

What "counted GM bytes" means here: for every parameter buffer of a PrimFunc (a tensor in global memory),
the number of *distinct* elements the kernel reads (or writes) times the element size. An NPU that streams
every tile from HBM once pays exactly that; re-reads of the same element inside a kernel are served from
UB and are not counted. The distinct count of one access is, per dimension, the smaller of the index range
and the product of the extents of the loop/block variables in the index (exact for affine separable indices,
e.g. strided slices and convolution windows); several accesses to one buffer are deduplicated by region and
capped by both their bounding box and the buffer size. ``naive_bytes`` is the plain access count (every
load/store once per iteration), for comparison.

The walk works on unscheduled (SBlock) TIR and on scheduled TIR: block iteration variables are bounded by
their domains, loop variables by their loop ranges. Symbolic dimensions are replaced by an upper bound
(``tir_var_upper_bound`` attribute of the Relax function, or ``ASSUMED_SYMBOLIC_DIM``).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field
from math import prod

import tvm
from tvm import relax, tirx
from tvm.s_tir import stmt as sstmt
from tvm.ir import expr as iexpr
from tvm.ir.prim import expr as pexpr

from ..cost import modeled_time_us
from ..ir import dtype_bytes, is_call_tir

# Symbolic dimension without a declared upper bound: assumed this large (documented in the report).
ASSUMED_SYMBOLIC_DIM = 128

_ARITH = (pexpr.Add, pexpr.Sub, pexpr.Mul, pexpr.Div, pexpr.Mod, pexpr.FloorDiv, pexpr.FloorMod, pexpr.Min,
          pexpr.Max)
_NO_FLOP_CALLS = {"tirx.if_then_else", "tirx.likely", "tirx.reinterpret", "tirx.ret", "tirx.bitwise_and",
                  "if_then_else", "likely"}


@dataclass
class KernelTraffic:
    """What one PrimFunc moves and computes. Byte lists are indexed by parameter position."""

    name: str
    read_bytes: list[int]
    write_bytes: list[int]
    naive_bytes: int
    vector_flops: float
    cube_flops: float            # useful multiply-accumulate FLOPs on the cube unit
    cube_flops_padded: float     # same, with M, N, K padded to the cube fractal
    reduce_row_elems: int = 0    # longest non-cube reduction row (elements)
    dtype_bytes: int = 4
    assumptions: list[str] = field(default_factory=list)

    @property
    def gm_bytes(self) -> int:
        return sum(self.read_bytes) + sum(self.write_bytes)

    @property
    def flops(self) -> float:
        return self.vector_flops + self.cube_flops


# ---- expression helpers ----------------------------------------------------------------------------------
def _children(e):
    if isinstance(e, (pexpr.BinaryOpExpr, pexpr.CmpExpr)) or isinstance(e, (pexpr.And, pexpr.Or)):
        return [e.a, e.b]
    if isinstance(e, iexpr.TensorLoad):
        return [*e.indices]
    if isinstance(e, pexpr.Select):
        return [e.condition, e.true_value, e.false_value]
    if isinstance(e, (pexpr.Cast, pexpr.Broadcast)):
        return [e.value]
    if isinstance(e, pexpr.Not):
        return [e.a]
    if isinstance(e, pexpr.Ramp):
        return [e.base, e.stride]
    if isinstance(e, pexpr.Let):
        return [e.value, e.body]
    if isinstance(e, iexpr.Call):
        return [a for a in e.args if isinstance(a, iexpr.Expr)]
    return []


def _walk(e, fn):
    stack = [e]
    while stack:
        x = stack.pop()
        if fn(x) is False:
            continue
        stack.extend(_children(x))


def _vars_in(e) -> list:
    out = []
    _walk(e, lambda x: out.append(x) if isinstance(x, iexpr.Var) and not isinstance(x, iexpr.TensorLoad) else None)
    return out


def _loads_in(e) -> list:
    out = []
    _walk(e, lambda x: out.append(x) if isinstance(x, iexpr.TensorLoad) else None)
    return out


def _flops_in(e) -> int:
    """Arithmetic operations of a stored value (index arithmetic inside loads is not counted)."""
    n = 0
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, iexpr.TensorLoad):
            continue
        if isinstance(x, _ARITH):
            n += 1
        elif isinstance(x, iexpr.Call):
            op = getattr(x.op, "name", "")
            if op not in _NO_FLOP_CALLS and not op.endswith("if_then_else"):
                n += 1
        stack.extend(_children(x))
    return n


def _int(v, ana) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, pexpr.IntImm):
        return int(v.value)
    s = ana.simplify(v)
    if isinstance(s, pexpr.IntImm):
        return int(s.value)
    b = ana.const_int_bound(s)
    return int(b.max_value)


# ---- the walk ----------------------------------------------------------------------------------------------
class _Counter:
    def __init__(self, func, sym_bounds: dict[str, int]):
        self.ana = tvm.sym.Analyzer()
        self._sym_ub = {}
        self.func = func
        self.assumptions: list[str] = []
        self.params = [p for p in func.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
        self.index = {p: i for i, p in enumerate(self.params)}
        self._bind_symbols(sym_bounds)
        self.shapes = [[_int(d, self.ana) for d in p.ty.shape] for p in self.params]
        self.extent: dict = {}                       # var -> number of values it takes
        self.reads = [dict() for _ in self.params]   # region key -> elements
        self.writes = [dict() for _ in self.params]
        self.hull_r = [None] * len(self.params)
        self.hull_w = [None] * len(self.params)
        self.naive = 0
        self.vector_flops = 0.0
        self.cube_flops = 0.0
        self.cube_padded = 0.0
        self.reduce_row = 0
        self.cube_frac = 16

    def _bind_symbols(self, bounds):
        self._sym_ub: dict = {}
        for p in self.params:
            for d in p.ty.shape:
                for v in _vars_in(d):
                    if v in self._sym_ub:
                        continue
                    ub = bounds.get(v.name)
                    if ub is None:
                        ub = ASSUMED_SYMBOLIC_DIM
                        self.assumptions.append(f"symbolic dim {v.name} assumed {ub} (no upper bound declared)")
                    self.ana.bind(v, tvm.ir.Range.from_min_extent(0, int(ub) + 1), allow_override=True)
                    self._sym_ub[v] = int(ub)

    def _bind(self, var, lo, extent):
        self.ana.bind(var, tvm.ir.Range.from_min_extent(lo, extent), allow_override=True)
        self.extent[var] = max(1, _int(extent, self.ana))

    def _region(self, buf_idx, indices):
        shape = self.shapes[buf_idx]
        key, lows, highs = [], [], []
        for d, idx in enumerate(indices):
            dim = shape[d] if d < len(shape) else 1
            b = self.ana.const_int_bound(idx)
            lo = max(0, int(b.min_value))
            hi = min(dim - 1, int(b.max_value))
            if hi < lo:
                lo, hi = 0, dim - 1
            span = hi - lo + 1
            vs = {v for v in _vars_in(idx)}
            ext = prod(self.extent.get(v, self._sym_ub.get(v, dim)) for v in vs)
            key.append((lo, hi, min(span, ext)))
            lows.append(lo)
            highs.append(hi)
        return tuple(key)

    def _note(self, table, hulls, buf_idx, key):
        table[buf_idx][key] = prod(k[2] for k in key) if key else 1
        h = hulls[buf_idx]
        if h is None:
            hulls[buf_idx] = [(k[0], k[1]) for k in key]
        else:
            hulls[buf_idx] = [(min(a[0], k[0]), max(a[1], k[1])) for a, k in zip(h, key)]

    def _access(self, buf, indices, is_write, iters):
        i = self.index.get(buf)
        if i is None:
            return
        self.naive += iters * dtype_bytes(buf.ty.dtype)
        key = self._region(i, indices)
        if is_write:
            self._note(self.writes, self.hull_w, i, key)
        else:
            self._note(self.reads, self.hull_r, i, key)

    def _store(self, st, iters, block=None, is_init=False):
        for ld in _loads_in(st.value):
            for idx in ld.indices:
                for inner in _loads_in(idx):     # indirect indexing (gather): count the index buffer too
                    self._access(inner.source, inner.indices, False, iters)
            self._access(ld.source, ld.indices, False, iters)
        self._access(st.buffer, st.indices, True, iters)
        if is_init:
            return
        n = _flops_in(st.value)
        if block is not None and self._is_mac(st, block):
            self.cube_flops += 2.0 * iters
            self.cube_padded += 2.0 * self._padded_iters(st, block)
            n = max(0, n - 2)
        self.vector_flops += float(n) * iters

    def _is_mac(self, st, block) -> bool:
        if not any(int(iv.iter_type) == 2 for iv in block.iter_vars):
            return False
        v = st.value
        if not isinstance(v, pexpr.Add):
            return False
        for self_side, other in ((v.a, v.b), (v.b, v.a)):
            if isinstance(self_side, iexpr.TensorLoad) and self_side.source.same_as(st.buffer):
                m = other.value if isinstance(other, pexpr.Cast) else other
                if isinstance(m, pexpr.Mul):
                    a = m.a.value if isinstance(m.a, pexpr.Cast) else m.a
                    b = m.b.value if isinstance(m.b, pexpr.Cast) else m.b
                    if isinstance(a, iexpr.TensorLoad) and isinstance(b, iexpr.TensorLoad) \
                            and not a.source.same_as(b.source):
                        return True
        return False

    def _padded_iters(self, st, block) -> float:
        """M, N, K of a multiply-accumulate block, each padded to the cube fractal."""
        m = st.value.b if isinstance(st.value.a, iexpr.TensorLoad) and st.value.a.source.same_as(st.buffer) \
            else st.value.a
        m = m.value if isinstance(m, pexpr.Cast) else m
        a = m.a.value if isinstance(m.a, pexpr.Cast) else m.a
        b = m.b.value if isinstance(m.b, pexpr.Cast) else m.b
        va = {v for idx in a.indices for v in _vars_in(idx)}
        vb = {v for idx in b.indices for v in _vars_in(idx)}
        f = self.cube_frac
        pad = lambda n: -(-n // f) * f
        M = N = K = B = 1
        for iv in block.iter_vars:
            ext = self.extent.get(iv.var, 1)
            if int(iv.iter_type) == 2:
                K *= ext
            elif iv.var in va and iv.var not in vb:
                M *= ext
            elif iv.var in vb and iv.var not in va:
                N *= ext
            else:
                B *= ext
        return float(B * pad(M) * pad(N) * pad(K))

    def visit(self, s, iters: int):
        if s is None:
            return
        if isinstance(s, tirx.stmt.SeqStmt):
            for c in s.seq:
                self.visit(c, iters)
        elif isinstance(s, tirx.stmt.For):
            self._bind(s.loop_var, s.min, s.extent)
            self.visit(s.body, iters * self.extent[s.loop_var])
        elif isinstance(s, sstmt.SBlockRealize):
            blk = s.block
            for iv in blk.iter_vars:
                self._bind(iv.var, iv.dom.min, iv.dom.extent)
            red = [self.extent[iv.var] for iv in blk.iter_vars if int(iv.iter_type) == 2]
            if blk.init is not None:
                self._visit_block_body(blk.init, iters, blk, True)
            self._visit_block_body(blk.body, iters, blk, False)
            if red and not self._block_is_mac(blk):
                self.reduce_row = max(self.reduce_row, prod(red))
        elif isinstance(s, sstmt.SBlock):
            self._visit_block_body(s.body, iters, s, False)
        elif isinstance(s, tirx.stmt.BufferStore):
            self._store(s, iters)
        elif isinstance(s, tirx.stmt.IfThenElse):
            self.visit(s.then_case, iters)
            self.visit(getattr(s, "else_case", None), iters)
        elif isinstance(s, tirx.stmt.Bind):
            try:
                b = self.ana.const_int_bound(s.value)
                if b.min_value > -(1 << 62) and b.max_value < (1 << 62):
                    self._bind(s.var, int(b.min_value), int(b.max_value - b.min_value + 1))
            except Exception:   # non-integer binding: nothing to bound
                pass
        else:
            body = getattr(s, "body", None)
            if isinstance(body, tirx.stmt.Stmt):
                self.visit(body, iters)

    def _block_is_mac(self, blk) -> bool:
        body = blk.body
        return isinstance(body, tirx.stmt.BufferStore) and self._is_mac(body, blk)

    def _visit_block_body(self, body, iters, blk, is_init):
        if isinstance(body, tirx.stmt.BufferStore):
            self._store(body, iters, blk, is_init)
        elif isinstance(body, tirx.stmt.SeqStmt):
            for c in body.seq:
                self._visit_block_body(c, iters, blk, is_init)
        else:
            self.visit(body, iters)

    def _total(self, table, hulls, i) -> int:
        if not table[i]:
            return 0
        size = prod(self.shapes[i]) if self.shapes[i] else 1
        hull = prod(h[1] - h[0] + 1 for h in hulls[i]) if hulls[i] else 1
        return min(size, hull, sum(table[i].values())) * dtype_bytes(self.params[i].ty.dtype)

    def result(self, name) -> KernelTraffic:
        n = len(self.params)
        writes = [self._total(self.writes, self.hull_w, i) for i in range(n)]
        # A kernel that reads its own output reads its accumulator (L0C/UB), not GM.
        reads = [0 if writes[i] else self._total(self.reads, self.hull_r, i) for i in range(n)]
        dt = max((dtype_bytes(p.ty.dtype) for p in self.params), default=4)
        return KernelTraffic(
            name=name,
            read_bytes=reads, write_bytes=writes,
            naive_bytes=int(self.naive), vector_flops=self.vector_flops, cube_flops=self.cube_flops,
            cube_flops_padded=self.cube_padded, reduce_row_elems=int(self.reduce_row), dtype_bytes=dt,
            assumptions=list(self.assumptions))


def count_primfunc(func: tirx.PrimFunc, name: str = "", sym_bounds: dict[str, int] | None = None) -> KernelTraffic:
    """Count GM bytes per parameter and FLOPs of one PrimFunc (see the module docstring)."""
    c = _Counter(func, dict(sym_bounds or {}))
    c.visit(func.body, 1)
    return c.result(name)


# ---- per-model accounting -----------------------------------------------------------------------------------
def symbolic_bounds(func) -> dict[str, int]:
    """Upper bounds declared with the ``tir_var_upper_bound`` function attribute."""
    if func.attrs is None or "tir_var_upper_bound" not in func.attrs:
        return {}
    return {str(k): int(v) for k, v in func.attrs["tir_var_upper_bound"].items()}


def _tensor_bytes(ty, bounds) -> int:
    if isinstance(ty, relax.TupleType) if hasattr(relax, "TupleType") else False:
        return sum(_tensor_bytes(f, bounds) for f in ty.fields)
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return sum(_tensor_bytes(f, bounds) for f in fields)
    shape = getattr(ty, "shape", None)
    dtype = getattr(ty, "dtype", None)
    if shape is None or dtype is None:
        return 0
    n = 1
    for d in shape:
        if isinstance(d, pexpr.IntImm):
            n *= int(d.value)
        else:
            vs = _vars_in(d)
            n *= int(bounds.get(vs[0].name, ASSUMED_SYMBOLIC_DIM)) if vs else ASSUMED_SYMBOLIC_DIM
    return n * dtype_bytes(dtype)


def kernel_call_sites(mod: tvm.IRModule):
    """(entry function, call_tir) for each call_tir in the non-Primitive Relax functions."""
    out = []
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and not (func.attrs and "Primitive" in func.attrs):
            found = []
            relax.analysis.post_order_visit(
                func.body, lambda e: found.append(e) if is_call_tir(e) else None)
            out += [(func, c) for c in found]
    return out


def kernel_calls(mod: tvm.IRModule):
    """(entry function, PrimFunc GlobalVar) for each call_tir in the non-Primitive Relax functions."""
    return [(func, call.args[0]) for func, call in kernel_call_sites(mod)]


def _in_storage(k: KernelTraffic, params, widths) -> KernelTraffic:
    """``k`` with each parameter's bytes counted at ``widths[i]`` bytes per element instead of its dtype's."""
    scale = [w / dtype_bytes(p.ty.dtype) for w, p in zip(widths, params)]
    return dataclasses.replace(k, read_bytes=[int(b * f) for b, f in zip(k.read_bytes, scale)],
                               write_bytes=[int(b * f) for b, f in zip(k.write_bytes, scale)],
                               dtype_bytes=max(widths, default=k.dtype_bytes))


def traffic_summary(mod: tvm.IRModule, target, element_bytes=None) -> dict:
    """Launches, counted GM bytes, FLOPs and modeled NPU time of every call_tir a module makes.

    ``mod`` is a module after FuseTIR (or after LegalizeOps, for the unfused view). ``element_bytes``:
    (function, call, argument index, dtype) -> bytes per element in GM, where a precision plan stores tensors
    in other dtypes than the kernels compute in (``precision/gm_dtypes.py``); default the dtypes' own."""
    from ..target import get_target

    target = get_target(target)
    cache: dict[str, KernelTraffic] = {}
    launches, gm, naive, vf, cf, t_us = 0, 0, 0, 0.0, 0.0, 0.0
    assumptions: set[str] = set()
    per_kernel: dict[str, dict] = {}
    for func, call in kernel_call_sites(mod):
        gv = call.args[0]
        name = gv.name_hint
        if name not in cache:
            cache[name] = count_primfunc(mod[gv], name, symbolic_bounds(func))
        k = cache[name]
        if element_bytes is not None:
            params = mod[gv].params
            k = _in_storage(k, params, [element_bytes(func, call, i, str(p.ty.dtype)) for i, p in enumerate(params)])
        launches += 1
        gm += k.gm_bytes
        naive += k.naive_bytes
        vf += k.vector_flops
        cf += k.cube_flops
        kt = modeled_time_us(k.gm_bytes, k.vector_flops, k.cube_flops_padded, target, k.dtype_bytes)
        t_us += kt
        assumptions.update(k.assumptions)
        row = per_kernel.setdefault(name, {"launches": 0, "gm_bytes": k.gm_bytes, "flops": k.flops,
                                           "modeled_time_us": round(kt, 3)})
        row["launches"] += 1
    return {"launches": launches, "gm_bytes": int(gm), "naive_access_bytes": int(naive),
            "vector_flops": vf, "cube_flops": cf, "modeled_time_us": round(t_us, 3),
            "kernels": per_kernel, "assumptions": sorted(assumptions)}


def _constant_bytes(func: relax.Function, bounds) -> int:
    """Bytes of the constants a call must read: whole, except a table only gathered from (a token
    embedding), of which only the gathered rows are read (a decode step reads one row of 50257).
    Constants are keyed by object (FFI handles hash by the node; Python ids of wrappers do not)."""
    consts, gathered, other = set(), {}, set()

    def visit(e):
        if isinstance(e, tvm.ir.GenericConst):
            consts.add(e)
        elif isinstance(e, relax.Call) and not (isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.shape_of"):
            for i, arg in enumerate(e.args):      # (shape_of reads no data)
                if not isinstance(arg, tvm.ir.GenericConst):
                    continue
                if i == 0 and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.take":
                    gathered[arg] = gathered.get(arg, 0) + _tensor_bytes(e.ty, bounds)
                else:
                    other.add(arg)
    relax.analysis.post_order_visit(func.body, visit)
    return sum(gathered[c] if c in gathered and c not in other else _tensor_bytes(c.ty, bounds) for c in consts)


def lower_bound(mod: tvm.IRModule, target) -> dict:
    """Compulsory traffic: model inputs, weights (constants) and outputs moved once (of a table only
    gathered from, the rows gathered); no launch limit.

    Launches = 1 (everything in one kernel) and the time is the roofline of those bytes and the FLOPs of
    the unfused model, so it bounds any grouping from below (modeled)."""
    from ..target import get_target

    target = get_target(target)
    total = 0
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or (func.attrs and "Primitive" in func.attrs):
            continue
        if func.attrs is not None and "global_symbol" not in func.attrs and len(mod.functions) > 1 \
                and gv.name_hint != "main":
            continue
        bounds = symbolic_bounds(func)
        total += sum(_tensor_bytes(p.ty, bounds) for p in func.params)
        total += _tensor_bytes(func.body.body.ty if hasattr(func.body, "body") else func.ret_ty, bounds)
        total += _constant_bytes(func, bounds)
    return {"launches": 1, "gm_bytes": int(total),
            "modeled_time_us": round(modeled_time_us(total, 0.0, 0.0, target), 3)}
