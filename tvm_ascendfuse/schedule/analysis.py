"""What a kernel is: the recognisers the schedule rules decide on (dlight's analysis layer).

Read-only facts about blocks and functions: which blocks reduce, which are GEMM-like products, what a GEMM,
a conv2d or a pooling block looks like (``match_gemm``, ``match_conv2d``, ``match_pool``), the kernel's
reduction kinds read off the function without a schedule (``reduction_kinds``: the rules' cheap
pre-checks), and the row norm that may sit in front of a kernel's products. The block-level recognisers
themselves live in ``tvm_ascendfuse/kinds.py``, below the grouping pass, which names each op with them (the
rule table of ``rule_specs.py``); the matchers here add what a schedule needs (loops bound one-to-one to the
block's iterators, the block handle). Rules import these and the
shared building blocks (``common``, ``contraction``, ``partial_sums``, ``injective``, ``conv_schedule``);
no rule imports another.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

# the block-level recognisers live below the grouping pass, which names each op with them (``kinds.py``);
# rules import them from here
from ..kinds import (LOAD, GemmBlock, accumulating_store, conv2d_roles, conv_block_head, gemm_roles,  # noqa: F401
                     grouped_conv2d_roles, is_product_block, pool_window, reduction_kinds, strip_cast, uses_var)
from .common import root_blocks


# ---- block facts -------------------------------------------------------------------------------------------
def has_reduce(sch: s_tir.Schedule, block) -> bool:
    """Does the block have a reduction (or other non-data-parallel) iterator?"""
    return any(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(block).iter_vars)


def block_name(sch: s_tir.Schedule, block) -> str:
    return sch.get(block).name_hint


def closure(sch: s_tir.Schedule, start, step) -> set:
    """Names of the blocks reachable from ``start`` through ``step`` (get_producers / get_consumers)."""
    seen, stack = set(), [start]
    while stack:
        for b in step(stack.pop()):
            n = block_name(sch, b)
            if n not in seen:
                seen.add(n)
                stack.append(b)
    return seen


def is_cheap(sch, block) -> bool:
    """A stage worth recomputing in each consumer: plain arithmetic, no calls or let-bound polynomials."""
    found = []
    tvm_ffi.structural_walk(sch.get(block).body,
                            ((tvm.ir.expr.Call, tirx.Let), lambda e: found.append(e)))
    return not found


def is_copy(sch, block) -> bool:
    """A pure layout stage (transpose / reshape / slice): its value is one load of another buffer."""
    body = sch.get(block).body
    value = body.value if isinstance(body, tirx.BufferStore) else None
    return isinstance(strip_cast(value), LOAD)


def float32_only(func: tirx.PrimFunc) -> bool:
    """Every buffer parameter is float32 (the register blocks and the UB row budgets assume 4 B)."""
    return all(str(p.ty.dtype) == "float32" for p in func.params if isinstance(p.ty, tirx.BufferType))


def reduces_row(sch, block) -> bool:
    """A row reduction over the last axis: one reduction variable, indexing only the last axis of every
    buffer it reads, under a loop of its own that is the block's innermost."""
    stmt = sch.get(block)
    reds = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reds) != 1 or stmt.iter_vars[-1].iter_type != tirx.IterVar.CommReduce:
        return False
    for region in stmt.reads:
        uses = [reds[0].name in {v.name for v in collect_vars_used_in_prim_expr(r.min)} for r in region.region]
        if any(uses[:-1]) or (any(uses) and not uses[-1]):
            return False
    return True


# ---- products and reductions -------------------------------------------------------------------------------
def leading_spatial(kind: str) -> int:
    """Leading ``S`` iterators of a block's dom kind (``"SSR"`` -> 2): its row axes."""
    return len(kind) - len(kind.lstrip("S"))


def is_contraction(sch: s_tir.Schedule, block) -> bool:
    """``is_product_block`` for a block of a schedule."""
    return is_product_block(sch.get(block))


def reduction_between_products(func: tirx.PrimFunc) -> bool:
    """Whether some non-product reduction block (the softmax) lies between two product blocks, in program
    order; a cheap necessary condition for the rule, read off the unscheduled function."""
    order = reduction_kinds(func)
    first, last = order.find("P"), order.rfind("P")
    return first >= 0 and "R" in order[first:last]


# ---- GEMM --------------------------------------------------------------------------------------------------
def match_gemm(sch: s_tir.Schedule, block) -> GemmBlock | None:
    """GemmBlock for a C += A*B block with trivially bound loops (``kinds.gemm_roles``), else None."""
    stmt = sch.get(block)
    if accumulating_store(stmt) is None:
        return None
    loops = sch.get_loops(block)
    if len(loops) != len(stmt.iter_vars):
        return None
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return None
    for lp, val in zip(loops, realize.iter_values):
        if not (isinstance(val, tirx.Var) and val.same_as(sch.get(lp).loop_var)):
            return None
    return gemm_roles(stmt)


def find_gemm(sch: s_tir.Schedule):
    """(blocks, index of the GEMM block, GemmBlock) when the function is one GEMM plus injective epilogue."""
    blocks = list(root_blocks(sch))
    reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
    if not reductions:
        return None
    gi = reductions[-1]
    info = match_gemm(sch, blocks[gi])
    if info is None:
        return None
    info.block = blocks[gi]
    return blocks, gi, info


