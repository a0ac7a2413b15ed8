"""MatMulSiblingMergeFusionPass: matmuls of one input with constant weights become one wider matmul.

Rewrites (attention's Q/K/V projections)::

    q = matmul(x, Wq) [+ bq];  k = matmul(x, Wk) [+ bk];  v = matmul(x, Wv) [+ bv]
        ->  qkv = matmul(x, concat(Wq, Wk, Wv, axis=-1)) [+ concat(bq, bk, bv)]
            q = strided_slice(qkv, last axis, 0:Nq);  k = ...[Nq:Nq+Nk];  v = ...[Nq+Nk:]

Why: each sibling kernel reads ``x`` from GM again (3x for Q/K/V), and a norm in front of them has to write
its output to GM because it has three consumers. After the merge ``x`` is read once, and a norm feeding ``x``
has one consumer, so it can become the prologue of the merged GEMM. Exact: every output element is the same
dot product over the same K values (a sibling without a bias gets zeros, ``y + 0 == y``).

An attention's query projection (the sibling feeding the left operand of a product whose result is
softmaxed) is left out of the merge when the attention and its output projection are fused
(``AttentionProjectionFusionPass``, with ``ChainedGemmFusionPass``: ``query_apart``): that kernel then also
computes the query rows (+ bias), per block of query rows and head, from the input it reads anyway for the
residual, or from its own copy of the norm when the shared input is a row norm's output (LLaMA). Q never goes
to GM; K and V are merged as before (every query block reads all of them).
Not when the score rows are a key count the grouping keeps apart from the projection
(``tiling.score_rows_vectorise``): the query would only cost one more launch and a second norm.

Weights must be 2-D constants (also a reshape/transpose chain over one) with the same K and dtype, biases
constants varying only along the output-feature axis. Refused (recorded, left alone): siblings whose results
are combined elementwise later (SwiGLU's ``silu(x·Wg) * (x·Wu)``): the multi-GEMM kernel already reads ``x``
once for them, and a slice in between would only split that kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from ..report import CHECK_FAILED
from ..switches import MATMUL_SIBLING_MERGE as NAME
from ..tiling import score_rows_vectorise
from ..fusion_pass import FusionPass
from ._graph import FunctionGraph, static_dims, make_const, op_name, static_shape


# Unary elementwise ops looked through when checking whether two siblings are combined later.
_UNARY = ("relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.relu", "relax.sigmoid",
          "relax.tanh", "relax.astype")


# Ops between a projection and the attention product that reads it (head split), and between that product
# and its softmax (scale, mask).
_LAYOUT = ("relax.reshape", "relax.permute_dims", "relax.strided_slice")
_SCORE = ("relax.multiply", "relax.add", "relax.divide", "relax.astype")
_NORMS = ("relax.nn.rms_norm", "relax.nn.layer_norm")


# Binary elementwise ops that combine two sibling results into one (SwiGLU's multiply).
_COMBINE = ("relax.multiply", "relax.add", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum")


@dataclass
class Sibling:
    matmul: relax.Var               # the matmul binding
    root: relax.Var                 # the binding that gets the slice (the bias add, or the matmul itself)
    weight_shape: tuple             # (K, N)
    weight_dtype: str
    bias: np.ndarray | None         # (N,) or None
    n: int = 0
    graph: object = None            # the FunctionGraph that reads the weight when a merge needs its values

    @property
    def weight(self) -> np.ndarray:
        """The (K, N) weight's values, read only for siblings that are merged (a model's weights are most
        of its bytes; most matmuls have no sibling)."""
        return self.graph.const(self.graph.value(self.matmul).args[1])


@dataclass
class Merge:
    lhs: relax.Expr
    call: relax.Call                # one sibling's matmul (op and attrs reused)
    parts: list = field(default_factory=list)
    merged: relax.Var | None = None   # set when emitted

    @property
    def offsets(self) -> list[int]:
        out, off = [], 0
        for s in self.parts:
            out.append(off)
            off += s.n
        return out


class MatMulSiblingMergeFusionPass(FusionPass):
    """See the module docstring."""

    switch_name = NAME

    def __init__(self, target=None, report=None, enabled: bool = True, query_apart: bool = False):
        """``query_apart``: leave an attention's query projection out of the merge, for the attention kernel to
        compute (the pipeline sets it when that kernel can take the query, see ``pipeline.py``)."""
        super().__init__(target, report, enabled)
        self.query_apart = query_apart

    def transform_function(self, func, mod):
        graph = FunctionGraph.of(func)
        self._apart: dict = {}
        merges = [m for m in self._plan(graph)]
        if not merges:
            return func
        return _Emit(merges, self._apart).visit_expr(func)

    # ---- planning ----------------------------------------------------------------------------------
    def _plan(self, graph: FunctionGraph) -> list[Merge]:
        by_lhs: dict = {}
        for var in graph.order:
            sib = self._sibling(var, graph)
            if sib is not None:
                lhs = graph.value(var).args[0]
                by_lhs.setdefault(lhs, []).append(sib)
        merges = []
        for lhs, sibs in by_lhs.items():
            if len(sibs) < 2:
                continue
            where = "+".join(s.root.name for s in sibs)
            combined = self._combined(sibs, graph)
            if combined:
                self.refuse(CHECK_FAILED, where, failed="sibling products are combined elementwise "
                            f"({', '.join(sorted(s.root.name for s in combined))}): the multi-GEMM kernel "
                            "already reads the shared input once")
                sibs = [s for s in sibs if s not in combined]
                if len(sibs) < 2:
                    continue
                where = "+".join(s.root.name for s in sibs)
            query = self._attention_query(lhs, sibs, graph) if self.query_apart else None
            if query is not None and len(sibs) > 2:
                sibs = [s for s in sibs if s is not query]
                normed = op_name(graph.value(lhs)) in _NORMS
                self._apart[query.matmul] = graph.value(lhs) if normed else None
                where = "+".join(s.root.name for s in sibs)
            problem = self._compatible(sibs, graph)
            if problem is not None:
                self.refuse(CHECK_FAILED, where, failed=problem)
                continue
            detail = {"siblings": len(sibs), "n": [s.n for s in sibs],
                      "bias": sum(s.bias is not None for s in sibs)}
            if query is not None and query.matmul in self._apart:
                detail["query_apart"] = query.root.name
            if self.take(where, **detail):
                merges.append(Merge(lhs, graph.value(sibs[0].matmul), sibs))
        return merges

    @staticmethod
    def _sibling(var, graph: FunctionGraph) -> Sibling | None:
        """``var = matmul(x, W_const)`` with a 2-D weight, and its single constant bias add if it has one."""
        mm = graph.value(var)
        if op_name(mm) != "relax.matmul" or not isinstance(mm.args[0], relax.Var):
            return None
        w = graph.const_shape(mm.args[1])
        out = static_shape(var)
        lhs_dims = static_dims(mm.args[0])
        if w is None or len(w[0]) != 2 or out is None or not lhs_dims or lhs_dims[-1] is None:
            return None
        if len(lhs_dims) < 2 or out[-1] != w[0][1]:
            return None
        sib = Sibling(var, var, w[0], w[1], None, int(w[0][1]), graph)
        users = graph.users.get(var, [])
        if len(users) == 1 and users[0] is not None:
            add = graph.value(users[0])
            if op_name(add) == "relax.add":
                other = add.args[1] if add.args[0].same_as(var) else add.args[0]
                b = graph.const(other) if not other.same_as(var) else None
                if (b is not None and b.size == sib.n and b.ndim <= len(out) and b.shape[-1] == sib.n
                        and static_shape(users[0]) == out):
                    sib.root, sib.bias = users[0], b.reshape(-1)
        return sib

    @staticmethod
    def _attention_query(lhs, sibs: list[Sibling], graph: FunctionGraph) -> Sibling | None:
        """The sibling that is an attention's query (see the module docstring), when ``lhs`` is a row norm's
        output read only by the siblings; else None."""
        if op_name(graph.value(lhs)) in _NORMS and len(graph.users.get(lhs, [])) != len(sibs):
            return None          # a norm read elsewhere too: its copy would not be the query's own

        def layout_reach(var) -> set:
            seen, stack = {var}, [var]
            while stack:
                for u in graph.users.get(stack.pop(), []):
                    if u is not None and u not in seen and op_name(graph.value(u)) in _LAYOUT:
                        seen.add(u)
                        stack.append(u)
            return seen

        reach = {id(s): layout_reach(s.root) for s in sibs}
        for s in sibs:
            for u in {u for v in reach[id(s)] for u in graph.users.get(v, []) if u is not None}:
                call = graph.value(u)
                if op_name(call) != "relax.matmul" or not any(call.args[0].same_as(v) for v in reach[id(s)]):
                    continue
                keys = [t for t in sibs if t is not s and any(call.args[1].same_as(v) for v in reach[id(t)])]
                if keys and _softmaxed(u, graph):
                    scores = static_dims(u)
                    if scores and scores[-1] is not None and not score_rows_vectorise(scores[-1]):
                        return None      # the grouping keeps this attention and its projection apart
                    return s
        return None

    @staticmethod
    def _combined(sibs: list[Sibling], graph: FunctionGraph) -> list[Sibling]:
        """Siblings whose results (directly or through one unary elementwise op) meet in one binding."""
        reach: dict = {}
        for s in sibs:
            frontier = set()
            for u in graph.users.get(s.root, []):
                if u is None:
                    continue
                frontier.add(u)
                if op_name(graph.value(u)) in _UNARY:
                    frontier.update(x for x in graph.users.get(u, []) if x is not None)
            for u in frontier:
                reach.setdefault(u, []).append(s)
        out = []
        for user, group in reach.items():
            if len(group) > 1 and op_name(graph.value(user)) in _COMBINE:
                out += [s for s in group if s not in out]
        return out

    @staticmethod
    def _compatible(sibs: list[Sibling], graph: FunctionGraph) -> str | None:
        ks = {s.weight_shape[0] for s in sibs}
        if len(ks) != 1:
            return f"weights have different K {sorted(ks)}"
        wdt = {s.weight_dtype for s in sibs}
        if len(wdt) != 1:
            return f"weights have different dtypes {sorted(wdt)}"
        if wdt & {"int8", "uint8"}:
            # each int8 GEMM's dequantizing epilogue (zero-point correction, scale, bias) fuses into its own
            # int8 kernel; after a merge it would sit behind the slices, where only the consumer (an
            # attention, which then takes it as a compute prologue off its fast rule) could take it
            return "int8 weights: each GEMM keeps its dequantizing epilogue"
        odt = {str(s.root.ty.dtype) for s in sibs}
        if len(odt) != 1:
            return f"outputs have different dtypes {sorted(odt)}"
        attrs = {str(graph.value(s.matmul).attrs.out_dtype) for s in sibs}
        if len(attrs) != 1:
            return f"matmuls have different out_dtype {sorted(attrs)}"
        shapes = {tuple(static_shape(s.root)[:-1]) for s in sibs}
        if len(shapes) != 1:
            return "outputs differ outside the feature axis"
        return None


def _softmaxed(var, graph: FunctionGraph) -> bool:
    """Does ``var`` (a product) reach a softmax through scale/mask ops only?"""
    stack, seen = [var], set()
    while stack:
        for u in graph.users.get(stack.pop(), []):
            if u is None or u in seen:
                continue
            seen.add(u)
            name = op_name(graph.value(u))
            if name == "relax.nn.softmax":
                return True
            if name in _SCORE:
                stack.append(u)
    return False


@relax.expr_functor.mutator
class _Emit(relax.PyExprMutator):
    """At the first sibling root: the merged matmul (+ bias); every sibling root becomes its slice. A query
    left apart reads its own copy of the norm."""

    def __init__(self, merges: list[Merge], apart: dict | None = None):
        super().__init__()
        self.part_of = {}
        self.apart = apart or {}
        for m in merges:
            for off, s in zip(m.offsets, m.parts):
                self.part_of[s.root] = (m, off, s)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        norm = self.apart.get(binding.var)
        if norm is not None:              # the query reads its own copy of the norm
            # a new Call object: one bound twice would make the two bindings indistinguishable to the matcher
            copy = self.builder_.emit(relax.Call(norm.op, [self.visit_expr(a) for a in norm.args], norm.attrs),
                                      name_hint="query_norm")
            call = binding.value
            value = relax.Call(call.op, [copy, self.visit_expr(call.args[1])], call.attrs)
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))
            return
        hit = self.part_of.get(binding.var)
        if hit is None:
            super().visit_var_binding_(binding)
            return
        m, off, s = hit
        if m.merged is None:
            m.merged = self._emit_merged(m)
        axis = len(binding.var.ty.shape) - 1
        value = relax.op.strided_slice(m.merged, axes=[axis], begin=[off], end=[off + s.n])
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _emit_merged(self, m: Merge) -> relax.Var:
        w = np.concatenate([s.weight for s in m.parts], axis=1)
        lhs = self.visit_expr(m.lhs)
        merged = self.builder_.emit(relax.Call(m.call.op, [lhs, make_const(w, str(w.dtype))], m.call.attrs),
                                    name_hint="sibling_mm")
        if any(s.bias is not None for s in m.parts):
            dtype = str(m.parts[0].root.ty.dtype)
            b = np.concatenate([s.bias if s.bias is not None else np.zeros(s.n) for s in m.parts])
            merged = self.builder_.emit(relax.op.add(merged, make_const(b.astype("float64"), dtype)),
                                        name_hint="sibling_bias")
        return merged
