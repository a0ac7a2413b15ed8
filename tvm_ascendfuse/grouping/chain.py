"""Chained GEMMs in one kernel: a product (plus bias and activation, or SwiGLU's gate/up pair) whose result
feeds a second product as its row operand — the FFN's up- and down-projection.

Computed over blocks of ``m`` rows, the intermediate never goes to GM: for each panel of its columns (the
second product's reduction axis) the first product(s) and the activation fill the panel in UB and the second
product accumulates it into the block's output rows, also in UB. The weights are streamed once per row block
(from L2 on the NPU); the traffic count (distinct elements per kernel) and the cost model both count them once.

A row norm (RMSNorm/LayerNorm over the last axis) whose only consumers are the first product(s) may join as
the chain's prologue (pre-norm transformers: ``FFN(norm(h)) + h``): per row block its normalised rows are
computed once (one row at a time in UB) and staged in L1, the cube's operand buffer, where every panel's
first product(s) read them. The normalised tensor is then neither written to GM by the kernel in front nor
read back by the chain, which reads ``h`` anyway for the residual. A norm whose output is also read after
the second product (post-norm: its output is the residual) is not taken.

The structure is kept narrow so the schedule rule (``schedule/chained_gemm.py``) always has the same shape to
work on: one product or a pair (SwiGLU), then one second product alone in its kernel; between them only
elementwise/broadcast ops used by nothing else; the second product reads the intermediate as ``A[.., i, k]``
with ``k`` its reduction axis (the intermediate's last axis); in front of the first product(s) only injective
ops and at most one such row norm; float32; static shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import tirx
from tvm.ir import expr as iexpr
from tvm.s_tir import stmt as sstmt

from ..tiling import PANEL_COLS, CapacityCheck, chain_row_block, chain_rows_per_block, staged_rows_bytes

# On by default. A chain keeps the intermediate out of GM but streams both weights once per row block (from L2
# on the NPU), which the byte model does not charge; GroupingConfig.chain_min_saving_vs_weights (grouping/cost.py)
# therefore keeps only chains whose intermediate round trip is a clear share of their weights: the wide FFN
# intermediates of BERT and LLaMA chain, equal-width MLP layers do not. That is the NPU model's answer. A build
# that runs on a CPU host (GroupingConfig.chain_host_cores > 0) also asks ``Chain.host_cost``: there the
# weights come from DRAM / the shared last-level cache for every row block beyond one per core, and a partial
# last row block makes the rule's micro-kernel predicated. Measured on a 2-core host, chained vs two GEMM
# kernels: 2 row blocks per core 1.05-1.10x slower (BERT, LLaMA FFN), a partial block 2.7x (ViT's 197 rows),
# one block per core at parity.

ELEMWISE, BROADCAST, INJECTIVE, REDUCE, OUT_EWISE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Chain:
    first: tuple          # cube nodes of the first product(s)
    second: int           # the second product
    inter: int            # node whose output the second product reads
    path: frozenset       # nodes from the first products to ``inter`` (the intermediate's epilogue)
    rows: int             # rows of the intermediate
    k1: int               # reduction length of the first product (its input row)
    n1: int               # width of the intermediate (reduction length of the second product)
    n2: int               # width of the second product's output
    norm: bool            # a row reduction (LayerNorm/RMSNorm) follows the second product
    prologue: int | None = None   # a row norm producing the first product(s)' row operand, staged per block
    host: dict | None = None      # ``host_cost`` when the build runs on a CPU host (reported with the chain)

    def saving_vs_weights(self) -> float:
        """GM bytes the chain saves (the intermediate written and read back) per byte of its weights."""
        weights = len(self.first) * self.k1 * self.n1 + self.n1 * self.n2
        return 2 * self.rows * self.n1 / weights if weights else 0.0

    def weight_bytes(self, dtype_bytes: int) -> int:
        return (len(self.first) * self.k1 * self.n1 + self.n1 * self.n2) * dtype_bytes

    def host_cost(self, cores: int, dtype_bytes: int, target) -> dict:
        """Whether the chain beats two GEMM kernels on a CPU host of ``cores`` cores, with the numbers.

        Each row block streams both weights; blocks run ``cores`` at a time, so every block beyond one per
        core streams them once more than the two separate GEMMs do (``restreamed_weight_bytes``), against
        the intermediate's GM round trip the chain saves. A partial last block (no divisor of the rows near
        the capacity's block) is refused outright: its predicate sits in the rule's micro-kernel."""
        check = self.capacity(dtype_bytes, target)
        m = chain_rows_per_block(check.tile_elems, self.rows, self.n2, cores, target, dtype_bytes)
        blocks = -(-self.rows // m)
        restreamed = max(0, blocks - cores) * self.weight_bytes(dtype_bytes)
        saved = 2 * self.rows * self.n1 * dtype_bytes
        partial = self.rows % m != 0
        return {"host_cores": cores, "rows_per_block": m, "row_blocks": blocks, "partial_last_block": partial,
                "restreamed_weight_bytes": restreamed, "saved_intermediate_bytes": saved,
                "chain_on_host": not partial and restreamed <= saved}

    def host_refusal(self) -> str:
        h = self.host
        why = (f"a partial last row block ({self.rows} rows, blocks of {h['rows_per_block']})"
               if h["partial_last_block"] else
               f"{h['restreamed_weight_bytes']} B of weights re-streamed ({h['row_blocks']} row blocks of "
               f"{h['rows_per_block']} rows on {h['host_cores']} cores) > {h['saved_intermediate_bytes']} B "
               f"of intermediate round trip saved")
        return (f"chained GEMM slower than two GEMM kernels on this host: {why}; the NPU model alone would "
                f"chain it (switch ChainedGemmHostCost off)")

    def describe(self, dtype_bytes: int, target, nodes) -> dict:
        """The row block the capacity check settled on, for the grouping report."""
        check = self.capacity(dtype_bytes, target)
        out = {"rows_per_block": check.tile_elems, "ub_bytes": check.needed_bytes,
               "ub_available_bytes": check.available_bytes, "ub_holds": check.what}
        if self.host is not None:
            out["host"] = dict(self.host)
        if self.prologue is not None:
            out.update(norm_prologue=nodes[self.prologue].name,
                       normalised_rows_l1_bytes=staged_rows_bytes(check.tile_elems, self.k1, target, dtype_bytes),
                       l1_available_bytes=target.capacity("local.L1"))
        return out

    def capacity(self, dtype_bytes: int, target) -> CapacityCheck:
        return chain_row_block(self.n1, self.n2, min(self.n1, PANEL_COLS), len(self.first), self.rows, target,
                               dtype_bytes, staged_row=self.k1 if self.prologue is not None else 0,
                               norm_after=self.norm)


def row_operand_positions(prim: tirx.PrimFunc) -> tuple[int, ...]:
    """Parameter positions a contraction of ``prim`` reads as ``A[.., i, k]``: last index the reduction
    variable, the others the leading indices of the output, in order (the row operand of a GEMM)."""
    params = [p for p in prim.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
    index = {id(p): i for i, p in enumerate(params)}
    hits: dict[int, bool] = {}

    def on_block(block):
        reds = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        body = block.body
        if len(reds) != 1 or block.init is None or not isinstance(body, tirx.BufferStore):
            return
        loads = []
        tvm_ffi.structural_walk(body.value, (iexpr.TensorLoad, loads.append))
        for ld in loads:
            pos = next((i for p, i in ((p, index[id(p)]) for p in params) if ld.source.same_as(p)), None)
            if pos is None or not ld.indices:
                continue
            *lead, last = list(ld.indices)
            store_lead = list(body.indices)[:len(lead)]
            good = (isinstance(last, tirx.Var) and last.same_as(reds[0]) and len(body.indices) == len(ld.indices)
                    and all(isinstance(a, tirx.Var) and a.same_as(b) for a, b in zip(lead, store_lead)))
            hits[pos] = hits.get(pos, True) and good

    tvm_ffi.structural_walk(prim.body, (sstmt.SBlock, on_block))
    return tuple(sorted(p for p, good in hits.items() if good))


def _static(shape) -> list[int] | None:
    out = []
    for d in shape or []:
        if not hasattr(d, "value"):
            return None
        out.append(int(d.value))
    return out


def find_chain(nodes, members, var_node) -> Chain | str:
    """The chain formed by ``members`` (which hold cube ops of two or more kernels), or why they do not
    form one. The second product is alone in its kernel; the first is one product or a pair (SwiGLU)."""
    mset = set(members)
    cubes = [m for m in members if nodes[m].cube]
    if len(cubes) > 3:
        return "more than three cube ops in one kernel"
    why = "two cube ops in one kernel"
    for c2 in cubes:
        first = tuple(sorted(c for c in cubes if c != c2))
        if len(first) > 2 or (nodes[c2].locked is not None
                              and any(nodes[f].locked == nodes[c2].locked for f in first)):
            continue
        found = _chain(nodes, mset, first, c2, var_node)
        if isinstance(found, Chain):
            return found
        why = found or why
    return why


def _chain(nodes, mset, first, c2, var_node) -> Chain | str | None:
    """None when ``c2`` does not consume ``first`` at all (wrong orientation), a reason when it does but
    not as a chained GEMM, else the Chain."""
    n2 = nodes[c2]
    inside = [p for p in n2.producers if p in mset]
    if not inside:
        return None
    if any(nodes[c].out_dtype != 4 for c in (*first, c2)):
        return "chained GEMM: only float32 products are scheduled as one kernel"
    if len(inside) != 1:
        return "chained GEMM: the second product has more than one operand computed in the kernel"
    inter = inside[0]
    pos = [i for i, arg in enumerate(n2.args) if var_node.get(arg) == inter]
    if not pos or any(p not in n2.row_operand for p in pos):
        return "chained GEMM: the second product does not reduce over the intermediate's last axis"
    # walk back from the intermediate to the first product(s): elementwise/broadcast ops only
    path, stack, reached = set(), [inter], set()
    while stack:
        m = stack.pop()
        if m in first:
            reached.add(m)
            continue
        if m in path:
            continue
        n = nodes[m]
        if n.cube:
            return None
        if n.pattern > BROADCAST:
            return f"chained GEMM: {n.name} between the products is not elementwise"
        path.add(m)
        stack.extend(p for p in n.producers if p in mset)
    if reached != set(first):
        return None
    for m in path | set(first):
        users = set(nodes[m].users)
        if nodes[m].escapes or not users <= (path | {c2}) or (m != inter and c2 in users):
            return "chained GEMM: the intermediate is also used outside the chain"
    # everything else: an injective prologue of the first product(s), or what follows the second product
    after = reachable(nodes, [c2], mset, "users")
    outs = [m for m in after | {c2} if nodes[m].escapes or not set(nodes[m].users) <= mset]
    if len(outs) > 1:
        # e.g. the residual sum and a channel mean of it (a channels-first LayerNorm2d cut after its first
        # reduction): the rule writes one output, the last op's rows
        return "chained GEMM: more than one output after the second product"
    rest = mset - path - set(first) - {c2} - after
    heavy = [m for m in rest if nodes[m].pattern > INJECTIVE]
    prologue = None
    if heavy:
        if len(heavy) > 1:
            return "chained GEMM: an op outside the chain"
        why = _norm_prologue(nodes, heavy[0], first, mset)
        if why:
            return why
        prologue = heavy[0]
    inter_shape = _static(getattr(nodes[inter].var.ty, "shape", None))
    out_shape = _static(getattr(n2.var.ty, "shape", None))
    a_pos = [p for p in nodes[first[0]].row_operand if p < len(nodes[first[0]].args)]
    a_shape = _static(getattr(nodes[first[0]].args[a_pos[0]].ty, "shape", None)) if a_pos else None
    if not inter_shape or not out_shape or not a_shape:
        return "chained GEMM needs static shapes and a row operand for the first product"
    n1 = inter_shape[-1]
    rows = 1
    for d in inter_shape[:-1]:
        rows *= d
    norm = any(nodes[m].pattern in (REDUCE, OUT_EWISE) and not nodes[m].cube for m in after)
    if prologue is not None and (_static(getattr(nodes[prologue].var.ty, "shape", None)) != a_shape
                                 or nodes[prologue].row != a_shape[-1]):
        return "chained GEMM: the norm in front does not produce whole rows of the first product's operand"
    return Chain(first, c2, inter, frozenset(path), rows, a_shape[-1], n1, out_shape[-1], norm, prologue)


def reachable(nodes, start, mset, step: str) -> set:
    """Members of ``mset`` reachable from the nodes ``start`` along ``users`` or ``producers`` (``start``
    itself only when reached again)."""
    seen, stack = set(), list(start)
    while stack:
        for u in getattr(nodes[stack.pop()], step):
            if u in mset and u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def _norm_prologue(nodes, m, first, mset, kernel: str = "chained GEMM") -> str | None:
    """None when node ``m`` can be the chain's norm prologue: a vector row reduction over the last axis
    (``row_norm``) whose output is read only by the first product(s), as their row operand, and whose own
    producers in the group are layout ops; else why not."""
    n = nodes[m]
    if n.cube or n.pattern not in (REDUCE, OUT_EWISE) or not n.row_norm:
        return f"{kernel}: {n.name or 'an op'} in front of the products is not a row norm over the last axis"
    if n.escapes or not set(n.users) <= set(first):
        return f"{kernel}: the normalised rows are also used outside the first product(s)"
    for f in first:
        pos = [i for i, a in enumerate(nodes[f].args) if a.same_as(n.var)]
        if any(p not in nodes[f].row_operand for p in pos):
            return f"{kernel}: the normalised rows are not the first product's row operand"
    if any(nodes[p].pattern > INJECTIVE for p in n.producers if p in mset):
        return f"{kernel}: compute in front of the norm prologue"
    return None


def reduces_last_axis(prim: tirx.PrimFunc) -> bool:
    """Every reduction of ``prim`` runs over the last axis only, one result per row: each reduction block has
    one reduction variable, which indexes only the last axis of what it reads (a row norm's statistics)."""
    found, good = [], []

    def on_block(block):
        reds = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if not reds:
            return
        found.append(block)
        if len(reds) != 1 or block.init is None or not isinstance(block.body, tirx.BufferStore):
            return
        ok, loads = True, []
        tvm_ffi.structural_walk(block.body.value, (iexpr.TensorLoad, loads.append))
        for ld in loads:
            idx = list(ld.indices)
            uses = [any(v.same_as(reds[0]) for v in _vars(i)) for i in idx]
            if any(uses) and (not uses[-1] or any(uses[:-1])):
                ok = False
        if ok and any(any(v.same_as(reds[0]) for v in _vars(list(ld.indices)[-1])) for ld in loads if ld.indices):
            good.append(block)

    tvm_ffi.structural_walk(prim.body, (sstmt.SBlock, on_block))
    return bool(found) and len(good) == len(found)


def _vars(expr) -> list:
    out = []
    tvm_ffi.structural_walk(expr, (tirx.Var, out.append))
    return out
