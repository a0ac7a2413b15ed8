"""What a kernel is: the recognisers the schedule rules decide on (dlight's analysis layer).

Read-only facts about blocks and functions: which blocks reduce, which are GEMM-like products, what a GEMM,
a conv2d or a pooling block looks like (``match_gemm``, ``match_conv2d``, ``match_pool``), the kernel's
reduction kinds read off the function without a schedule (``reduction_kinds``: the rules' cheap
pre-checks), and the row norm that may sit in front of a kernel's products. Rules import these and the
shared building blocks (``common``, ``contraction``, ``partial_sums``, ``injective``, ``conv_schedule``);
no rule imports another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir, sym, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from .common import root_blocks

LOAD = tvm.ir.expr.TensorLoad


# ---- block facts -------------------------------------------------------------------------------------------
def strip_cast(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


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


def accumulating_store(stmt):
    """The ``C[...] = C[...] + ...`` store of a reduction block with an init, else None (GEMM/conv matchers)."""
    body = stmt.body
    if stmt.init is None or not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return None
    return body


def uses_var(expr, var) -> bool:
    """Does ``var`` occur in ``expr``?"""
    found = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: found.append(v) if v.same_as(var) else None))
    return bool(found)


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


def is_product_block(stmt) -> bool:
    """A GEMM-like reduction block: two operands indexed by the reduction var, each carrying a spatial var the
    other lacks (A[i, k] * B[k, j]). Those belong to the matmul/attention rules, not to row reductions."""
    rvars = {iv.var.name for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    if not rvars:
        return False
    svars = {iv.var.name for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    used = []
    for region in stmt.reads:
        names = set()
        for r in region.region:
            names |= {v.name for v in collect_vars_used_in_prim_expr(r.min)}
        if names & rvars:
            used.append(names & svars)
    return any(a - b and b - a for a in used for b in used)


def reduction_kinds(func: tirx.PrimFunc) -> str:
    """The kernel's reduction blocks in program order, read off the function without building a schedule:
    ``P`` a product block (``is_product_block``), ``R`` any other reduction. The rules' cheap pre-checks
    (how many products, what follows the last one, a softmax between two) are string tests on it."""
    kinds = []

    def visit(block):
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
            kinds.append("P" if is_product_block(block) else "R")

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit), order="pre")
    return "".join(kinds)


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
def _plain_vars(indices, iters) -> list | None:
    """Iterator of each index, or None when an index is not a bare block iterator."""
    out = []
    for idx in indices:
        hit = [v for v in iters if isinstance(idx, tirx.Var) and idx.same_as(v)]
        if not hit:
            return None
        out.append(hit[0])
    return out


@dataclass
class GemmBlock:
    """Where each GEMM role sits: iterator positions (= loop positions of the block) and buffers."""

    block: object
    a_buf: object
    b_buf: object
    c_buf: object
    a_read: int                  # index of A in block.reads
    b_read: int
    batch: list = field(default_factory=list)
    m: list = field(default_factory=list)   # outer M iterators first, the tiled one last
    n: int = -1
    k: int = -1
    b_n_axis: int = -1           # axis of B's buffer indexed by the N iterator
    b_k_axis: int = -1


def match_gemm(sch: s_tir.Schedule, block) -> GemmBlock | None:
    """GemmBlock for a C += A*B block with trivially bound loops, else None."""
    stmt = sch.get(block)
    body = accumulating_store(stmt)
    if body is None:
        return None
    iters = [iv.var for iv in stmt.iter_vars]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if len(sch.get_loops(block)) != len(iters):
        return None
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return None
    for lp, val in zip(loops, realize.iter_values):
        if not (isinstance(val, tirx.Var) and val.same_as(sch.get(lp).loop_var)):
            return None
    val = body.value
    for acc, prod in ((val.a, val.b), (val.b, val.a)):
        acc, prod = strip_cast(acc), strip_cast(prod)
        if not (isinstance(acc, LOAD) and acc.source.same_as(body.buffer)):
            continue
        if not isinstance(prod, tirx.Mul):
            continue
        x, y = strip_cast(prod.a), strip_cast(prod.b)
        if not (isinstance(x, LOAD) and isinstance(y, LOAD)):
            continue
        cv, xv, yv = (_plain_vars(e.indices, iters) for e in (body, x, y))
        if cv is None or xv is None or yv is None or not all(a.same_as(b) for a, b in zip(cv, acc.indices)):
            continue
        return _classify(stmt, iters, kinds, cv, (x, xv), (y, yv))
    return None


def _classify(stmt, iters, kinds, cv, xa, ya):
    ids = lambda vs: {id(v) for v in vs}  # noqa: E731
    c_set = ids(cv)
    batch, m_x, m_y, k = [], [], [], []
    (x, xv), (y, yv) = xa, ya
    x_set, y_set = ids(xv), ids(yv)
    if len(set(map(id, xv))) != len(xv) or len(set(map(id, yv))) != len(yv):
        return None                                      # diagonal accesses are not a GEMM
    for pos, (v, kind) in enumerate(zip(iters, kinds)):
        key = (id(v) in c_set, id(v) in x_set, id(v) in y_set)
        if kind == tirx.IterVar.CommReduce and key == (False, True, True):
            k.append(pos)
        elif kind == tirx.IterVar.DataPar and key == (True, True, True):
            batch.append(pos)
        elif kind == tirx.IterVar.DataPar and key == (True, True, False):
            m_x.append(pos)
        elif kind == tirx.IterVar.DataPar and key == (True, False, True):
            m_y.append(pos)
        else:
            return None
    if len(k) != 1 or not m_x or not m_y:
        return None
    # B is the operand with a single free axis (the weight); A may carry several (batch x seq).
    if len(m_y) == 1:
        (a, _, m), (b, bv, n) = (x, xv, m_x), (y, yv, m_y[0])
    elif len(m_x) == 1:
        (a, _, m), (b, bv, n) = (y, yv, m_y), (x, xv, m_x[0])
    else:
        return None
    if sorted(m) != list(range(min(m), min(m) + len(m))):
        return None                                      # outer M iterators must be adjacent loops
    reads = [r.source for r in stmt.reads]
    a_read = next((i for i, r in enumerate(reads) if r.same_as(a.source)), None)
    b_read = next((i for i, r in enumerate(reads) if r.same_as(b.source)), None)
    if a_read is None or b_read is None or a.source.same_as(b.source):
        return None
    b_n_axis = next(i for i, v in enumerate(bv) if v.same_as(iters[n]))
    b_k_axis = next(i for i, v in enumerate(bv) if v.same_as(iters[k[0]]))
    return GemmBlock(None, a.source, b.source, stmt.writes[0].source, a_read, b_read, batch, m, n, k[0],
                     b_n_axis, b_k_axis)


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
    body = accumulating_store(stmt)
    if body is None:
        return None
    iters = [iv.var for iv in stmt.iter_vars]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if len(iters) != 7 or [k == tirx.IterVar.DataPar for k in kinds] != [True] * 4 + [False] * 3:
        return None
    loops = sch.get_loops(block)
    if len(loops) != 7:
        return None
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize) or not all(
            isinstance(v, tirx.Var) and v.same_as(sch.get(lp).loop_var) for lp, v in zip(loops, realize.iter_values)):
        return None
    return stmt, body, iters


def match_conv2d(sch: s_tir.Schedule, block) -> ConvBlock | None:
    head = _conv_block_head(sch, block)
    if head is None:
        return None
    stmt, body, iters = head
    n, f, y, x, rc, ry, rx = iters
    same = lambda idx, vs: len(idx) == len(vs) and all(isinstance(i, tirx.Var) and i.same_as(v)
                                                      for i, v in zip(idx, vs))
    if not same(body.indices, [n, f, y, x]):
        return None
    val = body.value
    for acc, prod in ((val.a, val.b), (val.b, val.a)):
        acc, prod = strip_cast(acc), strip_cast(prod)
        if not (isinstance(acc, LOAD) and acc.source.same_as(body.buffer) and isinstance(prod, tirx.Mul)):
            continue
        ops = [strip_cast(prod.a), strip_cast(prod.b)]
        if not all(isinstance(o, LOAD) for o in ops):
            continue
        w = next((o for o in ops if same(o.indices, [f, rc, ry, rx])), None)
        d = next((o for o in ops if o is not w), None)
        if w is None or d is None or len(d.indices) != 4:
            continue
        if not (same(d.indices[:2], [n, rc])):
            continue
        reads = [r.source for r in stmt.reads]
        di = next((i for i, r in enumerate(reads) if r.same_as(d.source)), None)
        wi = next((i for i, r in enumerate(reads) if r.same_as(w.source)), None)
        if di is None or wi is None:
            continue
        return ConvBlock(block, di, wi, w.source, str(body.buffer.ty.dtype))
    return None


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


def _static(dim) -> int | None:
    return int(dim) if isinstance(dim, tirx.IntImm) else None


def _window(index, out_var, red_var) -> tuple[int, int] | None:
    """(stride, dilation) when ``index`` is ``out_var * stride + red_var * dilation`` (plus a constant)."""
    coef = sym.detect_linear_equation(index, [out_var, red_var])
    if len(coef) != 3 or not all(isinstance(c, tirx.IntImm) for c in coef):
        return None
    stride, dilation = int(coef[0]), int(coef[1])
    return (stride, dilation) if stride > 0 and dilation > 0 else None


def match_grouped_conv2d(sch: s_tir.Schedule, block) -> GroupedConvBlock | None:
    """GroupedConvBlock for ``C[n, f, y, x] += D[n, f // OCg * ICg + rc, y*s + ry*d, x*s + rx*d] *
    W[f, rc, ry, rx]`` (casts allowed) with groups > 1, static channel counts and trivially bound loops;
    None for anything else, a plain conv2d (groups == 1) included. Cheap: reads the block only."""
    head = _conv_block_head(sch, block)
    if head is None:
        return None
    stmt, body, iters = head
    n, f, y, x, rc, ry, rx = iters
    same = lambda idx, vs: len(idx) == len(vs) and all(isinstance(i, tirx.Var) and i.same_as(v)  # noqa: E731
                                                      for i, v in zip(idx, vs))
    if not same(body.indices, [n, f, y, x]):
        return None
    val = body.value
    for acc, prod in ((val.a, val.b), (val.b, val.a)):
        acc, prod = strip_cast(acc), strip_cast(prod)
        if not (isinstance(acc, LOAD) and acc.source.same_as(body.buffer) and isinstance(prod, tirx.Mul)):
            continue
        ops = [strip_cast(prod.a), strip_cast(prod.b)]
        if not all(isinstance(o, LOAD) for o in ops):
            continue
        w = next((o for o in ops if same(o.indices, [f, rc, ry, rx])), None)
        d = next((o for o in ops if o is not w), None)
        if w is None or d is None or len(d.indices) != 4 or not same(d.indices[:1], [n]):
            continue
        info = _grouping(stmt, d, w, (f, rc), iters)
        if info is None:
            continue
        groups, icg, ocg, kernel = info
        hw = [_window(d.indices[2], y, ry), _window(d.indices[3], x, rx)]
        if None in hw:
            continue
        reads = [r.source for r in stmt.reads]
        di = next((i for i, r in enumerate(reads) if r.same_as(d.source)), None)
        wi = next((i for i, r in enumerate(reads) if r.same_as(w.source)), None)
        if di is None or wi is None:
            continue
        return GroupedConvBlock(block, di, wi, w.source, str(body.buffer.ty.dtype), groups, icg, ocg, kernel,
                                (hw[0][0], hw[1][0]), (hw[0][1], hw[1][1]))
    return None


def _grouping(stmt, data, weight, fr, iters):
    """(groups, in/out channels per group, (KH, KW)) when the data's channel index is the grouped one."""
    f, rc = fr
    extents = {v.name: _static(iv.dom.extent) for v, iv in zip(iters, stmt.iter_vars)}
    oc, icg = extents[f.name], extents[rc.name]
    w_shape = [_static(d) for d in weight.source.ty.shape]
    in_channels = _static(data.source.ty.shape[1])
    if None in (oc, icg, in_channels) or None in w_shape or icg < 1 or in_channels % icg:
        return None
    groups = in_channels // icg
    if groups <= 1 or oc % groups or w_shape[0] != oc or w_shape[1] != icg:
        return None
    ocg = oc // groups
    ana = sym.Analyzer()
    ana.bind(f, tvm.ir.Range(0, oc))
    ana.bind(rc, tvm.ir.Range(0, icg))
    dt = str(f.ty.dtype)
    expected = tirx.floordiv(f, tirx.const(ocg, dt)) * tirx.const(icg, dt) + rc
    if not ana.can_prove_equal(data.indices[1], expected):
        return None
    return groups, icg, ocg, (w_shape[2], w_shape[3])


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


def _combiner(store) -> tirx.PrimExpr | None:
    """The value combined into ``P[...]`` by ``P = max(P, v)`` / ``min`` / ``P + v``, else None."""
    val = store.value
    if not isinstance(val, (tirx.Max, tirx.Min, tirx.Add)):
        return None
    for acc, other in ((val.a, val.b), (val.b, val.a)):
        if isinstance(acc, LOAD) and acc.source.same_as(store.buffer) and all(
                i.same_as(j) for i, j in zip(acc.indices, store.indices)):
            return other
    return None


def match_pool(sch: s_tir.Schedule, block) -> PoolBlock | None:
    stmt = sch.get(block)
    body = stmt.body
    if stmt.init is None or not isinstance(body, tirx.BufferStore) or len(body.indices) != 4:
        return None
    spatial = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) != 4 or len(reduce) != 2 or len(stmt.iter_vars) != 6:
        return None
    if not all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(body.indices, spatial)):
        return None
    load = _combiner(body)
    load = strip_cast(load) if load is not None else None
    if not isinstance(load, LOAD) or len(load.indices) != 4 or len(stmt.reads) != 1:
        return None
    n, c = spatial[:2]
    if not (load.indices[0].same_as(n) and load.indices[1].same_as(c)):
        return None
    # one reduction iterator moves along H, the other along W (a window or the whole plane); a reduction
    # over one axis only (a row: LayerNorm-like) is the reduction rule's
    h, w = load.indices[2], load.indices[3]
    rh, rw = reduce
    if not (uses_var(h, rh.var) and uses_var(w, rw.var) and not uses_var(h, rw.var) and not uses_var(w, rh.var)):
        return None
    shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in load.source.ty.shape]
    if None in shape:
        return None
    if not isinstance(rh.dom.extent, tirx.IntImm):
        return None
    return PoolBlock(block, load.source, shape[2], shape[3], int(rh.dom.extent))


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
