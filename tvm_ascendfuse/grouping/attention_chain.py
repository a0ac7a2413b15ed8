"""Attention and its output projection in one kernel: softmax(Q·Kᵀ)·V, heads merged, then ·Wo (+ residual).

The attention kernel writes its head-merged output (rows x heads·D) to GM and the projection reads it back.
Computed per block of query rows, the projection's reduction axis (heads·D) is walked one head at a time:
that head's attention rows (scores and probabilities in UB, Q/K/V panels through L1 to the cube) are the
panel of the intermediate, multiplied into the block's output rows, which accumulate in L0C across the heads.
The attention output then never reaches GM. It is a chained GEMM whose first "product" is a whole attention
head, so it reuses ``Chain`` (cost, report and the weight-streaming policy treat it the same way; its weight,
Wo, is streamed once per row block).

Taken when: the attention is one pattern group (its two products share a lock) whose only output is the
head-merged rows; the projection reads them as its row operand (``A[i, k]``, ``k`` = head·D + d) and is the
only reader; the rest of the group follows the projection (bias, residual, at most a row norm) and the group
has one output; float32, static shapes; score rows of whole 8-lane vectors and query rows of whole 8-row
register tiles (else the fused kernel ran slower than the attention and the projection apart: ViT's 197).
A fourth product may come first: the query projection (+ bias), feeding Q·Kᵀ's row operand alone through its
head split, with at most a row norm in front (recomputed per row block); a key/value projection cannot be
(every query block reads all keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tiling import QUERY_ROW_TILE, SCORE_ROW_VECTOR, CapacityCheck, attention_row_block, score_rows_vectorise
from .chain import Chain, _norm_prologue, _static, reachable

INJECTIVE, REDUCE, OUT_EWISE = 2, 3, 4


@dataclass(frozen=True)
class AttentionChain(Chain):
    """A ``Chain`` whose first products are one attention's Q·Kᵀ and P·V (``k1`` = head_dim, ``n1`` = heads·D)."""

    heads: int = 1
    head_dim: int = 1
    keys: int = 1              # key/value rows (the score rows' length)
    query: int | None = None   # the query projection computed in the kernel (``prologue``: its row norm)
    query_k: int = 0           # its reduction length (the input row it reads)
    query_path: frozenset = frozenset()   # the query's epilogue and head split, up to Q·Kᵀ

    def capacity(self, dtype_bytes: int, target) -> CapacityCheck:
        return attention_row_block(self.heads, self.head_dim, self.keys, self.n2, self.rows, target, dtype_bytes,
                                   norm_after=self.norm, query_k=self.query_k, query_norm=self.prologue is not None)

    def saving_vs_weights(self) -> float:
        """The attention output's round trip (and Q's, when the query projection is inside) per byte of the
        weights streamed once per row block (Wo, and Wq)."""
        weights = self.n1 * self.n2 + self.query_k * self.n1
        return (2 if self.query is None else 4) * self.rows * self.n1 / weights

    def describe(self, dtype_bytes: int, target, nodes) -> dict:
        check = self.capacity(dtype_bytes, target)
        out = {"kind": "attention + output projection", "rows_per_block": check.tile_elems,
               "heads": self.heads, "head_dim": self.head_dim, "ub_bytes": check.needed_bytes,
               "ub_available_bytes": check.available_bytes, "ub_holds": check.what}
        if self.query is not None:
            out["query_projection"] = nodes[self.query].name
            if self.prologue is not None:
                out["query_norm"] = nodes[self.prologue].name
        return out


