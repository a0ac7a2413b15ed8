"""What one legalized op is, read off its PrimFunc's blocks: the vocabulary in which schedule rules declare
what they take (``rule_specs.py``) and in which the grouping asks which rule a candidate group would get.

Each call_tir the grouping sees launches one legalized op; ``op_kind`` names it with one letter:

* ``C`` conv2d (NCHW/OIHW, groups = 1), ``D`` depthwise conv2d (one input channel per output channel),
  ``Q`` grouped conv2d (two or more output channels per group),
* ``G`` a GEMM (matmul / batched matmul / dense), ``K`` any other product (conv3d, transposed conv, ...),
* ``T`` several products in one op (``nn.attention``), ``F`` the flash-decoding attention kernel a graph pass
  emits (``flash_decode.py``: recognised by its blocks; a kernel of its own that nothing fuses into), ``S`` a
  whole recurrent layer, its step loop inside, that the recurrent converters write (``recurrence_kernel.py``:
  recognised by its tag; a kernel of its own too),
* ``P`` a window reduction over the H, W planes of an NCHW tensor (max/avg pooling), ``M`` the same over
  whole planes into (N, C, 1, 1) (a global pool, the mean of a squeeze-excitation), ``R`` any other
  reduction (norms, softmax, sums, means over other axes, arg-max),
* ``E`` elementwise or broadcast (TVM's op pattern 0/1), ``L`` other injective ops (transpose, reshape,
  concat, slice, pad, gather), ``O`` opaque (no blocks, opaque iterators: never scheduled well).

A fused kernel's *kind string* is the letters of its ops in program order (binding order in the group =
FuseTIR's block order), which is the order the rules read a kernel in. The block-level recognisers the
schedule rules find their roles with live here too (``gemm_roles``, ``conv2d_roles``,
``grouped_conv2d_roles``, ``pool_window``, ``is_product_block``): one definition, used by ``op_kind`` below
the grouping and by ``schedule/analysis.py``'s matchers above it (which add what a schedule needs: the loops
bound one-to-one to the block's iterators, the block handle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir, sym, tirx

from . import flash_decode
from .recurrence_kernel import ATTR as _RECURRENCE_ATTR

LOAD = tvm.ir.expr.TensorLoad

CONV, DEPTHWISE_CONV, GROUPED_CONV, GEMM, PRODUCT, MULTI_PRODUCT, FLASH_DECODE = "C", "D", "Q", "G", "K", "T", "F"
RECURRENCE = "S"
POOL, PLANE_POOL, REDUCTION, ELEMENTWISE, LAYOUT, OPAQUE = "P", "M", "R", "E", "L", "O"
KIND_NAMES = {CONV: "conv2d", DEPTHWISE_CONV: "depthwise conv2d", GROUPED_CONV: "grouped conv2d", GEMM: "GEMM",
              PRODUCT: "other product", MULTI_PRODUCT: "several products", FLASH_DECODE: "flash-decoding attention",
              RECURRENCE: "recurrent layer", POOL: "window pool",
              PLANE_POOL: "whole-plane pool", REDUCTION: "reduction", ELEMENTWISE: "elementwise",
              LAYOUT: "layout (injective)", OPAQUE: "opaque"}

# TVM's op pattern kinds (``op_pattern`` attr of a legalized PrimFunc): at most BROADCAST is elementwise
_BROADCAST = 1


# ---- block facts (no schedule needed) ----------------------------------------------------------------------
def strip_cast(e):
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


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


def _var_names(expr) -> set:
    names = []
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: names.append(v.name)))
    return set(names)


def is_reduction_block(stmt) -> bool:
    """Does the block have a reduction (or other non-data-parallel) iterator?"""
    return any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars)


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
            names |= _var_names(r.min)
        if names & rvars:
            used.append(names & svars)
    return any(a - b and b - a for a in used for b in used)


def func_blocks(func: tirx.PrimFunc) -> list:
    """The function's blocks in program order, the root block excluded."""
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append), order="pre")
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    return [b for b in found if root is None or not b.same_as(root)]


def reduction_kinds(func: tirx.PrimFunc) -> str:
    """The kernel's reduction blocks in program order, read off the function without building a schedule:
    ``P`` a product block (``is_product_block``), ``R`` any other reduction. The rules' cheap pre-checks
    (how many products, what follows the last one, a softmax between two) are string tests on it."""
    return "".join("P" if is_product_block(b) else "R" for b in func_blocks(func) if is_reduction_block(b))


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


def gemm_roles(stmt) -> GemmBlock | None:
    """The GEMM roles of a ``C += A*B`` block whose every index is a bare block iterator (``block`` unset),
    else None. Iterators are classified by which buffers they index (batch: A, B, C; M: A, C; N: B, C;
    K: A, B); B is the operand with a single free axis (the weight)."""
    body = accumulating_store(stmt)
    if body is None:
        return None
    iters = [iv.var for iv in stmt.iter_vars]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
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