def last_reduction_is_product(func: tirx.PrimFunc) -> bool:
    """``find_gemm``'s first requirement read off the function without building a schedule: the last
    reduction block is GEMM-like (a norm or softmax after the GEMM belongs to another rule)."""
    return reduction_kinds(func).endswith("P")


# ---- conv2d ------------------------------------------------------------------------------------------------
@dataclass
class ConvBlock:
    block: object
    data_read: int        # index of the data operand in block.reads
    weight_read: int
    weight_buf: object
    out_dtype: str


def _conv_block_head(sch: s_tir.Schedule, block):
    """(block, its accumulating store, its 7 iter vars) for a block of 4 spatial then 3 reduction iterators
    bound one-to-one to its 7 loops (the shape every conv2d recogniser starts from), else None."""
    stmt = sch.get(block)
    head = conv_block_head(stmt)
    if head is None:
        return None
    body, iters = head
    loops = sch.get_loops(block)
    if len(loops) != 7:
        return None
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize) or not all(
            isinstance(v, tirx.Var) and v.same_as(sch.get(lp).loop_var) for lp, v in zip(loops, realize.iter_values)):
        return None
    return stmt, body, iters


def match_conv2d(sch: s_tir.Schedule, block) -> ConvBlock | None:
    """ConvBlock for an NCHW conv2d block with groups = 1 (``kinds.conv2d_roles``) and trivially bound loops."""
    head = _conv_block_head(sch, block)
    if head is None:
        return None
    roles = conv2d_roles(head[0])
    return ConvBlock(block, *roles) if roles is not None else None


# ---- grouped and depthwise conv2d --------------------------------------------------------------------------
@dataclass
class GroupedConvBlock(ConvBlock):
    """A conv2d with ``groups`` > 1: output channel f reads input channels
    ``f // out_per_group * in_per_group + rc``, rc < in_per_group (TVM's ``group_conv2d_nchw``; depthwise
    is in_per_group == out_per_group == 1). A ConvBlock, so the conv2d schedule can take a grouped conv whose
    register block stays inside one group."""

    groups: int = 1
    in_per_group: int = 1
    out_per_group: int = 1
    kernel: tuple = (1, 1)      # KH, KW
    stride: tuple = (1, 1)      # along H, W
    dilation: tuple = (1, 1)

    @property
    def depthwise(self) -> bool:
        return self.in_per_group == 1 and self.out_per_group == 1


def match_grouped_conv2d(sch: s_tir.Schedule, block) -> GroupedConvBlock | None:
    """GroupedConvBlock for ``C[n, f, y, x] += D[n, f // OCg * ICg + rc, y*s + ry*d, x*s + rx*d] *
    W[f, rc, ry, rx]`` (casts allowed) with groups > 1, static channel counts and trivially bound loops
    (``kinds.grouped_conv2d_roles``); None for anything else, a plain conv2d (groups == 1) included. Cheap:
    reads the block only."""
    head = _conv_block_head(sch, block)
    if head is None:
        return None
    r = grouped_conv2d_roles(head[0])
    if r is None:
        return None
    return GroupedConvBlock(block, r.data_read, r.weight_read, r.weight_buf, r.out_dtype, r.groups,
                            r.in_per_group, r.out_per_group, r.kernel, r.stride, r.dilation)


def match_depthwise_conv2d(sch: s_tir.Schedule, block) -> GroupedConvBlock | None:
    """``match_grouped_conv2d`` for a depthwise conv: one input channel per output channel (groups ==
    channels, no channel multiplier); None for anything else."""
    info = match_grouped_conv2d(sch, block)
    return info if info is not None and info.depthwise else None


# ---- pooling -----------------------------------------------------------------------------------------------
@dataclass
class PoolBlock:
    block: object
    source: object        # the buffer the window is read from
    rows_in: int          # rows of ``source`` per channel
    cols_in: int
    kernel_rows: int      # extent of the reduction iterator on H (the window height, or the plane height)


def match_pool(sch: s_tir.Schedule, block) -> PoolBlock | None:
    """PoolBlock for a window reduction over the H, W planes of an NCHW tensor (``kinds.pool_window``)."""
    found = pool_window(sch.get(block))
    return PoolBlock(block, *found) if found is not None else None


# ---- a row norm in front of products -----------------------------------------------------------------------
def match_norm_prologue(sch, by_name, pro, first):
    """The row norm in front of the first product(s): ``{"stage": blocks from its reductions to the
    normalised rows, "out": the block the products read}`` (``out`` None without a norm); None when the
    prologue has reductions of another shape (not over the row's last axis, or read elsewhere)."""
    reds = [n for n in pro if has_reduce(sch, by_name[n])]
    if not reds:
        return {"stage": [], "out": None}
    stage = set(reds)
    for n in reds:
        stage |= closure(sch, by_name[n], sch.get_consumers) & set(pro)
    feeding = {n for n in stage if set(first) & {block_name(sch, c) for c in sch.get_consumers(by_name[n])}}
    if len(feeding) != 1 or any(not reduces_row(sch, by_name[n]) for n in reds):
        return None
    out = feeding.pop()
    for n in stage:                 # the normalised rows feed the first product(s) and nothing else
        users = {block_name(sch, c) for c in sch.get_consumers(by_name[n])}
        if not users <= stage | set(first) or (n != out and users & set(first)):
            return None
    if not set(first) <= {block_name(sch, c) for c in sch.get_consumers(by_name[out])}:
        return None
    return {"stage": [n for n in pro if n in stage], "out": out}
