"""Injective stages tiled through UB: the building block of the elementwise rule, and of every rule whose kernel
ends in an injective output stage (the combine of several GEMMs, a residual sum written next to a norm).

A tile's working set (every buffer the block reads plus the one it writes, doubled when double-buffered) fits
the target's usable UB; the tile is computed into a ``local.UB`` buffer and copied out (the NPU's
compute-then-DMA shape). On the host the tile loop runs in parallel and the innermost axis is vectorised.
"""

from __future__ import annotations

import math

from tvm import s_tir

from ..target import AscendTarget
from .base import UB_SCOPE
from .common import buffer_bytes, extent, innermost_vector, num_cores, on_chip_bytes, try_, vector_lanes

# Below this many output elements a parallel launch costs more than it saves.
MIN_PARALLEL_ELEMENTS = 16384


def working_bytes_per_element(sch: s_tir.Schedule, block, target: AscendTarget) -> int:
    """Bytes one output element drags through UB: every distinct buffer read plus the one written (in the
    bytes they take on chip)."""
    stmt = sch.get(block)
    seen, total = [], 0
    for region in list(stmt.reads) + list(stmt.writes):
        if any(region.source.same_as(b) for b in seen):
            continue
        seen.append(region.source)
        total += on_chip_bytes(region.source, target)
    return max(total, 1)


def tile_injective(sch: s_tir.Schedule, block, target: AscendTarget, host, stage: bool = True) -> None:
    """Tile one injective root block so a tile fits UB; stage the tile in UB; parallel + vectorise."""
    loops = sch.get_loops(block)
    if not loops:
        return
    out_buf = sch.get(block).writes[0].source
    out_bytes = buffer_bytes(out_buf)
    lanes = vector_lanes(host, out_bytes * 8)
    per_elem = working_bytes_per_element(sch, block, target)
    copies = 2 if target.double_buffer else 1
    align = max(1, target.ub_align // out_bytes, lanes)
    budget = max(align, (target.ub_usable // (copies * per_elem)) // align * align - align)

    # A tile of symbolic length would need a symbolic UB buffer (no NPU allocator takes one): stream it.
    stage = stage and extent(sch, loops[-1]) is not None
    work = sch.cache_write(block, 0, UB_SCOPE) if stage else None
    anchor = block if work is None else sch.get_consumers(block)[0]
    loops = sch.get_loops(anchor)
    inner = loops[-1]
    e_inner = extent(sch, inner)
    outer = list(loops[:-1])
    if e_inner is None or e_inner > budget:
        io, ii = sch.split(inner, [None, budget])
        outer.append(io)
        rows = 1
    else:
        rows = max(1, budget // e_inner)
    total_rows = math.prod(extent(sch, l) or 1 << 20 for l in outer) if outer else 1
    cores = num_cores(host)
    total_elems = total_rows * (e_inner if e_inner is not None else 1 << 20)
    if outer:
        last = outer[-1]
        e_last = extent(sch, last)
        if e_last is not None and rows > 1:
            # keep >= cores tiles so every core gets work
            other = total_rows // max(1, e_last)
            if other < cores:
                rows = min(rows, max(1, math.ceil(e_last / math.ceil(cores / max(other, 1)))))
            rows = min(rows, e_last)
            # a tile count that divides the rows: no predicated tail tile (7-row tiles of 256 rows guarded
            # every element with a bounds check; the tail code cost LLVM time, not speed)
            divisor = max(d for d in range(1, rows + 1) if e_last % d == 0)
            if 2 * divisor >= rows:
                rows = divisor
            if rows < e_last:
                lo, _ = sch.split(last, [None, rows])
                outer[-1] = lo
            else:
                outer = outer[:-1]
        tile_loop = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    else:
        tile_loop = None
    if tile_loop is None:
        # one tile holds everything: split the only axis so the cores still share it
        inner = sch.get_loops(anchor)[-1]
        if cores > 1 and (e_inner or 0) >= MIN_PARALLEL_ELEMENTS:
            chunk = math.ceil(e_inner / cores / lanes) * lanes
            tile_loop, _ = sch.split(inner, [None, chunk])
    if tile_loop is not None:
        if work is not None:
            sch.compute_at(block, tile_loop, preserve_unit_loops=True)
        if total_elems >= MIN_PARALLEL_ELEMENTS and cores > 1:
            try_(sch.parallel, tile_loop)
    innermost_vector(sch, anchor, lanes)
    if work is not None:
        innermost_vector(sch, block, lanes)