# ---- convolutions ------------------------------------------------------------------------------------------
def _same(indices, variables) -> bool:
    return len(indices) == len(variables) and all(isinstance(i, tirx.Var) and i.same_as(v)
                                                  for i, v in zip(indices, variables))


def conv_block_head(stmt):
    """(accumulating store, the 7 iter vars) of a block with 4 spatial then 3 reduction iterators (the shape
    every conv2d recogniser starts from), else None."""
    body = accumulating_store(stmt)
    if body is None:
        return None
    iters = [iv.var for iv in stmt.iter_vars]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if len(iters) != 7 or [k == tirx.IterVar.DataPar for k in kinds] != [True] * 4 + [False] * 3:
        return None
    return body, iters


def _conv_operands(stmt):
    """(store, [(data load, weight load), ...]) of ``C[n, f, y, x] += D[n, ...] * W[f, rc, ry, rx]`` (casts
    allowed, either operand order) with 4 spatial then 3 reduction iterators and a bare output index; None
    when the block does not have that shape."""
    head = conv_block_head(stmt)
    if head is None:
        return None
    body, iters = head
    n, f, y, x, rc, ry, rx = iters
    if not _same(body.indices, [n, f, y, x]):
        return None
    found = []
    val = body.value
    for acc, prod in ((val.a, val.b), (val.b, val.a)):
        acc, prod = strip_cast(acc), strip_cast(prod)
        if not (isinstance(acc, LOAD) and acc.source.same_as(body.buffer) and isinstance(prod, tirx.Mul)):
            continue
        ops = [_unscaled_weight(strip_cast(o), (f, rc, ry, rx), (n, rc)) for o in (prod.a, prod.b)]
        if not all(isinstance(o, LOAD) for o in ops):
            continue
        w = next((o for o in ops if _same(o.indices, [f, rc, ry, rx])), None)
        d = next((o for o in ops if o is not w), None)
        if w is None or d is None or len(d.indices) != 4 or not _same(d.indices[:1], [n]):
            continue
        found.append((d, w))
    return body, found


def _unscaled_weight(op, weight_index, gate_index):
    """The weight load of a weight scaled per input channel, ``W[f, rc, ry, rx] * G[n or 0, rc, 0, 0]`` (an
    SE gate moved from the conv's input onto its weight, ``schedule/gated_weight.py``); ``op`` otherwise."""
    if not isinstance(op, tirx.Mul):
        return op
    for w, g in ((op.a, op.b), (op.b, op.a)):
        if not (isinstance(w, LOAD) and isinstance(g, LOAD) and _same(w.indices, list(weight_index))):
            continue
        if len(g.indices) == 4 and _same(g.indices[1:2], [gate_index[1]]) and (
                _same(g.indices[:1], [gate_index[0]]) or _is_zero(g.indices[0])) \
                and all(_is_zero(i) for i in g.indices[2:]):
            return w
    return op


def _is_zero(e) -> bool:
    return isinstance(e, tirx.IntImm) and int(e) == 0


def _read_positions(stmt, d, w):
    reads = [r.source for r in stmt.reads]
    di = next((i for i, r in enumerate(reads) if r.same_as(d.source)), None)
    wi = next((i for i, r in enumerate(reads) if r.same_as(w.source)), None)
    return di, wi


def conv2d_roles(stmt) -> tuple | None:
    """(data read index, weight read index, weight buffer, output dtype) of an NCHW conv2d block with
    groups = 1 (the data's channel index is the bare reduction iterator), else None."""
    found = _conv_operands(stmt)
    if found is None:
        return None
    body, pairs = found
    rc = stmt.iter_vars[4].var
    for d, w in pairs:
        if not _same(d.indices[1:2], [rc]):
            continue
        di, wi = _read_positions(stmt, d, w)
        if di is None or wi is None:
            continue
        return di, wi, w.source, str(body.buffer.ty.dtype)
    return None


@dataclass(frozen=True)
class GroupedConvRoles:
    """What ``grouped_conv2d_roles`` finds in a conv2d block with groups > 1."""

    data_read: int
    weight_read: int
    weight_buf: object
    out_dtype: str
    groups: int
    in_per_group: int
    out_per_group: int
    kernel: tuple        # KH, KW
    stride: tuple        # along H, W
    dilation: tuple


def _static(dim) -> int | None:
    return int(dim) if isinstance(dim, tirx.IntImm) else None


def _window(index, out_var, red_var) -> tuple[int, int] | None:
    """(stride, dilation) when ``index`` is ``out_var * stride + red_var * dilation`` (plus a constant)."""
    coef = sym.detect_linear_equation(index, [out_var, red_var])
    if len(coef) != 3 or not all(isinstance(c, tirx.IntImm) for c in coef):
        return None
    stride, dilation = int(coef[0]), int(coef[1])
    return (stride, dilation) if stride > 0 and dilation > 0 else None


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


