"""Register-blocked contraction loops for products computed inside a bigger kernel (attention's Q·Kᵀ and
P·V, the GEMM in front of a norm, the products of a chained GEMM or of attention + projection), and the
compile-time weight re-layouts those register blocks read.

The block ``C[.., i, j] += A[.., i, k] * B[.., k, j]`` already sits under its kernel's tile loop; its own
loops are split into an ``mr × (nvec·lanes)`` micro-tile whose partial sums LLVM keeps in vector registers
across the ``k`` loop (field guide §10 K1: half the register file for accumulators, more spills). Loop
order ``j0, i0, k, i1, j1, j2``: the ``K × nr`` panel of B is reused by every row micro-tile.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from .analysis import has_reduce
from .base import UB_SCOPE
from .common import (new_schedule, extent, get_realize, innermost_vector, is_output_block, largest_divisor, ok, root_blocks,
                     transitive_producers, try_, vector_width_for)
from .layout import mark_prepack, packable_param
from .strides import accesses, stride

ACCUMULATORS = 16     # vector registers for a register block's partial sums (half of AVX-512's 32)


def loops_by_iter(sch, block):
    """{iter index: the innermost loop its binding uses}."""
    realize = get_realize(sch, block)
    loops = sch.get_loops(block)
    names = [sch.get(l).loop_var.name for l in loops]
    out = {}
    for idx, val in enumerate(realize.iter_values):
        used = {v.name for v in collect_vars_used_in_prim_expr(val)}
        hits = [i for i, n in enumerate(names) if n in used]
        if hits:
            out[idx] = loops[hits[-1]]
    return out


def _pow2_at_most(n: int, cap: int) -> int:
    v = 1
    while v * 2 <= min(n, cap):
        v *= 2
    return v


def micro_tile(i_ext, j_ext, lanes: int, accumulators: int = 16) -> tuple[int, int]:
    """(mr, nvec): rows and vectors of the register block, mr·nvec <= accumulators."""
    n_vecs = max(1, (j_ext or lanes * 4) // lanes)
    nvec = _pow2_at_most(n_vecs, 4 if (i_ext or 8) < 8 else 2)
    mr = max(1, min(8, accumulators // nvec))
    if i_ext is not None:
        mr = min(mr, i_ext)
    return mr, nvec


def schedule_contraction(sch, block, lanes: int, accumulators: int = 16):
    """Micro-tile a product block under its tile loop; vectorise the output axis; init split off last.
    Returns the outermost column-panel loop (``j0``) when the block was tiled, else None."""
    stmt = sch.get(block)
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    red = [i for i, k in enumerate(kinds) if k == tirx.IterVar.CommReduce]
    spatial = [i for i, k in enumerate(kinds) if k == tirx.IterVar.DataPar]
    if len(red) != 1 or len(spatial) < 2:
        return None
    by_iter = loops_by_iter(sch, block)
    i_loop, j_loop, k_loop = by_iter.get(spatial[-2]), by_iter.get(spatial[-1]), by_iter.get(red[0])
    if i_loop is None or j_loop is None or k_loop is None:
        return None
    i_ext, j_ext = extent(sch, i_loop), extent(sch, j_loop)
    v = vector_width_for(j_ext, lanes)
    if j_ext is None or v < 2:
        ok(sch.reorder, i_loop, k_loop, j_loop)
        try_(sch.decompose_reduction, block, k_loop)
        return None
    mr, nvec = micro_tile(i_ext, j_ext, v, accumulators)
    if j_ext % (nvec * v):
        nvec = 1
    if i_ext is not None and i_ext % mr:
        mr = largest_divisor(i_ext, mr)
    i0, i1 = sch.split(i_loop, [None, mr])
    j0, j1, j2 = sch.split(j_loop, [None, nvec, v])
    if not ok(sch.reorder, j0, i0, k_loop, i1, j1, j2):
        ok(sch.reorder, i0, k_loop, i1, j1, j2)
    ok(sch.vectorize, j2)
    ok(sch.unroll, j1)
    ok(sch.unroll, i1)
    init = try_(sch.decompose_reduction, block, k_loop)
    if init is not None:
        innermost_vector(sch, init, lanes)
    return j0


def dividing_block(i_ext: int, j_ext: int, v: int, accumulators: int, fallback: tuple[int, int]) -> tuple[int, int]:
    """(mr, nvec) for rows that the default register block does not divide, when the largest divisor of the
    rows below the default leaves fewer than half the accumulators busy: mr dividing the rows, nvec
    vectors dividing the columns, within the accumulators, with the fewest loads per FMA ((mr + nvec) /
    (mr * nvec): one broadcast per row and one load per vector each k step), more rows first on a tie.
    Shrinking only the rows to a divisor can leave one row (7 rows: 1 x 4 vectors, 1.25 loads per FMA and
    memory-bound; 7 x 2 makes 0.64)."""
    best, best_key = fallback, None
    for nvec in (1, 2, 4, 8):
        if j_ext % (nvec * v):
            continue
        for mr in range(1, min(i_ext, accumulators) + 1):
            if i_ext % mr or mr * nvec > accumulators:
                continue
            key = ((mr + nvec) / (mr * nvec), -mr)
            if best_key is None or key < best_key:
                best, best_key = (mr, nvec), key
    return best


def gemm_root_candidates(default: tuple[int, int], i_ext, j_ext: int, v: int,
                         accumulators: int = 16) -> list[tuple[int, int]]:
    """(mr, nvec) register blocks a tuner may try for ``schedule_gemm_root``: the default first, then every
    block of mr rows (dividing the rows) x nvec vectors (dividing the columns) whose accumulators fit the
    register file, as the default's do."""
    out = [default]
    rows = range(1, min(i_ext, 2 * accumulators) + 1) if i_ext is not None else (1, 2, 4, 8)
    for nvec in (1, 2, 4, 8):
        if j_ext % (nvec * v):
            continue
        for mr in rows:
            if (i_ext is None or i_ext % mr == 0) and mr * nvec <= accumulators and (mr, nvec) not in out:
                out.append((mr, nvec))
    return out


