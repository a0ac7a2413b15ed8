"""Blocks of rows an epilogue can follow exactly.

A rule that computes a product per block of rows and then ``reverse_compute_at``s a layout epilogue under the
block loop (attention's head merge, Swin's window reverse: the rows of a 7x7 window written back as 7 image
rows of 7 pixels) gets, per block, the bounding box of the epilogue iterations that read the block's rows.
When a block's rows are no box in the epilogue's iteration space (32 rows of a 7-wide window: four whole
image rows and four pixels of the fifth), that box also covers rows of the next block, which are written
from an accumulator that does not hold them: wrong numbers, no error. ``exact_row_blocks`` says which row
counts per block map to boxes, by evaluating the epilogue's row index over its iterators.
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
    ivs = [iv for iv in stmt.iter_vars if _uses(index, iv.var)]
    if isinstance(index, tirx.Var):
        return list(candidates)                 # rows one to one with an iterator: any block is a box
    extents = [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else None for iv in ivs]
    if None in extents or math.prod(extents) > _MAX_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in extents], indexing="ij") if ivs else []
    row = _evaluate(index, {iv.var.name: g.reshape(-1) for iv, g in zip(ivs, grids)})
    if row is None:
        return None
    row = np.broadcast_to(np.asarray(row, dtype=np.int64), (math.prod(extents),))
    coords = [g.reshape(-1) for g in grids]
    out = []
    for r in candidates:
        if r >= rows:
            out.append(r)                       # one block: every iteration
            continue
        block = row // r
        n = int(block.max()) + 1
        count = np.bincount(block, minlength=n)
        box = np.ones(n, dtype=np.int64)
        for c in coords:
            lo = np.full(n, np.iinfo(np.int64).max)
            hi = np.full(n, -1)
            np.minimum.at(lo, block, c)
            np.maximum.at(hi, block, c)
            box *= np.where(count > 0, hi - lo + 1, 0)
        if np.array_equal(count, box):
            out.append(r)
    return out


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in collect_vars_used_in_prim_expr(expr))
