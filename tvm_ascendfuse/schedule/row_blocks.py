"""Blocks of rows an epilogue can follow exactly.

A rule that computes a product per block of rows and then ``reverse_compute_at``s a layout epilogue under the
block loop (attention's head merge, Swin's window reverse: the rows of a 7x7 window written back as 7 image
rows of 7 pixels) gets, per block, the bounding box of the epilogue iterations that read the block's rows.
When a block's rows are no box in the epilogue's iteration space (32 rows of a 7-wide window: four whole
image rows and four pixels of the fifth), that box also covers rows of the next block, which are written
from an accumulator that does not hold them: wrong numbers, no error. ``exact_row_blocks`` says which row
counts per block map to boxes, by evaluating the epilogue's row index over its iterators.

The same holds for any tile, not only blocks of rows: a GEMM's 32 output columns read by a head split
(``P[i, h * 80 + d]``, LeViT's 640 = 8 x 80) are no box of ``(h, d)`` where a tile crosses a head, and TVM's
region analysis then gives the epilogue a loop over part of a head only, reading columns the tile did not
compute. ``tiles_are_boxes`` checks a whole tile (one size per axis) before a rule places an epilogue in it.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

_MAX_POINTS = 1 << 20        # iterator grids evaluated with numpy; larger ones are not analysed

_BINARY = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply, tirx.FloorDiv: np.floor_divide,
           tirx.FloorMod: np.mod, tirx.Min: np.minimum, tirx.Max: np.maximum}


def _evaluate(expr, env: dict):
    """``expr`` over integer numpy arrays (``env``: iterator name -> values), None for anything but integer
    arithmetic of iterators and constants."""
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, tirx.Var):
        return env.get(expr.name)
    if isinstance(expr, tirx.Cast):
        return _evaluate(expr.value, env)
    op = _BINARY.get(type(expr))
    if op is None:
        return None
    a, b = _evaluate(expr.a, env), _evaluate(expr.b, env)
    return None if a is None or b is None else op(a, b)


def exact_row_blocks(stmt, buf, axis: int, rows: int, candidates) -> list | None:
    """The row counts of ``candidates`` whose blocks (``[k*r, (k+1)*r)`` of axis ``axis`` of ``buf``, ``rows``
    rows in all) the block ``stmt`` reads as boxes of its own iteration space, in the order given; None when
    ``stmt`` does not read ``buf`` or its row index is not integer arithmetic of static iterators."""
    region = next((r.region for r in stmt.reads if r.source.same_as(buf)), None)
    if region is None:
        return None
    index = region[axis].min
    if isinstance(index, tirx.Var):
        return list(candidates)                 # rows one to one with an iterator: any block is a box
    grid = _grid(stmt, [index])
    if grid is None:
        return None
    coords, (row,) = grid
    return [r for r in candidates if r >= rows or _boxes(row // r, coords)]


def tiles_are_boxes(stmt, buf, tiles) -> bool:
    """Does ``stmt`` read every tile of ``buf`` as one box of its own iteration space, each of its iterations
    reading one tile only? A tile is ``tiles[a]`` consecutive indices of axis ``a`` from a multiple of
    ``tiles[a]`` (None: the whole axis). False when ``stmt`` does not read ``buf``, reads a window of it, or
    its indices are not integer arithmetic of static iterators small enough to evaluate: the caller then
    does not place ``stmt`` per tile."""
    regions = [r.region for r in stmt.reads if r.source.same_as(buf)]
    if not regions or any(len(reg) != len(tiles) for reg in regions):
        return False
    if any(not (isinstance(rg.extent, tirx.IntImm) and int(rg.extent) == 1) for reg in regions for rg in reg):
        return False
    tiled = [a for a, t in enumerate(tiles) if t is not None]
    indices = [reg[a].min for reg in regions for a in tiled]
    plain = [i for i in indices if isinstance(i, tirx.Var)]
    distinct = all(not a.same_as(b) for k, a in enumerate(plain) for b in plain[k + 1:])
    if len(regions) == 1 and distinct and all(isinstance(i, (tirx.Var, tirx.IntImm)) for i in indices):
        return True                             # each tiled axis one to one with its own iterator
    grid = _grid(stmt, indices)
    if grid is None:
        return False
    coords, values = grid
    ids = []
    for r in range(len(regions)):
        tile = np.zeros(values[0].shape, dtype=np.int64)
        for k, a in enumerate(tiled):
            q = values[r * len(tiled) + k] // tiles[a]
            tile = tile * (int(q.max()) + 1) + q
        ids.append(tile)
    if any(not np.array_equal(ids[0], other) for other in ids[1:]):
        return False                            # one iteration reads two tiles
    return _boxes(ids[0], coords)


def _grid(stmt, exprs):
    """(each iterator's values, each expression's values) over every point of the iterators ``exprs`` use,
    None when one is symbolic, the grid is too large or an expression is not integer arithmetic."""
    ivs = [iv for iv in stmt.iter_vars if any(_uses(e, iv.var) for e in exprs)]
    extents = [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else None for iv in ivs]
    if None in extents or math.prod(extents) > _MAX_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in extents], indexing="ij") if ivs else []
    env = {iv.var.name: g.reshape(-1) for iv, g in zip(ivs, grids)}
    values = []
    for e in exprs:
        v = _evaluate(e, env)
        if v is None:
            return None
        values.append(np.broadcast_to(np.asarray(v, dtype=np.int64), (math.prod(extents),)))
    return [g.reshape(-1) for g in grids], values


def _boxes(block, coords) -> bool:
    """Is each block's set of points (``block``: its id per point) the whole box its coordinates span?"""
    n = int(block.max()) + 1 if block.size else 0
    count = np.bincount(block, minlength=n)
    box = np.ones(n, dtype=np.int64)
    for c in coords:
        lo = np.full(n, np.iinfo(np.int64).max)
        hi = np.full(n, -1)
        np.minimum.at(lo, block, c)
        np.maximum.at(hi, block, c)
        box *= np.where(count > 0, hi - lo + 1, 0)
    return bool(np.array_equal(count, box))


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in collect_vars_used_in_prim_expr(expr))
