"""Whatever no other rule took still gets a CPU schedule worth having: any op TVM legalizes, any shape.

First the kernel's injective chains are inlined (``_inline_chains``): a spatial block whose consumers are all
spatial is computed inside them, and a pure copy (slice, reshape, transpose) is inlined into a reduction when
that keeps the reduction's vector and reduction loops as contiguous as they were. Then each remaining root
block takes the first path whose shape it has (``strides.py`` measures how each loop walks each buffer):

* **accumulate** (a reduction whose output's last axis is contiguous in every operand that uses it: a GEMM or
  conv no rule matched, a reduction over outer axes): the reduction loops move outside a register tile of
  ``mr`` rows x ``nvec`` vectors of the output, accumulated in an on-chip tile that LLVM keeps in registers
  and written back once; ``mr`` > 1 only along an axis that some operand does not depend on (its vectors
  are reused across those rows). The sum order of every output element is unchanged (exact).
* **row** (a reduction over the innermost axes, contiguous in its reads: sum/max/mean over the last axes):
  vector partial sums (rfactor into ``lanes`` partials per row, computed per row in an on-chip buffer, then
  one short sum of the lanes).
* **transpose** (a spatial block reading along another axis than it writes): both axes tiled by a cache line
  so the tile's reads and writes stay in the lines they touch; the written axis is the vector.
* **elementwise** (every other spatial block): trailing loops fused while every access stays contiguous or
  invariant across them, then vectorised at the host's width: a multiple of the lanes as full vectors and
  the remainder as one shorter vector (a main and a tail loop: a split whose factor does not divide the
  loop would guard every lane, and TVM then scalarises the whole loop). Symbolic extents are left to LLVM's
  loop vectoriser (``loop_partition`` takes constant extents only), which vectorises a runtime-length loop
  with its own scalar remainder.
* anything else (argmax, scans, gathers with opaque indices, blocks without trivial loops): parallel outer
  loops only.

Every path parallelises the loops outside its vector/tile loops when the block does at least
``MIN_PARALLEL_WORK`` iterations (below that a parallel launch costs more than it saves); bool and sub-byte
stores are never vectorised (``common.vector_storable``). Each block is scheduled on a copy of the schedule
and the copy is kept only when every step went through: a primitive TVM refuses leaves that block as the
previous path left it, so the rule always returns a valid schedule and never fails a build.

TVM's own CPU rules (``tvm.s_tir.dlight.cpu``: ``GEMV`` and ``Reduction``) are not handed any kernel: they
decline most kernels that reach this rule (a conv with its padding and epilogue, a norm's two reductions
and their consumers, a reduction with a second output; of the public models' fallback kernels they took
only Whisper's conv1d), and where they do apply (a GEMV, a softmax, a conv1d) they measured slower than
this rule's paths and than the unscheduled kernel (``GEMV`` vectorises across rows, a gather per lane;
``Reduction`` sums each row in scalar order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..target import AscendTarget

from .analysis import has_reduce, is_copy, uses_var
from .base import UB_SCOPE, ScheduleRule, Scheduled
from .common import new_schedule, extent, get_realize, is_output_block, ok, root_blocks, vector_storable
from .hostvec import HostVector, host_vector
from .partial_sums import vectorize_partial_sums
from .strides import accesses, stride, strides

# Below this many iterations of a block's body a parallel launch costs more than it saves.
MIN_PARALLEL_WORK = 16384
# Shortest loop worth a vector of its own (shorter ones are left to LLVM, which unrolls them).
MIN_VECTOR = 4


@dataclass
class _Host:
    vector: HostVector    # the host's vector width, registers and cores (from its CPU features)

    @property
    def cores(self) -> int:
        return self.vector.cores

    @property
    def accumulators(self) -> int:
        """Vector registers a register tile may hold its partial sums in."""
        return self.vector.accumulators

    def lanes(self, dtype) -> int:
        return self.vector.lanes(str(dtype))


class FallbackRule(ScheduleRule):
    """Per root block: accumulate / row / transpose / elementwise / parallel-only (module docstring);
    returns a schedule for every function with a root block."""

    name = "fallback"

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | None:
        sch = new_schedule(func)
        if not isinstance(sch.mod["main"].body, s_tir.SBlockRealize):
            return None         # no root block (hand-written loops): nothing to schedule, TVM lowers it as is
        ctx = _Host(host_vector(host))
        sch = _guarded(sch, _inline_chains)[0]
        sch = _guarded(sch, _deinterleave_all)[0]
        paths = []
        for name in [sch.get(b).name_hint for b in root_blocks(sch)]:
            sch, path = _schedule_block(sch, name, ctx)
            paths.append(f"{name}: {path}")
        return Scheduled(sch, "fallback paths: " + "; ".join(paths))


class _Refused(Exception):
    """A path that cannot go on (raised inside ``_guarded``, which then drops the trial schedule)."""


def _guarded(sch, step, *args):
    """Run ``step(trial, *args)`` on a copy of ``sch``; (the copy, its result) when it went through, else
    (``sch`` unchanged, None). TVM checks a primitive before it changes the IR, but a path is several
    primitives: one refused midway would leave the block half-scheduled."""
    trial = sch.copy()
    try:
        return trial, step(trial, *args)
    except (RuntimeError, ValueError, _Refused):     # ScheduleError and TVM's other refusals
        return sch, None


def _schedule_block(sch, name: str, ctx: _Host):
    """(schedule, path taken) for root block ``name``: the first path that applies and goes through."""
    for path in (_accumulate, _row, _transpose, _elementwise, _parallel_only):
        new, result = _guarded(sch, path, name, ctx)
        if result is not None:
            return new, result
    return sch, "unchanged"


# ---- loop facts ------------------------------------------------------------------------------------------
@dataclass
class _Nest:
    loops: list             # the block's loops, outermost first
    spatial: list           # per loop: True data parallel, False reduction
    extents: list           # per loop: int, or None when symbolic

    @property
    def work(self) -> int:
        return math.prod(e if e is not None else 1 << 10 for e in self.extents)


def _nest(sch, block) -> _Nest | None:
    """The block's loops when each binds exactly one data-parallel or reduction iterator as itself, else None
    (fused, split or opaque bindings: only the parallel-only path applies)."""
    loops = sch.get_loops(block)
    realize = get_realize(sch, block)
    if not loops or len(loops) != len(realize.iter_values):
        return None
    kinds = []
    for lp, val, iv in zip(loops, realize.iter_values, realize.block.iter_vars):
        if not (isinstance(val, tirx.Var) and val.same_as(sch.get(lp).loop_var)):
            return None
        if iv.iter_type not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce):
            return None
        kinds.append(iv.iter_type == tirx.IterVar.DataPar)
    return _Nest(list(loops), kinds, [extent(sch, lp) for lp in loops])


def _split_strides(sch, block, loop):
    """(write strides, read strides) of the block's accesses along ``loop``; reads of the buffer the block
    writes (a reduction's accumulator) are left out."""
    accs = accesses(sch, block)
    per = strides(sch, block, loop)
    written = [a.buffer for a in accs if a.write]
    writes = [s for a, s in zip(accs, per) if a.write]
    reads = [s for a, s in zip(accs, per) if not a.write and not any(a.buffer.same_as(w) for w in written)]
    return writes, reads


def _vector_width(e: int | None, lanes: int) -> int:
    """Lanes of the vectors a loop of ``e`` iterations is cut into without a remainder: its largest divisor up to
    the host's lanes (1: none worth a vector). A register tile cannot have a remainder loop (``loop_partition``
    leaves blocks whose regions cover the whole loop, which ``cache_write`` then stages whole), and a lane
    count that is not a power of two (14 of 16) measured faster than the largest power of two (4 of 16) on
    the fallback's convs."""
    if e is None:
        return 1
    v = _largest_divisor(e, lanes)
    return v if v >= MIN_VECTOR else 1


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def _parallel(sch, loops, work: int, ctx: _Host) -> bool:
    """Fuse ``loops`` (adjacent, outermost first) into one parallel loop when the block does enough work."""
    if ctx.cores <= 1 or work < MIN_PARALLEL_WORK or not loops:
        return False
    outer = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    return ok(sch.parallel, outer)


# ---- inlining ----------------------------------------------------------------------------------------------
def _inline_chains(sch) -> bool:
    """Inline spatial intermediates into spatial consumers, and pure copies into reductions where that keeps
    the reduction's loops as contiguous (module docstring). Repeats until nothing changes."""
    changed = True
    while changed:
        changed = False
        for block in reversed(list(root_blocks(sch))):
            if has_reduce(sch, block) or is_output_block(sch, block):
                continue
            consumers = sch.get_consumers(block)
            if not consumers:
                continue
            if all(not has_reduce(sch, c) for c in consumers):
                if ok(sch.compute_inline, block):
                    changed = True
                    break
            elif is_copy(sch, block) and _inline_keeps_walks(sch, block, consumers):
                changed = True
                break
    return True


def _contiguous_walks(sch, block) -> tuple[int, int]:
    """How many reads of ``block`` are contiguous or invariant along its innermost data-parallel loop and
    along its innermost reduction loop."""
    nest = _nest(sch, block)
    if nest is None:
        return 0, 0
    counts = []
    for want in (True, False):
        pos = [i for i, s in enumerate(nest.spatial) if s == want]
        if not pos:
            counts.append(0)
            continue
        _, reads = _split_strides(sch, block, nest.loops[pos[-1]])
        counts.append(sum(1 for s in reads if s in (0, 1)))
    return counts[0], counts[1]


def _inline_keeps_walks(sch, block, consumers) -> bool:
    """Inline copy ``block`` into its reduction consumers when none of them reads less contiguously for it."""
    names = [sch.get(c).name_hint for c in consumers]
    before = [_contiguous_walks(sch, c) for c in consumers]
    trial = sch.copy()
    if not ok(trial.compute_inline, block):
        return False
    after = [_contiguous_walks(trial, trial.get_sblock(n)) for n in names]
    if any(a[0] < b[0] or a[1] < b[1] for a, b in zip(after, before)):
        return False
    return ok(sch.compute_inline, block)


# ---- accumulate: reductions with a contiguous output axis (GEMM/conv-like, reductions over outer axes) -----
def _accumulate(sch, name: str, ctx: _Host) -> str | None:
    block = sch.get_sblock(name)
    nest = _nest(sch, block)
    if nest is None or all(nest.spatial) or not any(nest.spatial):
        return None
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or stmt.init is None:
        return None
    n_sp = nest.spatial.index(False)
    if any(nest.spatial[n_sp:]):
        return None                        # a spatial loop inside the reduction loops: not this shape
    loops = list(nest.loops)
    lanes = ctx.lanes(stmt.writes[0].source.ty.dtype) if vector_storable(sch, block) else 1
    spatial, reduction = loops[:n_sp], loops[n_sp:]
    ext = [extent(sch, lp) for lp in spatial]
    cand = [k for k, e in enumerate(ext) if e != 1]
    if not cand:
        return None
    j = cand[-1]
    writes, reads = _split_strides(sch, block, spatial[j])
    # the output axis is the vector: contiguous in the output, contiguous or invariant (or a short stride: a
    # strided conv) in every operand, and used by at least one operand (else it is a broadcast, not a sum)
    if writes != [1] or any(s is None or s not in (0, 1, 2) for s in reads) or not any(reads):
        return None
    # the output axis fused with the axes outside it while every access stays contiguous across them (the
    # H x W plane of a 1x1 conv) when that gives wider vectors and whole-row-aligned tiles
    group = _vector_group(sch, block, spatial, ext, j, lanes)
    if len(group) > 1:
        fused = sch.fuse(*[spatial[k] for k in group])
        spatial = spatial[:group[0]] + [fused] + spatial[j + 1:]
        ext = [extent(sch, lp) for lp in spatial]
        j = group[0]
        cand = [k for k, e in enumerate(ext) if e != 1]
    ej = ext[j]
    v, nvec = _vector_tile(ej, [ej], lanes, 4)
    i, mr, reuse = _tile_rows(sch, block, spatial, ext, [k for k in cand if k != j], reads, nvec, ctx)
    if i is None and v > 1:
        v, nvec = _vector_tile(ej, [ej], lanes, 8)
    if v == 1 and i is None:
        return None
    outer = [lp for k, lp in enumerate(spatial) if k not in (i, j)]
    j0 = j1 = None
    j2 = spatial[j]
    if v > 1:
        j0, j1, j2 = sch.split(spatial[j], [None, nvec, v])
    i0 = i1 = None
    if i is not None:
        i0, i1 = sch.split(spatial[i], [None, mr])
    tile_outer = [lp for lp in (j0, i0) if lp is not None]
    sch.reorder(*outer, *tile_outer, *reduction, *[lp for lp in (i1, j1, j2) if lp is not None])
    if v > 1:
        # the mr x nvec*v tile of partial sums in an on-chip buffer, written back once per tile
        copy = sch.cache_write(block, 0, UB_SCOPE)
        sch.reverse_compute_at(copy, tile_outer[-1], preserve_unit_loops=True)
        _vectorise_whole_inner(sch, copy, v)
        sch.vectorize(j2)
    if j1 is not None:
        ok(sch.unroll, j1)
    if i1 is not None:
        ok(sch.unroll, i1)
    _parallel(sch, outer + tile_outer, nest.work, ctx)
    init = sch.decompose_reduction(block, reduction[0])
    if v > 1:
        _vectorise_whole_inner(sch, init, v)
    rows = f"{mr} rows" + (" (operand reused)" if reuse else "")
    return f"accumulate {rows} x {nvec}x{v} lanes" if v > 1 else f"accumulate {rows}, scalar"


def _deinterleave_all(sch) -> bool:
    """``_deinterleave`` for every reduction block's output axis, before any block is scheduled (a producer
    split into a main and a tail loop can no longer be re-laid out)."""
    for block in list(root_blocks(sch)):
        nest = _nest(sch, block)
        if nest is None or all(nest.spatial):
            continue
        axes = [k for k, (sp, e) in enumerate(zip(nest.spatial, nest.extents)) if sp and e != 1]
        if not axes:
            continue
        writes, reads = _split_strides(sch, block, nest.loops[axes[-1]])
        if writes == [1] and any(r is not None and r >= 2 for r in reads):
            _deinterleave(sch, block, nest.loops[axes[-1]])
    return True


def _deinterleave(sch, block, loop) -> bool:
    """Operands read with a constant stride s > 1 along ``loop`` in their last axis (a strided conv's input)
    re-laid out ``(..., w) -> (..., w % s, w // s)``, so those reads become contiguous: in place when a
    spatial block of this function produces the operand (its padding), else through a copy at the root; an
    operand a reduction produces (a pool after a conv) keeps its layout, the one its producer's vectors
    need. Whether any operand was re-laid out."""
    var = sch.get(loop).loop_var
    stmt = sch.get(block)
    done = []
    for access in accesses(sch, block):
        step = stride(access, var)
        if access.write or step is None or step < 2 or any(b.same_as(access.buffer) for b in done):
            continue
        shape = access.buffer.ty.shape
        last = shape[-1] if len(shape) else None
        if not isinstance(last, tirx.IntImm) or int(last) % step or step >= int(last):   # not the last axis
            continue
        ndim = len(shape)
        index_map = tvm.tirx.IndexMap.from_func(lambda *i: [*i[:-1], i[-1] % step, i[-1] // step], ndim=ndim)
        producer = next((p for p in sch.get_producers(block)
                         if any(w.source.same_as(access.buffer) for w in sch.get(p).writes)), None)
        if producer is not None and has_reduce(sch, producer):
            continue                       # a product's output keeps the layout its own vectors need
        if producer is not None:
            index = next(k for k, w in enumerate(sch.get(producer).writes) if w.source.same_as(access.buffer))
            sch.transform_layout(producer, ("write", index), index_map)
        else:
            index = next(k for k, r in enumerate(stmt.reads) if r.source.same_as(access.buffer))
            copy = sch.cache_read(block, index, "global")
            sch.transform_layout(copy, ("write", 0), index_map)
        done.append(access.buffer)
        stmt = sch.get(block)
    return bool(done)


def _vector_group(sch, block, spatial, ext, j: int, lanes: int) -> list[int]:
    """Indices of the spatial loops to fuse into the vector axis (``[j]``: none): the longest run of loops
    outside ``j`` across which every access is contiguous (stride 1 inside, the inner extent outside) or
    invariant, whose fused extent cuts into the widest vectors; a tile of vectors must cover whole inner rows
    or lie within one (``_vector_tile``), else writing it back would cover a box around it."""
    if ext[j] is None or lanes < MIN_VECTOR:
        return [j]
    best, best_v = [j], _vector_width(ext[j], lanes)
    group, inner = [j], ext[j]
    strides_in = strides(sch, block, spatial[j])
    for k in range(j - 1, -1, -1):
        if ext[k] is None:
            break
        if ext[k] != 1:
            s_out = strides(sch, block, spatial[k])
            if any(not ((a == 1 and b == inner) or (a == 0 and b == 0)) for a, b in zip(strides_in, s_out)):
                break
        group = [k] + group
        inner *= ext[k]
        suffixes = _suffix_products([ext[g] for g in group if ext[g] != 1])
        v, _ = _vector_tile(inner, suffixes, lanes, 4)
        if v > best_v:
            best, best_v = list(group), v
    return best


def _suffix_products(extents: list[int]) -> list[int]:
    out, p = [], 1
    for e in reversed(extents):
        p *= e
        out.append(p)
    return out


def _vector_tile(e: int | None, suffixes: list[int], lanes: int, cap: int) -> tuple[int, int]:
    """(lanes, vectors) of a register tile along a (fused) loop of ``e``: the widest vectors dividing it, as
    many of them (up to ``cap``) as divide it, such that a tile covers whole inner rows of the fused loops
    (``suffixes``: extents of the innermost one, two, ... loops) or lies within one. (1, 1): no vectors."""
    v = _vector_width(e, lanes)
    if v == 1:
        return 1, 1
    for nvec in range(min(cap, e // v), 0, -1):
        tile = nvec * v
        if (e // v) % nvec == 0 and all(tile % p == 0 or p % tile == 0 for p in suffixes[:-1] or [e]):
            return v, nvec
    return 1, 1


def _tile_rows(sch, block, spatial, ext, others, j_reads, nvec, ctx):
    """(loop index, rows, reused) of the register tile's rows. First choice: the innermost axis along which an
    operand that moves with the vector axis stays the same within a tile of rows (its vectors are loaded
    once per tile: B of a GEMM, the input of a conv across output channels, also a group's input across the
    output channels of a grouped conv); else the innermost other axis, for independent accumulators (a chain
    of FMAs into one register waits on each one), when the vector axis gives fewer than 8."""
    cap = max(1, min(8, ctx.accumulators // max(1, nvec)))
    accs = accesses(sch, block)
    written = [a.buffer for a in accs if a.write]
    reads = [a for a in accs if not a.write and not any(a.buffer.same_as(w) for w in written)]
    for k in reversed(others):
        if ext[k] is None or ext[k] < 2:
            continue
        mr = _largest_divisor(ext[k], cap)
        if mr < 2:
            continue
        var = sch.get(spatial[k]).loop_var
        moves = [stride(a, var) != 0 for a in reads]
        if not any(moves):
            continue
        if any(js != 0 and _invariant_in_tile(a, var, mr, ext[k]) for a, js in zip(reads, j_reads)):
            return k, mr, True
    if nvec >= 8:
        return None, 1, False
    for k in reversed(others):
        if ext[k] is not None and ext[k] >= 2:
            mr = _largest_divisor(ext[k], max(1, min(8, 8 // max(1, nvec))))
            if mr >= 2:
                return k, mr, False
    return None, 1, False


def _invariant_in_tile(access, var, rows: int, total: int) -> bool:
    """Is ``access`` the same for every ``var`` in a tile of ``rows`` consecutive values (aligned)?"""
    dtype = str(var.ty)
    tile, lane = tirx.Var("tile", dtype), tirx.Var("lane", dtype)
    analyzer = Analyzer()
    analyzer.bind(tile, tvm.ir.Range(0, max(1, total // rows)))
    analyzer.bind(lane, tvm.ir.Range(0, rows))
    offset = analyzer.simplify(tvm_ffi.structural_map(
        access.offset, (tvm.ir.Var, lambda v: tile * rows + lane if v.same_as(var) else v)))
    return not uses_var(offset, lane)


def _vectorise_whole_inner(sch, block, v: int) -> None:
    """Vectorise the innermost loop of ``block`` by ``v`` lanes (split off when longer and divisible)."""
    loops = sch.get_loops(block)
    e = extent(sch, loops[-1]) if loops else None
    if e is None or e < MIN_VECTOR:
        return
    if e > v and e % v == 0 and v >= MIN_VECTOR:
        ok(sch.vectorize, sch.split(loops[-1], [None, v])[1])
    elif e == v or e <= 2 * v:
        ok(sch.vectorize, loops[-1])


# ---- row: reductions over the innermost contiguous axes -----------------------------------------------------
def _row(sch, name: str, ctx: _Host) -> str | None:
    block = sch.get_sblock(name)
    nest = _nest(sch, block)
    if nest is None or nest.spatial[-1] or all(not s for s in nest.spatial):
        return None
    n_sp = nest.spatial.index(False)
    if any(nest.spatial[n_sp:]):
        return None                        # reductions are not all trailing
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or stmt.init is None:
        return None
    loops = nest.loops
    # fuse trailing reduction loops while the reads stay contiguous across them (mean over H and W)
    r = loops[-1]
    writes, reads = _split_strides(sch, block, r)
    if not reads or any(s not in (0, 1) for s in reads):
        return None
    k = len(loops) - 1
    while k > n_sp:
        outer = loops[k - 1]
        e_in = extent(sch, r)
        _, r_out = _split_strides(sch, block, outer)
        _, r_in = _split_strides(sch, block, r)
        if e_in is None or any(not ((a == 1 and b == e_in) or (a == 0 and b == 0)) for a, b in zip(r_in, r_out)):
            break
        r = sch.fuse(outer, r)
        k -= 1
    e = extent(sch, r)
    lanes = ctx.lanes(stmt.writes[0].source.ty.dtype)
    v = _vector_width(e, lanes)
    rows = sch.get_loops(block)[:n_sp]
    if e is None or v < MIN_VECTOR or e < 2 * v:
        _parallel(sch, rows, nest.work, ctx)
        return "row, scalar"
    ndim = len(stmt.writes[0].source.ty.shape)
    _, ki = sch.split(r, [None, v])
    rf = sch.rfactor(ki, ndim)
    rows = sch.get_loops(block)[:n_sp]
    row = sch.fuse(*rows) if len(rows) > 1 else (rows[0] if rows else None)
    if row is not None:
        if ctx.cores > 1 and nest.work >= MIN_PARALLEL_WORK:
            ok(sch.parallel, row)
        sch.compute_at(rf, row, preserve_unit_loops=True)
        ok(sch.set_scope, rf, 0, UB_SCOPE)
    vectorize_partial_sums(sch, rf)
    return f"row, {v}-lane partial sums"


# ---- spatial blocks ----------------------------------------------------------------------------------------
def _spatial_nest(sch, block) -> _Nest | None:
    nest = _nest(sch, block)
    if nest is None or not all(nest.spatial):
        return None
    return nest


def _transpose(sch, name: str, ctx: _Host) -> str | None:
    """A read that walks another loop contiguously than the written one: tile both by a cache line."""
    block = sch.get_sblock(name)
    nest = _spatial_nest(sch, block)
    if nest is None or len(nest.loops) < 2:
        return None
    w = len(nest.loops) - 1
    writes, reads_w = _split_strides(sch, block, nest.loops[w])
    if not writes or any(s != 1 for s in writes) or all(s in (0, 1) for s in reads_w):
        return None
    # the loop along which the transposing read is contiguous
    r = None
    for k in range(w - 1, -1, -1):
        _, reads_k = _split_strides(sch, block, nest.loops[k])
        if any(a not in (0, 1) and b == 1 for a, b in zip(reads_w, reads_k)):
            r = k
            break
    if r is None:
        return None
    dtype = sch.get(block).writes[0].source.ty.dtype
    line = max(1, 64 // max(1, tvm.DataType(str(dtype)).bits // 8))     # elements of one cache line
    ew, er = nest.extents[w], nest.extents[r]
    if ew is None or er is None or ew < line or er < line:
        return None
    tw = _vector_width(ew, line)
    if tw == 1:
        tw = line                          # a predicated tile: its vector loop stays scalar
    loops = nest.loops
    ro, ri = sch.split(loops[r], [None, line])
    wo, wi = sch.split(loops[w], [None, tw])
    order = [lp for k, lp in enumerate(loops) if k not in (r, w)]
    outer = order[:r] + [ro] + order[r:] + [wo]
    sch.reorder(*outer, ri, wi)
    _parallel(sch, outer, nest.work, ctx)
    vectorised = ew % tw == 0 and vector_storable(sch, block) and ok(sch.vectorize, wi)
    return f"transpose, {line}x{tw} tiles" + (", vectorised" if vectorised else "")


def _elementwise(sch, name: str, ctx: _Host) -> str | None:
    block = sch.get_sblock(name)
    nest = _spatial_nest(sch, block)
    if nest is None:
        return None
    loops = list(nest.loops)
    writes, _ = _split_strides(sch, block, loops[-1])
    vectorise = vector_storable(sch, block) and bool(writes) and all(s == 1 for s in writes)
    if vectorise:
        loops = _fuse_contiguous_tail(sch, block, loops)
    inner = loops[-1]
    e = extent(sch, inner)
    lanes = ctx.lanes(sch.get(block).writes[0].source.ty.dtype)
    outer = loops[:-1]
    outer_ext = math.prod(extent(sch, lp) or 1 << 10 for lp in outer)
    par = False
    if outer and outer_ext >= ctx.cores:
        par = _parallel(sch, outer, nest.work, ctx)
    if not vectorise or e is None or e < MIN_VECTOR:
        if not par and not outer:
            par = _parallel(sch, [inner], nest.work, ctx)
        return "elementwise, parallel" if par else "elementwise, serial"
    if e <= lanes:
        sch.vectorize(inner)
        return f"elementwise, {e} lanes"
    main = e // lanes * lanes
    if main == e:
        io, ii = sch.split(inner, [None, lanes])
        sch.vectorize(ii)
        if not par:
            _parallel(sch, [io], nest.work, ctx)
        return f"elementwise, {lanes} lanes"
    # a main loop of whole vectors and one shorter vector for the remainder
    head, tail = _partition(sch, block, inner, main)
    io, ii = sch.split(sch.get_loops(head)[-1], [None, lanes])
    sch.vectorize(ii)
    if not par:
        _parallel(sch, [io], nest.work, ctx)
    if e - main >= 2:
        sch.vectorize(sch.get_loops(tail)[-1])
    return f"elementwise, {lanes} lanes + tail {e - main}"


def _partition(sch, block, loop, at: int):
    """``loop_partition`` of ``loop`` at ``at``: the blocks of the two parts (TVM names them after the block and
    the loop: ``<block>_<loop>0`` and ``<block>_<loop>1``)."""
    base = sch.get(block).name_hint
    var = sch.get(loop).loop_var.name
    sch.loop_partition(loop, [at, None])
    try:
        return sch.get_sblock(f"{base}_{var}0"), sch.get_sblock(f"{base}_{var}1")
    except ValueError as err:        # another TVM naming: keep the block unscheduled rather than guess
        raise _Refused(str(err)) from None


def _fuse_contiguous_tail(sch, block, loops: list, lanes: int | None = None) -> list:
    """Fuse the two innermost loops while every access is contiguous (stride 1 inside, the inner extent
    outside) or invariant across both; the loops after fusing. With ``lanes``, only while the fused loop cuts
    into vectors at least as wide (``_vector_width``) as the inner one."""
    loops = list(loops)
    while len(loops) >= 2:
        inner, outer = loops[-1], loops[-2]
        e_in = extent(sch, inner)
        if e_in is None or extent(sch, outer) is None:
            break
        if e_in == 1 or extent(sch, outer) == 1:          # a unit loop walks nothing
            loops = loops[:-2] + [sch.fuse(outer, inner)]
            continue
        s_in = strides(sch, block, inner)
        s_out = strides(sch, block, outer)
        if any(not ((a == 1 and b == e_in) or (a == 0 and b == 0)) for a, b in zip(s_in, s_out)):
            break
        if lanes is not None and _vector_width(e_in * extent(sch, outer), lanes) < _vector_width(e_in, lanes):
            break
        loops = loops[:-2] + [sch.fuse(outer, inner)]
    return loops


def _parallel_only(sch, name: str, ctx: _Host) -> str | None:
    """Fuse the leading data-parallel loops (by the block's iterator kinds) and run them in parallel."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    if not loops:
        return "no loops"
    nest = _nest(sch, block)
    if nest is None:
        work = math.prod(extent(sch, lp) or 1 << 10 for lp in loops)
        return "parallel outer loop" if _parallel(sch, [loops[0]], work, ctx) else "serial"
    lead = 0
    while lead < len(loops) and nest.spatial[lead]:
        lead += 1
    if lead == len(loops) and lead > 1:
        lead -= 1                          # keep the innermost loop for LLVM's vectoriser
    return "parallel" if _parallel(sch, loops[:lead], nest.work, ctx) else "serial"
