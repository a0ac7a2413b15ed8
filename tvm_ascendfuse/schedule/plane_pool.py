"""A global pool over the output planes of a conv kernel: the tail the grouping leaves in a conv's kernel when
the conv's output also feeds a squeeze-excite block (EfficientNet, MobileNetV3, RegNet-Y: conv -> bias ->
activation -> output, and the same output -> mean over H, W -> SE).

The conv part is scheduled by its rule as if the pool were not there (its last epilogue block writes the
output the pool reads); the pool then runs as its own loop nest after it: parallel over (batch, channel),
each plane summed as vector partial sums (``partial_sums``) and the few injective blocks after it (the
divide of a mean, a reshape) parallel and vectorised. Re-reading the plane costs one pass over the conv's
output; the alternative, the sums inside the conv's row tiles, races between tiles of one channel block.
"""

from __future__ import annotations

from .analysis import has_reduce, match_pool
from .common import extent, parallel_vector, try_
from .partial_sums import partial_sum_width, vectorize_rf


def split_plane_pool(sch, blocks, ci) -> tuple[int | None, str | None]:
    """Where the pool tail starts in ``blocks`` (the kernel's root blocks; ``ci`` the conv), or the reason
    there is none that can run after the conv: (index, None), (None, None) when the conv is the kernel's only
    reduction, (None, reason) when another reduction cannot be split off this way.

    The tail is one whole-plane reduction (``analysis.match_pool`` with a window of the whole plane) reading
    the buffer an epilogue block writes, then only injective blocks; no block before it reads the tail."""
    reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b) and i != ci]
    if not reductions:
        return None, None
    names = ", ".join(sch.get(blocks[i]).name_hint for i in reductions)
    ri = reductions[0]
    if len(reductions) > 1 or ri < ci:
        return None, f"reductions besides the conv ({names}) that are not one pool after it"
    pool = match_pool(sch, blocks[ri])
    dims = [extent(sch, lp) for lp in sch.get_loops(blocks[ri])]
    if pool is None or dims[2:] != [1, 1, pool.rows_in, pool.cols_in]:
        return None, f"a reduction after the conv ({names}) that is not a pool over whole planes"
    writers = [i for i in range(ci, ri) if sch.get(blocks[i]).writes[0].source.same_as(pool.source)]
    if not writers or writers[-1] != ri - 1:
        return None, f"the pool after the conv ({names}) does not read the conv's last epilogue output"
    tail = {sch.get(b).writes[0].source for b in blocks[ri:]}
    for b in blocks[:ri]:
        if any(r.source.same_as(t) for r in sch.get(b).reads for t in tail):
            return None, f"a block of the conv part reads the pool's result ({names})"
    return ri, None


def schedule_plane_pool(sch, tail, lanes: int) -> str:
    """Schedule the pool and its injective tail (root blocks, run after the conv part); returns a note."""
    pool, rest = tail[0], tail[1:]
    loops = sch.get_loops(pool)
    red = sch.fuse(*loops[-2:])                       # the whole plane, contiguous in NCHW
    spatial = sch.fuse(*loops[:-2])
    plane = extent(sch, red)
    v = partial_sum_width(plane, lanes)
    rf = None
    if v >= 4 and plane > v:
        _, lane = sch.split(red, [None, v])
        rf = try_(sch.rfactor, lane, len(sch.get(pool).iter_vars) - 2)
    if rf is not None:
        rf_loops = sch.get_loops(rf)
        try_(sch.parallel, rf_loops[0])
        vectorize_rf(sch, rf)
        try_(sch.parallel, sch.get_loops(pool)[0])
    else:
        try_(sch.parallel, spatial)
    for b in rest:
        parallel_vector(sch, b, lanes)
    return f"plane pool after it ({plane} per plane, {'%d-lane partial sums' % v if rf is not None else 'scalar'})"