def schedule_gemm_root(sch, block, lanes: int, cores: int, accumulators: int = 16, choose=None, under=None) -> bool:
    """A whole GEMM at the root of its kernel (K1 recipe, field guide §10): loops ``j0, i0, k0, i1, j1,
    j2``, an ``mr × nr`` accumulator tile in ``local.UB`` (registers on the host) written back per
    micro-tile, parallel over the column panels. False when the block is not a plain
    product with a static, vectorisable output axis. ``choose(sch, default, candidates)``: a tunable rule's
    tile decision over ``gemm_root_candidates`` (see ``base.ScheduleRule.choose``). ``under``: the loop the
    block was computed at (a row block of its consumer); only the block's own loops below it are reordered."""
    stmt = sch.get(block)
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    red = [i for i, k in enumerate(kinds) if k == tirx.IterVar.CommReduce]
    spatial = [i for i, k in enumerate(kinds) if k == tirx.IterVar.DataPar]
    if len(red) != 1 or len(spatial) < 2:
        return False
    by_iter = loops_by_iter(sch, block)
    i_loop, j_loop, k_loop = by_iter.get(spatial[-2]), by_iter.get(spatial[-1]), by_iter.get(red[0])
    if i_loop is None or j_loop is None or k_loop is None:
        return False
    i_ext, j_ext = extent(sch, i_loop), extent(sch, j_loop)
    v = vector_width_for(j_ext, lanes)
    if j_ext is None or v < 2:
        return False
    mr, nvec = micro_tile(i_ext, j_ext, v, accumulators)
    if j_ext % (nvec * v):
        nvec = 1
    if i_ext is not None and i_ext % mr:
        mr = largest_divisor(i_ext, mr)
        if 2 * mr * nvec < accumulators:
            mr, nvec = dividing_block(i_ext, j_ext, v, accumulators, (mr, nvec))
    if choose is not None:
        default = (mr, nvec)
        mr, nvec = choose(sch, default, lambda: gemm_root_candidates(default, i_ext, j_ext, v, accumulators))
    _prepack_weight(sch, block, stmt.iter_vars[spatial[-1]].var, stmt.iter_vars[red[0]].var, nvec * v)
    by_iter = loops_by_iter(sch, block)
    i_loop, j_loop, k_loop = by_iter[spatial[-2]], by_iter[spatial[-1]], by_iter[red[0]]
    loops = sch.get_loops(block)
    names = [sch.get(l).loop_var.name for l in loops]
    outer = loops[:names.index(sch.get(i_loop).loop_var.name)]
    if under is not None:
        outer = outer[[sch.get(x).same_as(sch.get(under)) for x in outer].index(True) + 1:]
    i0, i1 = sch.split(i_loop, [None, mr])
    j0, j1, j2 = sch.split(j_loop, [None, nvec, v])
    k0 = k_loop  # not unrolled: by 4 ran no faster and cost LLVM time (most on a GEMM + LayerNorm kernel)
    sch.reorder(*outer, j0, i0, k0, i1, j1, j2)
    copy = sch.cache_write(block, 0, UB_SCOPE)
    sch.reverse_compute_at(copy, i0, preserve_unit_loops=True)
    innermost_vector(sch, copy, lanes)
    ok(sch.vectorize, j2)
    ok(sch.unroll, j1)
    ok(sch.unroll, i1)
    if cores > 1:
        par = sch.fuse(*outer, j0) if outer else j0
        ok(sch.parallel, par)
    init = try_(sch.decompose_reduction, block, k0)
    if init is not None:
        innermost_vector(sch, init, lanes)
    return True


