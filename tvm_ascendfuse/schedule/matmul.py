"""MatmulRule: matmul / batched matmul / linear with prologue and injective epilogue.

The kernel kind is recognised from the blocks, not the name (``analysis.match_gemm``): one reduction block
whose body is ``C[..] = C[..] + A[..] * B[..]`` (casts allowed) with every index a plain block iterator,
iterators classified by which buffers they index (batch: A, B, C; M: A, C; N: B, C; K: A, B). Anything after it must
be injective (bias, activation, residual add); anything before it is either inlined (transposes, casts of
parameters) or, when it holds reductions (a LayerNorm feeding the GEMM), scheduled as a row-parallel stage.
An injective producer of A that would not inline to plain indices (attention's head merge, transpose +
reshape: ``A[m, k] = X[k // d, m, k % d]``) is computed into a packed panel of whole A rows in L1, once per
group of row blocks that every N tile reuses (per register block and K chunk in UB when M is symbolic).

Tiling, NPU side: the mr x nr accumulator lives in ``local.UB``; tails of M/N are zero-padded
(``pad_einsum``) so every tile, and so every UB buffer, has a constant size. With ``stage_a=True`` the A
panel (mr x kc) is also staged in ``local.UB`` per K chunk, kc chosen so the double-buffered A panel,
B panel and accumulator fit usable UB; it costs 10-15% on the host (an extra copy per register block),
so it is off by default. Host side (UB tiling = cache blocking): mr x nr is a register block sized from
the host's vector registers (AVX-512: 8 x 32 fp32 = 16 zmm accumulators), N vectorised, K not unrolled
(unrolling it by 4 measured the same single-thread speed on the transformer GEMMs and cost LLVM time on
every kernel), the outer tiles parallel over the host's cores, and the weight re-laid out (N/nr, K, nr)
when it is a compile-time constant (see ``layout.py``): that layout change runs once, before the kernel,
and FoldConstant evaluates it.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ..ir import dtype_bytes
from ..target import AscendTarget
from .analysis import GemmBlock, find_gemm, has_reduce, last_reduction_is_product, reduction_kinds
from .base import L1_SCOPE, UB_SCOPE, ScheduleRule
from .common import (new_schedule, as_target, extent, is_output_block, largest_divisor, ok, parallel_vector, root_blocks,
                     still_exists, tile_local, transitive_producers, try_, vector_width_for, vectorize_inner)
from .contraction import producer_to_stage, widening_to_stage
from .fast_math import use_fast_math
from .hostvec import HostVector, host_vector
from .layout import PREPROC_ANNOTATION, mark_prepack, packable_param, panel_pack_map
from .partial_sums import vector_partial_sums
from .row_blocks import reads_tiles_one_to_one, runs_each_point_once, tiles_are_boxes


# Output columns up to which padding M (a copy of all of A, when A does not fit the cache) costs more than a
# register block of fewer rows.
NARROW_N = 128

@dataclass(frozen=True)
class GemmTiles:
    mr: int       # rows of the register block
    vl: int       # vector lanes along N
    nvec: int     # vectors along N: nr = nvec * vl
    uk: int       # K unroll
    kc: int       # K chunk of the A panel staged in UB

    @property
    def nr(self) -> int:
        return self.nvec * self.vl


def choose_tiles(m_ext, n_ext, k_ext, dtype: str, hv: HostVector, target: AscendTarget) -> GemmTiles:
    """Register block from the host's vector file; K chunk from the target's usable UB."""
    lanes = hv.lanes(dtype)
    vl = vector_width_for(n_ext, lanes) if n_ext is not None and n_ext % lanes else lanes
    vl = max(vl, min(lanes, 4)) if n_ext is None or n_ext >= lanes else vl
    acc = hv.accumulators
    n_vecs = -(-n_ext // vl) if n_ext is not None else 4
    if m_ext is None or m_ext >= 8:
        want = 2                                   # 8 x 2 vectors: the measured sweet spot (= 4 x 4)
    else:
        want = max(1, min(8, acc // max(1, m_ext)))  # few rows: widen the block along N instead
    nvec = max(1, min(want, n_vecs))
    if n_ext is not None and n_ext % vl == 0:
        # prefer a block that divides N (packable, no predicated tail), within 2x of the wanted width
        fits = [d for d in range(want * 2, 0, -1) if (n_ext // vl) % d == 0 and d * min(8, max(1, m_ext or 8)) <= acc]
        if fits and fits[0] * 2 >= nvec:
            nvec = fits[0]
    mr = max(1, min(8, acc // nvec))
    if m_ext is not None:
        mr = min(mr, m_ext)
    if m_ext is not None and n_ext is not None and k_ext is not None and m_ext % mr and n_ext <= NARROW_N \
            and m_ext * k_ext * dtype_bytes(dtype) >= target.l1_bytes and 2 * largest_divisor(m_ext, mr) >= mr:
        # a narrow product with a big A (attention's P.V: 64 columns, P over 1500 keys) would copy all of A
        # through memory to pad M for a few columns of work per element (54 MB a call on Whisper): rows
        # that divide M instead
        mr = largest_divisor(m_ext, mr)
    uk = 1    # see the module docstring: a K unroll bought no speed and costs compile time
    return GemmTiles(mr, vl, nvec, uk, _k_chunk(mr, nvec * vl, uk, k_ext, dtype, target))


def _ub_bytes(mr: int, nr: int, dtype: str, target: AscendTarget) -> tuple[int, int, int]:
    """(accumulator bytes, A row + B row bytes per k step, copies): the UB model of one register block."""
    nbytes = target.element_bytes(dtype)
    copies = 2 if target.double_buffer else 1
    acc_bytes = target.align_up(mr * nr * nbytes)
    per_k = target.align_up(mr * nbytes) + target.align_up(nr * nbytes)
    return acc_bytes, per_k, copies


def _k_chunk(mr: int, nr: int, uk: int, k_ext, dtype: str, target: AscendTarget) -> int:
    """K chunk: as many k steps of the double-buffered A and B panels as fit beside the accumulator."""
    acc_bytes, per_k, copies = _ub_bytes(mr, nr, dtype, target)
    kc = max(uk, ((target.ub_usable - acc_bytes) // copies // per_k) // uk * uk)
    if k_ext is not None and k_ext > kc:
        # equal chunks, so no chunk has a predicated tail inside the unrolled micro-kernel
        chunks = -(-k_ext // kc)
        while k_ext % chunks or (k_ext // chunks) % uk:
            chunks += 1
        kc = k_ext // chunks
    elif k_ext is not None:
        kc = k_ext
    return kc


def fits_ub(t: GemmTiles, dtype: str, target: AscendTarget) -> bool:
    """The rule's capacity check: accumulator plus double-buffered A/B panels of one K chunk within usable UB."""
    acc_bytes, per_k, copies = _ub_bytes(t.mr, t.nr, dtype, target)
    return acc_bytes + copies * per_k * t.kc <= target.ub_usable