def grouped_conv2d_roles(stmt) -> GroupedConvRoles | None:
    """The roles of ``C[n, f, y, x] += D[n, f // OCg * ICg + rc, y*s + ry*d, x*s + rx*d] * W[f, rc, ry, rx]``
    (casts allowed) with groups > 1 and static channel counts; None for anything else, a plain conv2d
    (groups == 1) included."""
    found = _conv_operands(stmt)
    if found is None:
        return None
    body, pairs = found
    iters = [iv.var for iv in stmt.iter_vars]
    _, f, y, x, rc, ry, rx = iters
    for d, w in pairs:
        info = _grouping(stmt, d, w, (f, rc), iters)
        if info is None:
            continue
        groups, icg, ocg, kernel = info
        hw = [_window(d.indices[2], y, ry), _window(d.indices[3], x, rx)]
        if None in hw:
            continue
        di, wi = _read_positions(stmt, d, w)
        if di is None or wi is None:
            continue
        return GroupedConvRoles(di, wi, w.source, str(body.buffer.ty.dtype), groups, icg, ocg, kernel,
                                (hw[0][0], hw[1][0]), (hw[0][1], hw[1][1]))
    return None


# ---- pooling -----------------------------------------------------------------------------------------------
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


def pool_window(stmt) -> tuple | None:
    """(source buffer, rows of it per channel, columns, window rows) of a window reduction over the H, W planes
    of an NCHW tensor (``P[n, c, y, x] = max|min|+(P, X[n, c, h(y, rh), w(x, rw)])``), else None. One
    reduction iterator moves along H, the other along W (a window or the whole plane); a reduction over one
    axis only (a row: LayerNorm-like) is not a pool."""
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
    h, w = load.indices[2], load.indices[3]
    rh, rw = reduce
    if not (uses_var(h, rh.var) and uses_var(w, rw.var) and not uses_var(h, rw.var) and not uses_var(w, rh.var)):
        return None
    shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in load.source.ty.shape]
    if None in shape or not isinstance(rh.dom.extent, tirx.IntImm):
        return None
    return load.source, shape[2], shape[3], int(rh.dom.extent)


def is_plane_pool(stmt) -> bool:
    """A pool (``pool_window``) over whole planes into one value per (n, c): a global pool, the mean of a
    squeeze-excitation."""
    found = pool_window(stmt)
    if found is None:
        return False
    _, rows, cols, _ = found
    dims = [_static(iv.dom.extent) for iv in stmt.iter_vars]
    return dims[2:] == [1, 1, rows, cols]


# ---- one letter per op -------------------------------------------------------------------------------------
def product_rows(func) -> tuple[int, int] | None:
    """(rows, batch) of the one GEMM of a legalized op's PrimFunc: the static rows of A per batch item
    (sequence) and the batch items (heads, batch) whose B differs; None when it has no such GEMM or either is
    symbolic."""
    if not isinstance(func, tirx.PrimFunc) or not isinstance(func.body, s_tir.SBlockRealize):
        return None
    products = [b for b in func_blocks(func) if is_reduction_block(b) and is_product_block(b)]
    roles = gemm_roles(products[0]) if len(products) == 1 else None
    if roles is None:
        return None
    counts = []
    for axes in (roles.m, roles.batch):
        n = 1
        for p in axes:
            ext = products[0].iter_vars[p].dom.extent
            if not isinstance(ext, tirx.IntImm):
                return None
            n *= int(ext)
        counts.append(n)
    return counts[0], counts[1]


def op_kind(func) -> str:
    """The kind letter of one legalized op's PrimFunc (see the module docstring)."""
    if not isinstance(func, tirx.PrimFunc) or not isinstance(func.body, s_tir.SBlockRealize):
        return OPAQUE
    if func.attrs is not None and _RECURRENCE_ATTR in func.attrs:
        return RECURRENCE
    blocks = func_blocks(func)
    if not blocks:
        return OPAQUE
    if any(iv.iter_type not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce) for b in blocks for iv in b.iter_vars):
        return OPAQUE
    if sorted(b.name_hint for b in blocks) == sorted(flash_decode.BLOCKS):
        return FLASH_DECODE
    reductions = [b for b in blocks if is_reduction_block(b)]
    if not reductions:
        pattern = func.attrs["op_pattern"] if func.attrs and "op_pattern" in func.attrs else None
        return ELEMENTWISE if pattern is not None and int(pattern) <= _BROADCAST else LAYOUT
    products = [b for b in reductions if is_product_block(b)]
    if len(products) >= 2 or (products and len(reductions) > 1):
        return MULTI_PRODUCT
    if products:
        if conv2d_roles(products[0]) is not None:
            return CONV
        return GEMM if gemm_roles(products[0]) is not None else PRODUCT
    if len(reductions) == 1:
        grouped = grouped_conv2d_roles(reductions[0])
        if grouped is not None and grouped.in_per_group == grouped.out_per_group == 1:
            return DEPTHWISE_CONV
        if grouped is not None and grouped.out_per_group >= 2:
            return GROUPED_CONV
        if pool_window(reductions[0]) is not None:
            return PLANE_POOL if is_plane_pool(reductions[0]) else POOL
    return REDUCTION