def _prepack_weight(sch, block, j_var, k_var, nr: int) -> None:
    """A constant 2-D weight read as ``B[k, j]`` is re-laid out to ``(N/nr, K, nr)`` once at compile time
    (``layout.mark_prepack``): the k loop then walks one contiguous panel instead of rows N·4 bytes apart."""
    stmt = sch.get(block)
    for idx, region in enumerate(stmt.reads):
        mins = [r.min for r in region.region]
        if len(mins) == 2 and isinstance(mins[0], tirx.Var) and isinstance(mins[1], tirx.Var) \
                and mins[0].same_as(k_var) and mins[1].same_as(j_var):
            shape = region.source.shape
            if packable_param(sch, region.source) is None or int(shape[1]) % nr:
                return
            try_(mark_prepack, sch, block, idx, lambda k, n: (n // nr, k, n % nr))
            return


# ---- products inside a row-block kernel (chained GEMMs, attention + projection) -------------------------
def prepack_product_weight(sch, block, nr, panel=None) -> None:
    """Constant weight ``W[k, n]`` re-laid out at compile time into the order the register blocks read it:
    ``(N/nr, K, nr)``; with ``panel`` (the second product, read one K panel at a time)
    ``(K/panel, N/nr, panel, nr)``, so one panel of all output columns is one contiguous slab."""
    stmt = sch.get(block)
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [iv.var for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.DataPar]
    red = [iv.var for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.CommReduce]
    if nr <= 1 or not spatial or len(red) != 1:
        return
    if panel is None:
        _prepack_weight(sch, block, spatial[-1], red[0], nr)
        return
    for idx, region in enumerate(stmt.reads):
        mins = [r.min for r in region.region]
        if len(mins) == 2 and all(isinstance(x, tirx.Var) for x in mins) and mins[0].same_as(red[0]) \
                and mins[1].same_as(spatial[-1]):
            shape = [int(d) for d in region.source.shape]
            if packable_param(sch, region.source) is None or shape[1] % nr or shape[0] % panel:
                return
            try_(mark_prepack, sch, block, idx, lambda k, n: (k // panel, n // nr, k % panel, n % nr))
            return


def tile_product(sch, block, mr, nvec, v, whole):
    """Register block ``mr x (nvec*v)``: loops ``j0, i0, k0, i1, j1, j2``, i1/j1 unrolled, j2 the
    vector. ``whole``: the block's reduction is complete under its loops, its accumulator tile is a UB
    buffer written back per tile (cache_write); else (the second product, its reduction split across
    panels) the block accumulates into its accumulator rows in place, and the caller decomposes its init
    above the panel loop; LLVM keeps the tile in registers over the ``k`` loop."""
    stmt = sch.get(block)
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [i for i, k in enumerate(kinds) if k == tirx.IterVar.DataPar]
    red = next(i for i, k in enumerate(kinds) if k == tirx.IterVar.CommReduce)
    by_iter = loops_by_iter(sch, block)
    i_loop, j_loop, k_loop = by_iter[spatial[-2]], by_iter[spatial[-1]], by_iter[red]
    i0, i1 = sch.split(i_loop, [None, mr])
    j0, j1, j2 = sch.split(j_loop, [None, nvec, v])
    # K is not unrolled: unrolling it by 4 ran no faster and cost LLVM time (most on a SwiGLU FFN kernel)
    k0 = k_loop
    sch.reorder(j0, i0, k0, i1, j1, j2)
    if v > 1:
        ok(sch.vectorize, j2)
    ok(sch.unroll, j1)
    ok(sch.unroll, i1)
    if whole:
        copy = sch.cache_write(block, 0, UB_SCOPE)
        sch.reverse_compute_at(copy, i0, preserve_unit_loops=True)
        innermost_vector(sch, copy, v)
        init = try_(sch.decompose_reduction, block, k0)
        if init is not None:
            innermost_vector(sch, init, v)
    return i0


# ---- operands a GEMM should not read through its producers' index arithmetic ----------------------------
def producer_to_stage(sch, pro, operand, inline, reads_well):
    """The block of ``pro`` (the GEMM's prologue blocks) writing buffer ``operand`` when the GEMM would read
    that operand badly with the block's injective producer chain inlined into it, else None.

    ``inline(probe, probe_pro)`` inlines a prologue the way the calling rule does, ``reads_well(probe)`` says
    whether the GEMM of the result still reads well (the matmul rule: plain indices; the GEMM + norm rule:
    contiguous along the vectorised output axis, ``contiguous_along_output``). Decided on a scratch schedule
    of the same function, so ``sch`` (possibly traced) is only changed by the primitives the rule then
    applies. A producer chain holding a reduction (a LayerNorm) is the rule's prologue stage, never this."""
    blk = next((b for b in pro if sch.get(b).writes and sch.get(b).writes[0].source.same_as(operand)), None)
    if blk is None or any(has_reduce(sch, p) for p in [blk, *transitive_producers(sch, blk)]):
        return None
    probe = new_schedule(sch.mod)
    names = {sch.get(b).name_hint for b in pro}
    probe_pro = [b for b in root_blocks(probe) if probe.get(b).name_hint in names]
    try:
        inline(probe, probe_pro)
    except s_tir.ScheduleError:
        return blk              # the prologue does not even inline on its own: stage the producer
    return None if reads_well(probe) else blk


def widening_to_stage(sch, pro, operand):
    """The block of ``pro`` writing GEMM operand ``operand`` when it only converts a 16-bit float kernel input
    to float32 (a model in fp16 converted on entry, ``grouping/operand_cast.py``), else None.

    Inlined, the conversion would run in the micro-kernel once per FMA row and per N tile (one element
    broadcast per row: a scalar half load and conversion each): measured 11-17% slower than a separate
    conversion kernel on a 128x768x3072 GEMM (Zen 5). Staged like a layout-changing producer (a packed panel
    of A rows), it converts each element once, sixteen lanes at a time, and the micro-kernel is the float32
    one."""
    blk = next((b for b in pro if sch.get(b).writes and sch.get(b).writes[0].source.same_as(operand)), None)
    return blk if blk is not None and is_widening_block(sch, blk) else None


def is_widening_block(sch, blk) -> bool:
    """Whether ``blk`` only converts a 16-bit float kernel input (no producer in the kernel) to float32."""
    if transitive_producers(sch, blk):
        return False
    store = sch.get(blk).body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Cast):
        return False
    load = store.value.value
    wide = getattr(store.value, "ty", None)
    narrow = getattr(getattr(load, "source", None), "ty", None)
    return str(getattr(wide, "dtype", "")) == "float32" and str(getattr(narrow, "dtype", "")) in (
        "float16", "bfloat16")


def contiguous_along_output(sch, block) -> bool:
    """Does every load of the product ``block`` move by 0 or 1 element per step of its output axis (its last
    spatial iterator, the axis the register block vectorises)? A transposed operand cut from a packed
    projection (attention's Kᵀ sliced from Q|K|V, reshaped into heads and transposed: ``QKV[0, j, 384 + h *
    64 + k]``) moves by the projection's width instead: one gather per lane."""
    stmt = sch.get(block)
    spatial = [i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == tirx.IterVar.DataPar]
    loop = loops_by_iter(sch, block).get(spatial[-1]) if spatial else None
    if loop is None:
        return True
    var = sch.get(loop).loop_var
    return all(stride(a, var) in (0, 1) for a in accesses(sch, block) if not a.write)


def inline_operand_chain(sch, stage) -> None:
    """Inline the injective producers of a staged operand block into it (nearest first): the stage then
    gathers from the kernel's parameters in one pass and writes the operand in the order the GEMM reads."""
    for p in reversed(transitive_producers(sch, stage)):
        if not is_output_block(sch, p):
            try_(sch.compute_inline, p)


def pad_output_axis(sch, block, lanes: int, accumulators: int = ACCUMULATORS) -> list | None:
    """Zero-pad a product's output axis to whole register blocks of full host vectors when no full vector
    divides it (``pad_einsum``): 1500 keys take 4-lane vectors (1500 = 4 x 375), padded to 1504 they take 47
    register blocks of 2 x 16 lanes. The operands indexed by that axis get padding blocks in front of the product (the
    returned list: the caller inlines an operand's staged producer into its padding block and schedules it),
    and the padded result is cropped into its consumers (the crop inlined into them, so nothing is copied).
    None (nothing changed) when a full vector already divides the axis, the axis is shorter than two
    vectors, the product writes a kernel output (its crop would be a copy of the whole result), or its
    reads are not plain indices (pad_einsum's requirement)."""
    stmt = sch.get(block)
    spatial = [i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == tirx.IterVar.DataPar]
    red = [i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
    if len(red) != 1 or len(spatial) < 2 or is_output_block(sch, block):
        return None
    by_iter = loops_by_iter(sch, block)
    i_loop, j_loop = by_iter.get(spatial[-2]), by_iter.get(spatial[-1])
    if i_loop is None or j_loop is None:
        return None
    i_ext, j_ext = extent(sch, i_loop), extent(sch, j_loop)
    if j_ext is None or j_ext < 2 * lanes or vector_width_for(j_ext, lanes) == lanes:
        return None
    vecs = -(-j_ext // lanes)
    _, nvec = micro_tile(i_ext, vecs * lanes, lanes, accumulators)
    # whole register blocks (nvec vectors) when that pads at most an eighth more, else whole vectors (the
    # register block is then one vector wide)
    whole = -(-vecs // nvec) * nvec
    padding = [1] * len(stmt.iter_vars)
    padding[spatial[-1]] = (nvec if (whole - vecs) * 8 <= vecs else 1) * lanes
    name = stmt.name_hint
    before = {sch.get(b).name_hint for b in root_blocks(sch)}
    if not ok(sch.pad_einsum, block, padding):
        return None
    blocks = list(root_blocks(sch))
    names = [sch.get(b).name_hint for b in blocks]
    at = names.index(name)
    for b, nm in zip(blocks[at + 1:], names[at + 1:]):
        if nm not in before:
            try_(sch.compute_inline, b)         # the crop: its consumers read the padded result directly
    return [b for b, nm in zip(blocks[:at], names[:at]) if nm not in before]