def find_attention_chain(nodes, mset: set, cubes: list, var_node) -> AttentionChain | str | None:
    """The attention + projection formed by these members, a reason they do not form it, or None when they
    are not an attention group and a product at all (other chain shapes are then tried)."""
    if len(cubes) not in (3, 4):
        return None
    locks = [nodes[c].locked for c in cubes]
    lock = next((k for k in locks if k is not None and locks.count(k) == 2), None)
    if lock is None:
        return None
    first = tuple(sorted(c for c in cubes if nodes[c].locked == lock))
    if not any(nodes[m].pattern in (REDUCE, OUT_EWISE) and not nodes[m].cube
               for m in mset if nodes[m].locked == lock):
        return None                          # two products without a softmax between: not attention
    down = reachable(nodes, first, mset, "users")
    rest = [c for c in cubes if c not in first]
    proj = [c for c in rest if c in down]
    query = [c for c in rest if c not in down]
    if len(proj) != 1 or len(query) > 1:
        return None                          # not fed by the attention, or more than one product in front
    c2, query = proj[0], (query[0] if query else None)
    after = reachable(nodes, [c2], mset, "users")
    front = reachable(nodes, [query], mset, "producers") | {query} if query is not None else set()
    att = mset - after - {c2} - front        # the attention, its head-split and head-merge layout ops
    if not any(p in att for p in nodes[c2].producers):
        return None                          # the projection is not fed by the attention
    qk, pv = first if first[1] in reachable(nodes, [first[0]], mset, "users") else first[::-1]
    norm, query_path = None, frozenset()
    if query is not None:
        why, norm, query_path = _query_prologue(nodes, query, front, att, mset, qk, var_node)
        if why:
            return why
    if any(nodes[m].locked != lock and nodes[m].pattern > INJECTIVE for m in att):
        return "attention + projection: compute in front of the projection outside the attention"
    inside = [p for p in nodes[c2].producers if p in mset]
    if len(inside) != 1:
        return "attention + projection: the projection reads more than the attention output in the kernel"
    inter = inside[0]
    pos = [i for i, a in enumerate(nodes[c2].args) if var_node.get(a) == inter]
    if not pos or any(p not in nodes[c2].row_operand for p in pos):
        return "attention + projection: the projection does not reduce over the attention output's last axis"
    for m in att:
        users = set(nodes[m].users)
        if nodes[m].escapes or not users <= att | {c2} or (m != inter and c2 in users):
            return "attention + projection: an attention value is also used outside the kernel"
    if any(nodes[c].out_dtype != 4 for c in (*first, c2)):
        return "attention + projection: only float32 is scheduled as one kernel"
    pv_shape = _static(getattr(nodes[pv].var.ty, "shape", None))
    qk_shape = _static(getattr(nodes[qk].var.ty, "shape", None))
    inter_shape = _static(getattr(nodes[inter].var.ty, "shape", None))
    out_shape = _static(getattr(nodes[c2].var.ty, "shape", None))
    if not pv_shape or not qk_shape or not inter_shape or not out_shape or len(pv_shape) < 3:
        return "attention + projection needs static shapes"
    heads, head_dim, keys = pv_shape[-3], pv_shape[-1], qk_shape[-1]
    n1 = inter_shape[-1]
    if not score_rows_vectorise(keys):
        return (f"attention + projection: {keys} keys are no whole number of {SCORE_ROW_VECTOR}-lane vectors "
                "(the fused kernel's score rows would run scalar; the attention and the projection run faster apart)")
    if inter_shape[-2] % QUERY_ROW_TILE:
        return (f"attention + projection: {inter_shape[-2]} query rows are no whole number of {QUERY_ROW_TILE}-row "
                "register tiles (a short last row block; the attention and the projection run faster apart)")
    if n1 != heads * head_dim:
        return "attention + projection: the attention output's rows are not the heads side by side"
    rows = 1
    for d in inter_shape[:-1]:
        rows *= d
    outs = [m for m in after | {c2} if nodes[m].escapes or any(u not in mset for u in nodes[m].users)]
    if len(outs) > 1:
        # e.g. the residual sum h and norm(h) of a pre-norm block: the kernel writes one row block out
        return "attention + projection: more than one output (the kernel writes one tensor)"
    norm_after = any(nodes[m].pattern in (REDUCE, OUT_EWISE) and not nodes[m].cube for m in after)
    path = frozenset(att - set(first))
    query_k = 0
    if query is not None:
        a_pos = [p for p in nodes[query].row_operand if p < len(nodes[query].args)]
        a_shape = _static(getattr(nodes[query].args[a_pos[0]].ty, "shape", None)) if a_pos else None
        if not a_shape:
            return "attention + projection: the query projection needs a static row operand"
        query_k = a_shape[-1]
    return AttentionChain(first, c2, inter, path, rows, head_dim, n1, out_shape[-1], norm_after, norm,
                          heads=heads, head_dim=head_dim, keys=keys, query=query, query_k=query_k,
                          query_path=query_path)


def _query_prologue(nodes, query, front, att, mset, qk, var_node):
    """(why not, norm node, path): the product in front of the attention must be its query projection —
    through elementwise/layout ops (bias, head split: ``path``) it feeds Q·Kᵀ's row operand and nothing else (a
    K/V projection cannot be computed per block of query rows: every block reads all keys) — and in front of
    it at most a row norm (its row operand, recomputed per row block) and layout ops."""
    no = frozenset()
    if nodes[query].escapes or not set(nodes[query].users) <= att:
        return "attention + projection: the query projection is also used outside the attention", None, no
    reached, stack, seen = set(), [query], set()
    while stack:
        for u in nodes[stack.pop()].users:
            if u in seen:
                continue
            seen.add(u)
            if nodes[u].cube or u not in att or nodes[u].pattern > INJECTIVE:
                reached.add(u)
            else:
                stack.append(u)
    feeds = {i for i, a in enumerate(nodes[qk].args) if var_node.get(a) in seen | {query}}
    if reached != {qk} or not feeds or not feeds <= set(nodes[qk].row_operand):
        return "attention + projection: the product in front is not the attention's query projection", None, no
    path = frozenset(seen - reached)
    if any(set(nodes[u].users) - path - {qk} for u in path):
        return "attention + projection: the query rows are also used outside Q·Kᵀ", None, no
    heavy = [m for m in front - {query} if nodes[m].pattern > INJECTIVE]
    if len(heavy) > 1:
        return "attention + projection: more than a row norm in front of the query projection", None, no
    if heavy:
        why = _norm_prologue(nodes, heavy[0], (query,), mset, "attention + projection")
        if why:
            return why, None, no
        return None, heavy[0], path
    return None, None, path