def planned_ub_bytes(t: GemmTiles, dtype: str, target: AscendTarget, stage_a: bool) -> int:
    """UB bytes the schedule may allocate by the rule's plan: the accumulator tile, plus the A panel of one K
    chunk when it is staged in UB (its double buffering is the NPU's DMA, not an allocation here)."""
    acc_bytes, _, _ = _ub_bytes(t.mr, t.nr, dtype, target)
    return acc_bytes + (target.align_up(t.mr * t.kc * target.element_bytes(dtype)) if stage_a else 0)


def _ub_bytes_used(sch, target: AscendTarget) -> int:
    """UB bytes of the schedule after buffer compaction (what the verification phase counts)."""
    from ..analysis.ub_usage import kernel_usage     # analysis imports the schedule package: import late

    return kernel_usage("main", sch.mod["main"], target).bytes(UB_SCOPE)


# Register-block rows a tuner may try (the default's rows are always added).
_MR_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)


def tile_candidates(m_ext, n_ext, k_ext, dtype: str, hv: HostVector, target: AscendTarget) -> list[GemmTiles]:
    """Register blocks a tuner may choose from: the default first, then every mr x nvec block that keeps its
    accumulators in the host's vector registers, does not exceed the problem, and fits usable UB."""
    default = choose_tiles(m_ext, n_ext, k_ext, dtype, hv, target)
    vl, uk = default.vl, default.uk
    n_vecs = -(-n_ext // vl) if n_ext is not None else 8
    out = [default]
    for mr in sorted(set(_MR_CHOICES) | {default.mr}):
        if m_ext is not None and (mr > m_ext or m_ext % mr and mr != default.mr):
            continue                              # padded M tails only where the default pads them too
        for nvec in range(1, min(max(8, default.nvec), n_vecs) + 1):
            if mr * nvec > max(hv.accumulators, default.mr * default.nvec):
                continue
            t = GemmTiles(mr, vl, nvec, uk, _k_chunk(mr, nvec * vl, uk, k_ext, dtype, target))
            if t not in out and fits_ub(t, dtype, target):
                out.append(t)
    return out


class MatmulRule(ScheduleRule):
    """GEMM + epilogue, register-blocked and UB-tiled (see module docstring)."""

    name = "matmul"
    tunable = True      # register block (K chunk derived): ``tiles`` chooser (base.ScheduleRule)
    min_products = 1    # match_gemm needs free axes on both operands: a product block (analysis.is_product_block)

    def __init__(self, prepack: bool = True, stage_a: bool = False, tiles=None):
        """``tiles(sch, default, candidates)``, when given, picks the GemmTiles to use (a tuner samples one of
        ``candidates()``, see ``tunable.py``); without it the rule uses ``choose_tiles``."""
        self.prepack = prepack
        self.stage_a = stage_a
        self.tiles = tiles

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not last_reduction_is_product(func):
            return None
        # reshape index arithmetic simplified over the block domains first (a head split after the GEMM reads
        # ``C[0, ((h * 64 + d) // 384 + i) % 1500, (h * 64 + d) % 384]``): unsimplified, the region analysis
        # sees every epilogue tile read all M rows. Only when the GEMM is still recognised: the simplifier
        # also turns a unit batch iterator into the constant 0, which match_gemm does not take
        simple = s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))["main"]
        if find_gemm(new_schedule(tvm.IRModule({"main": simple}))) is not None:
            func = simple
        return self.schedule(new_schedule(tvm.IRModule({"main": use_fast_math(func)})), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> s_tir.Schedule | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines.

        Two products with no other reduction between them are declined: that is a GEMM chain (the
        chained-GEMM rule's), and here the first product would be a prologue stage scheduled like a row norm,
        unblocked and vectorised across whole output rows, which LLVM takes tens of seconds to compile per
        kernel (ConvNeXt's LayerNorm -> linear -> GELU -> linear). Products with a softmax between them
        (attention the attention rule declined) are still taken."""
        kinds = reduction_kinds(sch.mod["main"])
        first = kinds.find("P")
        if first >= 0 and kinds.count("P") > 1 and "R" not in kinds[first:]:
            return None
        found = find_gemm(sch)
        if found is None:
            return None
        blocks, gi, info = found
        if any(has_reduce(sch, b) for b in blocks[gi + 1:]):
            return None                                  # softmax/reduction after the GEMM: attention etc.
        return self._schedule(sch, blocks, gi, info, target, host_vector(host))

    # ------------------------------------------------------------------------------------------------
    def _schedule(self, sch, blocks, gi, info: GemmBlock, target, hv: HostVector):
        mm_name = sch.get(info.block).name_hint
        pro = [b for b in blocks[:gi] if not _is_preproc(sch, b)]
        a_stage = _producer_to_stage(sch, pro, info, info.a_buf)
        if a_stage is None:
            a_stage = widening_to_stage(sch, pro, info.a_buf)    # a 16-bit A converted once, in the panel
        if a_stage is not None:
            pro = [b for b in pro if not sch.get(b).same_as(sch.get(a_stage))]
            a_name = sch.get(a_stage).name_hint
        b_stage = _producer_to_stage(sch, pro, info, info.b_buf) if a_stage is None else None
        if b_stage is not None:
            pro = [b for b in pro if not sch.get(b).same_as(sch.get(b_stage))]
            b_name = sch.get(b_stage).name_hint
        schedule_prologue(sch, pro, hv, mm_name)      # inlines transposes/casts: roles may now be params
        found = find_gemm(sch)
        if found is None:
            return None
        _, gi, info = found
        if b_stage is not None:
            # B's layout-changing producer (P.V with V cut from a packed projection and split into heads)
            # written once, whole, in front of the GEMM; the GEMM then reads it with plain indices
            parallel_vector(sch, sch.get_sblock(b_name), hv.lanes(str(info.b_buf.ty.dtype)))
        mm = info.block
        out_shape = info.c_buf.ty.shape       # before any padding: what a tile-local epilogue writes
        loops = sch.get_loops(mm)
        ext = lambda p: extent(sch, loops[p])  # noqa: E731
        c_dtype = str(info.c_buf.ty.dtype)
        m_ext, n_ext = ext(info.m[-1]), ext(info.n)
        npu = as_target(target)
        t = choose_tiles(m_ext, n_ext, ext(info.k), c_dtype, hv, npu)
        if self.tiles is not None:
            t = self.tiles(sch, t, lambda: tile_candidates(m_ext, n_ext, ext(info.k), c_dtype, hv, npu))
        k_ext = ext(info.k)
        blocks_per_panel = _l1_panel_blocks(m_ext, k_ext, t, str(info.a_buf.ty.dtype), npu) if a_stage is not None else 0
        m_step = t.mr * max(1, blocks_per_panel)
        pad_m = m_ext is None or m_ext % m_step != 0
        pad_n = n_ext is None or n_ext % t.nr != 0
        before = {sch.get(b).name_hint for b in root_blocks(sch)}
        if pad_m or pad_n:
            # tails become whole register blocks over zero-padded operands: every tile (and so every UB
            # buffer) has a constant size, and the micro-kernel needs no predicate
            padding = [1] * len(sch.get(mm).iter_vars)
            padding[info.m[-1]] = m_step if pad_m else 1
            padding[info.n] = t.nr if pad_n else 1
            sch.pad_einsum(mm, padding)
        blocks = list(root_blocks(sch))
        names = [sch.get(b).name_hint for b in blocks]
        gi = names.index(mm_name)
        pads = [b for b, nm in zip(blocks[:gi], names[:gi]) if nm not in before]
        packed = False
        if self.prepack and not pad_n and packable_param(sch, info.b_buf) is not None:
            # after padding: pad_einsum needs plain indices, so a packed weight read would stop an M tail
            # from being padded (the rule then declined every M % mr != 0 GEMM with a constant weight)
            b_read = next(i for i, r in enumerate(sch.get(mm).reads) if r.source.same_as(info.b_buf))
            mark_prepack(sch, mm, b_read, panel_pack_map(info, t.nr, len(info.b_buf.ty.shape)))
            packed = True
        a_ub = _panel_block(sch, a_name, pads) if a_stage is not None else None
        for b in pads:
            if a_ub is None or not sch.get(b).same_as(sch.get(a_ub)):
                parallel_vector(sch, b, hv.lanes(str(info.a_buf.ty.dtype)))
        loops = sch.get_loops(mm)
        outer = [loops[p] for p in info.batch] + [loops[p] for p in info.m[:-1]]
        i0, i1 = sch.split(loops[info.m[-1]], [None, t.mr])
        j0, j1, j2 = sch.split(loops[info.n], [None, t.nvec, t.vl])
        stage_a = self.stage_a or (a_stage is not None and not blocks_per_panel)
        if not stage_a or (k_ext is not None and k_ext <= t.kc):
            k0, k1 = sch.split(loops[info.k], [None, t.uk])
            ko = None
        else:
            ko, k0, k1 = sch.split(loops[info.k], [None, t.kc // t.uk, t.uk])
        kl = [ko, k0, k1] if ko is not None else [k0, k1]
        if blocks_per_panel:
            ib, i0 = sch.split(i0, [None, blocks_per_panel])
            sch.reorder(*outer, ib, j0, i0, *kl, i1, j1, j2)
        else:
            sch.reorder(*outer, j0, i0, *kl, i1, j1, j2)
        epi = list(blocks[gi + 1:])
        if (epi or pad_m or pad_n) and not is_output_block(sch, mm):
            sch.set_scope(mm, 0, UB_SCOPE)                    # mr x nr accumulator tile
        else:
            # the GEMM writes a kernel output (alone, or also read by the epilogue: LLaMA's K|V projection
            # is returned and its K part rotated in the same kernel): a parameter's scope cannot change, so
            # the tile goes to UB and a copy writes it out
            epi = [sch.cache_write(mm, 0, UB_SCOPE), *epi]
        a_lanes = hv.lanes(str(info.a_buf.ty.dtype))
        if a_ub is not None and blocks_per_panel:
            # A's layout-changing producer, computed once per group of register-block rows into a packed
            # panel of whole rows in L1 (the cube's operand buffer), which every N tile then reads
            sch.set_scope(a_ub, 0, L1_SCOPE)
            sch.compute_at(a_ub, ib)
            vectorize_inner(sch, a_ub, a_lanes)
            try_(sch.parallel, sch.get_loops(a_ub)[len(outer) + 1])
        elif a_ub is not None:
            # A's layout-changing producer, computed per register block (and K chunk) into a packed UB panel
            sch.set_scope(a_ub, 0, UB_SCOPE)
            sch.compute_at(a_ub, kl[0] if ko is not None else i0)
            vectorize_inner(sch, a_ub, a_lanes)
        elif self.stage_a:
            a_ub = sch.cache_read(mm, info.a_read, UB_SCOPE)  # mr x kc A panel per K chunk
            sch.compute_at(a_ub, kl[0])
            vectorize_inner(sch, a_ub, a_lanes)
        if not self._epilogue(sch, epi, i0, hv.lanes(c_dtype), out_shape, _tile_of(sch, info, t)):
            # an epilogue that cannot consume the tile in place (a layout change the region analysis cannot
            # follow) reads the whole result: keep it in memory, not in UB
            sch.set_scope(mm, 0, "global")
        sch.vectorize(j2)
        try_(sch.unroll, j1)
        try_(sch.unroll, i1)
        try_(sch.unroll, k1)
        par = sch.fuse(*outer, j0) if outer and not blocks_per_panel else j0
        sch.parallel(par)
        init = sch.decompose_reduction(mm, kl[0])             # last: leaves the update without init
        il = sch.get_loops(init)
        try_(sch.vectorize, il[-1])
        try_(sch.unroll, il[-2])
        if _ub_bytes_used(sch, npu) > planned_ub_bytes(t, c_dtype, npu, stage_a):
            # the capacity check and the allocation disagree: an epilogue whose per-tile read the region
            # analysis cannot bound (a head split's ``((h * 64 + d) // 384 + i) % 1500``) makes the "mr x nr"
            # accumulator M x nr once compacted (192512 B of UB on Whisper's 1500 rows, against the
            # 188416 B the check had planned). The accumulator then goes to memory, not over UB
            sch.set_scope(mm, 0, "global")
        sch.annotate(mm, "ascendfuse.schedule", f"{'packed ' if packed else ''}{'padded ' if pad_m or pad_n else ''}{t}")
        return sch

    def _epilogue(self, sch, epi_blocks, i0, lanes, out_shape, tile) -> bool:
        """Fuse the epilogue into the register block; False when some block stays at the root.

        ``tile``: (the accumulator, its tile sizes per axis). A block follows the tile only when it reads each
        tile as a box of its own iterations (``tiles_are_boxes``); a reshape that cuts tiles apart (a head
        split of 80 columns under 32-column tiles) would otherwise be given part of a head per tile. Where
        the block reads the tile through such a reshape, the placement is also checked to run each of the
        block's iterations once (``runs_each_point_once``): rows padded in the accumulator (a 14 x 14 plane
        as 14 x 16) make TVM's bound of a tile's iterations reach into the next tile's."""
        if not epi_blocks:
            return True
        placed = True
        *inner, last = epi_blocks
        leftover = []
        for b in inner:
            if not ok(sch.compute_inline, b):
                leftover.append(b)
        acc, sizes = tile
        tiled = [acc]                  # buffers written per tile: the accumulator and the blocks placed so far
        for b in leftover + [last]:
            stmt = sch.get(b)
            src = next((buf for buf in tiled for r in stmt.reads if r.source.same_as(buf)), None)
            if src is None or not tile_local(sch, b, out_shape) or not tiles_are_boxes(stmt, src, sizes) \
                    or not _placed_exactly(sch, b, i0, reads_tiles_one_to_one(stmt, src, sizes)):
                parallel_vector(sch, b, lanes)
                placed = False
                continue
            tiled += [w.source for w in sch.get(b).writes if len(w.source.ty.shape) == len(sizes)]
            vectorize_inner(sch, b, lanes)
        return placed


def _placed_exactly(sch, block, loop, one_to_one: bool) -> bool:
    """``reverse_compute_at`` of ``block`` under ``loop``, when it runs each of the block's iterations once
    (checked on a copy where the block reads its tile through a reshape; ``one_to_one``: it does not, and
    TVM's bound is exact). False, with ``sch`` untouched, otherwise."""
    if not one_to_one:
        trial = sch.copy()
        if not ok(trial.reverse_compute_at, block, loop) or not runs_each_point_once(trial, block):
            return False
    return ok(sch.reverse_compute_at, block, loop)


def _tile_of(sch, info: GemmBlock, t: GemmTiles):
    """The GEMM's accumulator and the tile one register block of it is per axis: ``mr`` rows, ``nr`` columns,
    one index of every batch and outer row axis."""
    stmt = sch.get(info.block)
    iters = [iv.var for iv in stmt.iter_vars]
    write = stmt.writes[0]
    sizes = []
    for rg in write.region:
        pos = next((p for p, v in enumerate(iters) if rg.min.same_as(v)), None)
        sizes.append(t.mr if pos == info.m[-1] else t.nr if pos == info.n else 1)
    return write.source, sizes


def _producer_to_stage(sch, pro, info: GemmBlock, operand):
    """The block writing GEMM operand ``operand`` (``info.a_buf`` or ``info.b_buf``) when inlining its
    injective producers would leave the GEMM without plain indices for it, else None: A behind a head-merge
    transpose + reshape (``A[m, k] = X[k // d, m, k % d]``), B = V of P.V sliced from a packed projection and
    split into heads (``contraction.producer_to_stage``: decided on a scratch schedule)."""
    gemm_name = sch.get(info.block).name_hint
    return producer_to_stage(
        sch, pro, operand,
        lambda probe, probe_pro: schedule_prologue(probe, probe_pro, HostVector(128, 16, 1), gemm_name),
        lambda probe: find_gemm(probe) is not None)


def _l1_panel_blocks(m_ext, k_ext, t: GemmTiles, dtype: str, target: AscendTarget) -> int:
    """Register blocks of rows per staged A panel in L1 (0: stage per register block in UB instead).

    A panel per register block is re-staged for every N tile (N / nr times); whole rows of A staged once
    per group of row blocks are staged once in all, and each weight panel is reused by the whole group.
    Groups from half to all of what fits double-buffered L1, the one that pads M least (then the largest)."""
    if m_ext is None or k_ext is None:
        return 0
    copies = 2 if target.double_buffer else 1
    row_bytes = k_ext * target.element_bytes(dtype, L1_SCOPE)
    cap = target.capacity(L1_SCOPE) // copies // (t.mr * row_bytes)
    if cap < 2:
        return 0
    blocks = -(-m_ext // t.mr)
    sizes = range(min(blocks, -(-cap // 2)), min(blocks, cap) + 1)
    return min(sizes, key=lambda g: (-(-blocks // g) * g, -g))


def _panel_block(sch, a_name: str, pads):
    """The block to stage as A's panel: A's producer, or the block padding A's M tail with that producer
    inlined into it (one pass: gather, pad and pack)."""
    a_blk = sch.get_sblock(a_name)
    a_out = sch.get(a_blk).writes[0].source
    for b in pads:
        if any(r.source.same_as(a_out) for r in sch.get(b).reads):
            sch.compute_inline(a_blk)
            return b
    return a_blk


def _is_preproc(sch, block) -> bool:
    return PREPROC_ANNOTATION in sch.get(block).annotations


def schedule_prologue(sch, pro_blocks, hv: HostVector, gemm_name: str):
    """Inline what is cheap (transposes, casts of parameters); keep a reduction stage (LayerNorm) as a
    row-parallel stage: its reductions computed per row, the row loop parallel, the normalise vectorised."""
    depends_on_reduce = set()
    for b in pro_blocks:
        name = sch.get(b).name_hint
        producer_names = {sch.get(p).name_hint for p in sch.get_producers(b)}
        if has_reduce(sch, b) or producer_names & depends_on_reduce:
            depends_on_reduce.add(name)
    stage_out = []
    for b in reversed(pro_blocks):
        name = sch.get(b).name_hint
        if has_reduce(sch, b):
            continue
        if name not in depends_on_reduce:
            try_(sch.compute_inline, b)
        else:
            stage_out.append(b)
    # the stage blocks that feed the GEMM directly become row loops; their reductions go under the rows
    lanes = hv.lanes("float32")
    for b in stage_out:
        if not still_exists(sch, b):
            continue
        consumers = {sch.get(c).name_hint for c in sch.get_consumers(b)}
        if gemm_name not in consumers:
            try_(sch.compute_inline, b)
    for b in stage_out:
        if not still_exists(sch, b) or gemm_name not in {sch.get(c).name_hint for c in sch.get_consumers(b)}:
            continue
        loops = sch.get_loops(b)
        if len(loops) < 2:
            continue
        rf_blocks = [rf for p in transitive_producers(sch, b) if (rf := vector_partial_sums(sch, p, lanes))]
        row = sch.fuse(*sch.get_loops(b)[:-1]) if len(sch.get_loops(b)) > 2 else sch.get_loops(b)[0]
        for p in reversed(transitive_producers(sch, b)):
            try_(sch.compute_at, p, row)
        try_(sch.parallel, row)
        vectorize_inner(sch, b, lanes)
        for rf in rf_blocks:
            if not still_exists(sch, rf):
                continue
            lanes_loop, red_loop = sch.get_loops(rf)[-2:]       # after compute_at: (lanes, chunks)
            if not ok(sch.reorder, red_loop, lanes_loop) or not ok(sch.vectorize, lanes_loop):
                continue
            init = try_(sch.decompose_reduction, rf, red_loop)
            if init is not None:
                try_(sch.vectorize, sch.get_loops(init)[-1])
    return stage_out
