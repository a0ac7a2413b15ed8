"""IncreFlashAttentionFusionPass: a decode step's attention over a run-time key count as one flash-decoding kernel.

A decode step built once for every cache length has a symbolic key count, which no attention pattern takes
(they keep whole score rows on chip); written out, its attention is four or five kernels (scores, scale and
mask, softmax, P·V, the reshapes of grouped-query heads between them) and every score goes to GM and back
three times. Here the chain from the Q·Kᵀ product to the P·V product,

    s = matmul(q, permute_dims(k, [0, 1, 3, 2]))          q (B, H, M, D): M query rows, a few
    [s = reshape(s, (B, heads, rows, L))]                  (grouped-query heads stacked as rows, undone)
    x = chain(s)                                           * scale, / scale, + mask, in any order
    p = softmax(x, axis=-1)
    [p = reshape(p, (B, H, M, L))]
    o = matmul(p, v)                                       k, v (B, H, L, D): L symbolic

becomes one call of the flash-decoding kernel (``tvm_ascendfuse/flash_decode.py``: keys in chunks, each
chunk's partial softmax on chip, the chunks merged with rescaling), which ``schedule/flash_decode.py``
schedules. Exact in real arithmetic.

Refused, with the reason: a static key count (the attention patterns take those whole), more than
``MAX_ROWS`` query rows (a prefill over a symbolic cache: the attention rule's blocks of rows are the right
kernel for that), anything but float32 (16-bit models are computed in float32 by the precision phase), a chain
op other than a scalar multiply/divide or a tensor add, a softmax not over the keys.
"""

from __future__ import annotations

import functools

import tvm
from tvm import relax

from ..flash_decode import ScoreSpace, flash_decode
from ..switches import INCRE_FLASH_ATTENTION as NAME
from ._graph import GraphRewritePass, Refusal, Rewrite, int_list, op_name

# Query rows per (batch, KV head) the kernel keeps per chunk: a decode step's grouped heads (GQA 8:1) with a
# few draft tokens; beyond that the rows are a prefill's, whose kernel has blocks of rows.
MAX_ROWS = 16


def _dims(expr) -> list | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _static(dim) -> bool:
    return isinstance(dim, tvm.tirx.IntImm)


def _same(a, b) -> bool:
    return bool(tvm.sym.Analyzer().can_prove_equal(a, b))


class IncreFlashAttentionFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def transform_module(self, mod: tvm.IRModule) -> tvm.IRModule:
        # the kernels are added by a BlockBuilder over the module (call_te), made only once a candidate matches:
        # most models have none, and the pass runs on every build
        self._mod, self._bb = mod, None
        out = super().transform_module(mod)
        if self._bb is None or out.same_as(mod):
            return out
        names = {g.name_hint for g in out.functions}
        added = {gv: f for gv, f in self._bb.get().functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in names}
        out = tvm.IRModule(dict(out.functions), attrs=out.attrs)
        for gv, f in added.items():
            out[gv] = f
        return relax.transform.DeadCodeElimination()(out)     # kernels of candidates a check refused

    def _builder(self) -> relax.BlockBuilder:
        if self._bb is None:
            self._bb = relax.BlockBuilder(self._mod)
        return self._bb

    def match(self, var, graph):
        o = graph.value(var)
        if op_name(o) != "relax.matmul":
            return None
        probs, v = o.args
        internal = set()
        p_var = probs
        back = graph.call(probs, "relax.reshape")
        if back is not None:
            internal.add(probs)
            p_var = back.args[0]
        sm = graph.call(p_var, "relax.nn.softmax")
        if sm is None:
            return None
        internal.add(p_var)
        x = sm.args[0]
        chain, operands = [], []
        while True:                                    # the ops between the product and the softmax
            call = graph.value(x)
            name = op_name(call)
            if name not in ("relax.multiply", "relax.divide", "relax.add"):
                break
            a, b = call.args
            if name == "relax.divide":
                value = graph.scalar(b)
                if value is None:
                    raise Refusal(failed="divided by a tensor", internal=internal)
                chain.append(("divide", value))
                internal.add(x)
                x = a
                continue
            value_b, value_a = graph.scalar(b), graph.scalar(a)
            if name == "relax.multiply" and (value_b is not None or value_a is not None):
                chain.append(("multiply", value_b if value_b is not None else value_a))
                internal.add(x)
                x = a if value_b is not None else b
                continue
            if name == "relax.add":
                # the mask is the operand not produced by the product side: the side that leads on to a matmul
                side, mask = (a, b) if self._leads_to_product(graph, a) else (b, a)
                if not self._leads_to_product(graph, side):
                    break
                chain.append(("add", len(operands)))
                operands.append(mask)
                internal.add(x)
                x = side
                continue
            raise Refusal(failed="multiplied by a tensor", internal=internal)
        scores = x
        fwd = graph.call(scores, "relax.reshape")
        product_var = fwd.args[0] if fwd is not None else scores
        qk = graph.call(product_var, "relax.matmul")
        if qk is None:
            return None
        if fwd is not None:
            internal.add(scores)
        internal.add(product_var)
        q, kt = qk.args
        perm = graph.call(kt, "relax.permute_dims")
        if perm is None or int_list(perm.attrs.axes) != [0, 1, 3, 2]:
            return None
        k = perm.args[0]
        if graph.single_use(kt):
            internal.add(kt)
        qd, kd, vd, xd = _dims(q), _dims(k), _dims(v), _dims(sm.args[0])
        if any(d is None or len(d) != 4 for d in (qd, kd, vd, xd)):
            return None
        if _static(kd[2]):
            return None                                # the attention patterns' case
        axis = int(sm.attrs.axis)
        if axis not in (-1, 3):
            raise Refusal(failed=f"softmax over axis {axis}, not the keys", internal=internal)
        dtype = str(var.ty.dtype)
        if dtype != "float32" or any(str(e.ty.dtype) != "float32" for e in (q, k, v)):
            raise Refusal(failed=f"dtype {dtype}: the kernel computes float32", internal=internal)
        if not all(_static(d) for d in qd):
            raise Refusal(failed="a symbolic batch, head or query-row count", internal=internal)
        rows = int(qd[2])
        if rows > MAX_ROWS:
            raise Refusal(failed=f"{rows} query rows per head (at most {MAX_ROWS}): a prefill's attention",
                          internal=internal, rows=rows)
        if not (_same(kd[2], vd[2]) and _same(qd[3], kd[3]) and all(_same(a, b) for a, b in
                                                                      zip(qd[:2] + kd[:2], kd[:2] + vd[:2]))):
            return None
        space = self._space(qd, xd, fwd is not None, back is not None, probs)
        if space is None:
            raise Refusal(failed="the reshapes around the scores do not stack query heads as rows",
                          internal=internal)
        for mask in operands:
            md = _dims(mask)
            if md is None or len(md) > 4 or str(mask.ty.dtype) != "float32" or \
                    not all((_static(d) and int(d) == 1) or _same(d, s) for d, s in zip(md[::-1], xd[::-1])):
                raise Refusal(failed="a mask that does not broadcast over the scores", internal=internal)
        kernel = functools.partial(flash_decode, chain=tuple(chain[::-1]), space=space)
        value = self._builder().call_te(kernel, q, k, v, *operands, primfunc_name_hint="incre_flash_attention")
        return Rewrite(var, value, internal, {"rows": rows, "heads": int(qd[1]), "chain": [c[0] for c in chain[::-1]],
                                               "stacked_heads": space.group})

    @staticmethod
    def _leads_to_product(graph, expr) -> bool:
        """``expr`` is computed from a matmul through scalar multiplies/divides, adds and a reshape."""
        for _ in range(8):
            call = graph.value(expr)
            name = op_name(call)
            if name == "relax.matmul":
                return True
            if name not in ("relax.multiply", "relax.divide", "relax.add", "relax.reshape"):
                return False
            if name == "relax.add":
                return any(IncreFlashAttentionFusionPass._leads_to_product(graph, a) for a in call.args)
            expr = call.args[0] if graph.value(call.args[0]) is not None else call.args[1]
        return False

    @staticmethod
    def _space(qd, xd, reshaped_fwd: bool, reshaped_back: bool, probs) -> ScoreSpace | None:
        """How the scores the chain and softmax see relate to the stacked product (``ScoreSpace``)."""
        if reshaped_fwd != reshaped_back:
            return None
        if not reshaped_fwd:
            return ScoreSpace()
        batch, kv, m = int(qd[0]), int(qd[1]), int(qd[2])
        if not all(_static(d) for d in xd[:3]) or int(xd[0]) != batch:
            return None
        heads, rows = int(xd[1]), int(xd[2])
        if heads % kv or heads * rows != kv * m:
            return None
        pd = _dims(probs)
        if pd is None or not all(_static(d) for d in pd[:3]) or [int(d) for d in pd[:3]] != [batch, kv, m]:
            return None
        return ScoreSpace(group=heads // kv, rows=rows, stacked=False)
