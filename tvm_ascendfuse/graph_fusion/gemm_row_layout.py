"""GemmRowLayoutFusionPass: reshapes and transposes of a GEMM's rows move off the GEMM.

A GEMM with a 2-D weight, ``y = x·W (+ b)``, treats every row of ``x`` alike; arranging the rows
differently before it or after it gives the same result. Exporters arrange them in three ways the
kernels do not expect:

* flattened and restored: ``reshape(x, (B·S, K))`` → GEMM → ``reshape(., (B, S, N))`` (GPT-2's ``Conv1D``,
  i.e. ``addmm`` on a view, and every ONNX ``Gemm`` on a 3-D activation). Rewritten as one batched GEMM
  on ``x``: the kernel between the two products of an FFN is then elementwise, so the chained FFN can form;
* transposed in front: ``transpose(x, [1, 0, 2])`` → in-projection (``nn.MultiheadAttention``, seq-first).
  When the GEMM's output is only reshaped further (head split), the transpose moves behind the GEMM, where
  ``LayoutChainFusionPass`` merges it with the head split;
* transposed behind: out-projection → ``reshape``/``transpose`` back to batch-first, the GEMM's input a
  layout op (head merge). The arrangement moves in front of the GEMM, where it merges with the head merge.

Rows are followed as index maps (``_layout``): a chain qualifies when it keeps the last axis whole and in
order, and the moved arrangement is emitted in canonical form for the other side's width. Exact: every output
row is the same dot products of the same input row; a bias (broadcast along the last axis only) is added to
every row alike.
"""

from __future__ import annotations

from tvm import relax

from ..switches import GEMM_ROW_LAYOUT as NAME
from ._graph import GraphRewritePass, Rewrite, op_name, static_shape
from ._layout import chain_to, index_map, is_layout, row_map, rows_layout


def _bias(graph, e, mm):
    """The bias of ``add(mm, b)`` when it varies along the last axis only, else None."""
    add = graph.value(e)
    other = add.args[1] if add.args[0].same_as(mm) else add.args[0]
    shape, out = static_shape(other), static_shape(mm)
    if shape is None or out is None or not shape or shape[-1] != out[-1] or any(d != 1 for d in shape[:-1]):
        return None
    return other


class GemmRowLayoutFusionPass(GraphRewritePass):
    """See the module docstring."""

    switch_name = NAME

    def match(self, var, graph):
        mm = graph.value(var)
        if op_name(mm) != "relax.matmul":
            return None
        a, w = mm.args
        a_shape, w_shape, out_shape = static_shape(a), static_shape(w), static_shape(var)
        if a_shape is None or w_shape is None or out_shape is None or len(w_shape) != 2 or len(a_shape) < 2:
            return None
        k, n = w_shape
        # the GEMM's row-wise epilogue: one bias add
        end, bias = var, None
        users = graph.users.get(var, [])
        if len(users) == 1 and users[0] is not None and op_name(graph.value(users[0])) == "relax.add":
            b = _bias(graph, users[0], var)
            if b is not None and static_shape(users[0]) == out_shape:
                end, bias = users[0], b
        # the arrangement in front: a row-only layout chain of single-use ops
        src_in, ops_in = chain_to(graph, a, stop=lambda v: not graph.single_use(v))
        rin = None
        if ops_in:
            m = index_map(graph, src_in, ops_in)
            rin = row_map(m, k) if m is not None else None
        # the arrangement behind: the longest row-only prefix of single-use layout ops after the epilogue
        ops_out, rout, cur, m_out = [], None, end, None
        while graph.single_use(cur) and len(ops_out) < 8:
            nxt = graph.users[cur][0]
            if nxt is None or not is_layout(graph, nxt):
                break
            chain = ops_out + [nxt]
            m = index_map(graph, end, chain)
            r = row_map(m, n) if m is not None else None
            if r is None:
                break
            ops_out, rout = chain, r
            cur = nxt
        detail = {}
        if rin is not None and rout is not None:
            rows = rin.reshape(-1)[rout]
            src_rows = static_shape(src_in)[:-1]
            lhs = rows_layout(src_rows, rows, k)
            if lhs is None:
                return None
            root, new_lhs = ops_out[-1], lhs.emit(src_in)
            internal = set(ops_in) | {var} | ({end} if end is not var else set()) | set(ops_out[:-1])
            detail = {"form": "flattened and restored"}
        elif rin is not None and not ops_out and users and all(
                u is not None and is_layout(graph, u) for u in graph.users.get(end, [])):
            # push the arrangement behind the GEMM, where the head split's chain takes it
            src_rows = static_shape(src_in)[:-1]
            after = rows_layout(src_rows, rin, n)
            if after is None:
                return None
            new = self._gemm(mm, src_in, w, bias)
            return Rewrite(end, after.emit(new), set(ops_in) | ({var} if end is not var else set()),
                           {"form": "moved behind the GEMM"})
        elif rout is not None and rin is None and is_layout(graph, a):
            lhs = rows_layout(a_shape[:-1], rout, k)
            if lhs is None:
                return None
            root, new_lhs = ops_out[-1], lhs.emit(a)
            internal = {var} | ({end} if end is not var else set()) | set(ops_out[:-1])
            detail = {"form": "moved in front of the GEMM"}
        else:
            return None
        return Rewrite(root, self._gemm(mm, new_lhs, w, bias), internal, detail)

    @staticmethod
    def _gemm(mm, lhs, w, bias):
        out = relax.Call(mm.op, [lhs, w], mm.attrs)
        if bias is None:
            return out
        shape = static_shape(bias)
        if len(shape) > 1:
            bias = relax.op.reshape(bias, [shape[-1]])
        return relax.op.add(out, bias)
