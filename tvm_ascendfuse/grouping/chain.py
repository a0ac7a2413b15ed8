"""Chained GEMMs in one kernel: a product (plus bias and activation, or SwiGLU's gate/up pair) whose result
feeds a second product as its row operand — the FFN's up- and down-projection.

Computed over blocks of ``m`` rows, the intermediate never goes to GM: for each panel of its columns (the
second product's reduction axis) the first product(s) and the activation fill the panel in UB and the second
product accumulates it into the block's output rows, also in UB. The weights are streamed once per row block
(from L2 on the NPU); the traffic count (distinct elements per kernel) and the cost model both count them once.

The structure is kept narrow so the schedule rule (``schedule/chained_gemm.py``) always has the same shape to
work on: one product or a pair (SwiGLU), then one second product alone in its kernel; between them only
elementwise/broadcast ops used by nothing else; the second product reads the intermediate as ``A[.., i, k]``
with ``k`` its reduction axis (the intermediate's last axis); float32; static shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import tirx
from tvm.ir import expr as iexpr
from tvm.s_tir import stmt as sstmt

from ..switches import UB_FUSION, register_switch
from .capacity import CapacityCheck, row_block_check

# On by default. A chain keeps the intermediate out of GM but streams both weights once per row block (from L2
# on the NPU), which the byte model does not charge; GroupingConfig.chain_min_saving_vs_weights (grouping.py)
# therefore keeps only chains whose intermediate round trip is a clear share of their weights: the wide FFN
# intermediates of W3/W7 chain, equal-width MLP layers (W6) do not. On this CPU host a chain with two row
# blocks per core measured ~1.1x the time of the two separate kernels (W3 FFN), parity at one per core.
CHAINED_GEMM = register_switch(
    "ChainedGemmFusionPass", UB_FUSION,
    "cost-based grouping may chain two GEMMs (FFN up->down projection) in one kernel, per row block",
    default_on=True)

ELEMWISE, BROADCAST, INJECTIVE, REDUCE, OUT_EWISE = 0, 1, 2, 3, 4
PANEL_COLS = 64       # columns of the intermediate computed per step (the second product's K chunk)


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

    def saving_vs_weights(self) -> float:
        """GM bytes the chain saves (the intermediate written and read back) per byte of its weights."""
        weights = len(self.first) * self.k1 * self.n1 + self.n1 * self.n2
        return 2 * self.rows * self.n1 / weights if weights else 0.0

    def capacity(self, dtype_bytes: int, target) -> CapacityCheck:
        return chain_row_block(self.n1, self.n2, min(self.n1, PANEL_COLS), len(self.first), self.rows, target,
                               dtype_bytes)


def chain_row_block(n1: int, n2: int, panel: int, n_first: int, rows: int, target,
                    dtype_bytes: int = 4) -> CapacityCheck:
    """Rows per block of a chained GEMM (``tile_elems``), or the refusal when one row does not fit UB.

    UB holds, per row: the second product's output row (its accumulator, read again by the epilogue and a
    norm) and one panel of the intermediate per first product plus the activated panel. All of it is
    produced and consumed on chip, so none is double-buffered; the input rows and the weights stream to the
    cube through L1/L0A/L0B (``l0_check``)."""
    return row_block_check([n2] + [panel] * (n_first + 1), dtype_bytes, rows, target,
                           f"one row of the chained GEMM's output ({n2}) and a {panel}-column panel of its "
                           f"intermediate ({n1} wide) per product", resident=True)


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
    after, stack = set(), [c2]
    while stack:
        for u in nodes[stack.pop()].users:
            if u in mset and u not in after:
                after.add(u)
                stack.append(u)
    rest = mset - path - set(first) - {c2} - after
    if any(nodes[m].pattern > INJECTIVE for m in rest):
        return "chained GEMM: an op outside the chain"
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
    return Chain(first, c2, inter, frozenset(path), rows, a_shape[-1], n1, out_shape[-1], norm)
