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

A tile can read as a box and still be given more iterations than it holds: a GEMM whose rows are a 14 x 14
plane padded to 14 x 16 in the accumulator (register blocks of 8 rows) is read by a flattening epilogue at
``acc[p // 14, p % 14]``; the last block of a plane row holds columns 8..13 (a box of 6 pixels) but TVM's
bound of the epilogue loop under it is 8 pixels from ``14 * y + 8``, two of which belong to the next row, are
computed by another task and read from its part of the accumulator (a race: wrong numbers on some runs).
``runs_each_point_once`` checks a placement itself: the placed block's bindings evaluated over all its
loops must reach every point of its iteration domain exactly once.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from .common import get_realize

MAX_POINTS = 1 << 20        # iterator grids evaluated with numpy; larger ones are not analysed

_BINARY = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply, tirx.FloorDiv: np.floor_divide,
           tirx.FloorMod: np.mod, tirx.Min: np.minimum, tirx.Max: np.maximum,
           tirx.LT: np.less, tirx.LE: np.less_equal, tirx.GT: np.greater, tirx.GE: np.greater_equal,
           tirx.EQ: np.equal, tirx.NE: np.not_equal, tirx.And: np.logical_and, tirx.Or: np.logical_or}


def evaluate_index(expr, env: dict):
    """``expr`` over integer numpy arrays (``env``: iterator name -> values), None for anything but integer
    arithmetic of iterators and constants."""
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, tirx.Var):
        return env.get(expr.name)
    if isinstance(expr, tirx.Cast):
        return evaluate_index(expr.value, env)
    op = _BINARY.get(type(expr))
    if op is None:
        return None
    a, b = evaluate_index(expr.a, env), evaluate_index(expr.b, env)
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


@dataclasses.dataclass(frozen=True)
class PointCounts:
    """How the loops around a block run the points of its iteration domain: ``domain`` points in all,
    ``twice`` of them run more than once, ``missed`` never run, and ``outside`` loop iterations that run a
    point outside the domain."""
    domain: int
    twice: int
    missed: int
    outside: int

    @property
    def once(self) -> bool:
        return self.twice == 0 and self.missed == 0 and self.outside == 0


def runs_each_point_once(sch, block) -> bool | None:
    """Does ``block``, where its loops place it now, run every point of its iteration domain exactly once
    (its bindings evaluated over all its loops, under its predicate)? None when that cannot be evaluated
    (a symbolic extent or binding, a group of loops of more than ``MAX_POINTS`` iterations, a non-integer
    expression)."""
    counts = point_counts(sch, block)
    return None if counts is None else counts.once


def point_counts(sch, block, copies: int = 0) -> PointCounts | None:
    """``PointCounts`` of ``block`` where its loops place it now; None as for ``runs_each_point_once``.

    ``copies``: the block's outermost ``copies`` loops each give their iterations a copy of the domain of their
    own (a buffer allocated inside them: TVM allocates a buffer at the innermost loop around all its
    accesses), so a point run once in each of two iterations of them is run once per copy. The domain is then
    the copies times the block's domain.

    The loops are evaluated in independent groups, not as one grid: two loops are in one group when a binding
    or a conjunct of the predicate uses both. The map from the loops' iterations to the domain is then a
    product of the groups' maps, and so are the counts (a point runs once iff its part in every group does;
    it runs at all iff every part does). A typical placed block binds most iterators to a loop of their own
    (groups of one loop, a few hundred points) and only a reshaped index to a few loops together, so a
    block of millions of iterations costs the numpy evaluation of its largest group only."""
    realize = get_realize(sch, block)
    fors = [sch.get(lp) for lp in sch.get_loops(block)]
    if any(not isinstance(f.extent, tirx.IntImm) or not isinstance(f.min, tirx.IntImm) for f in fors):
        return None
    ivs = realize.block.iter_vars
    if any(not isinstance(iv.dom.extent, tirx.IntImm) or not isinstance(iv.dom.min, tirx.IntImm) for iv in ivs):
        return None
    values, predicate = list(realize.iter_values), realize.predicate
    if len({f.loop_var.name for f in fors}) != len(fors):
        # two loops of one name (a placed block's ``ax1_0`` under a split's ``ax1_0``): the evaluation keys
        # loops by name, so each loop gets a fresh one
        fresh = [tirx.Var(f"loop{k}", f.loop_var.ty) for k, f in enumerate(fors)]
        values, predicate = (_renamed(e, fors, fresh) for e in (values, predicate))
        fors = [tirx.For(v, f.min, f.extent, f.kind, f.body) for v, f in zip(fresh, fors)]
    conjuncts = _conjuncts(predicate)
    # union-find over the loops, joined by every binding and predicate conjunct that uses several
    parent = list(range(len(fors)))

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def used(expr) -> list:
        found = collect_vars_used_in_prim_expr(expr)
        return [k for k, f in enumerate(fors) if any(v.same_as(f.loop_var) for v in found)]

    uses_iv = [used(v) for v in values]
    uses_pred = [used(c) for c in conjuncts]
    for ks in uses_iv + uses_pred:
        for k in ks[1:]:
            parent[find(k)] = find(ks[0])
    groups: dict = {}
    for k in range(len(fors)):
        groups.setdefault(find(k), ([], [], []))[0].append(k)
    constant = ([], [], [])          # bindings and conjuncts of no loop: one point, evaluated once
    for j, ks in enumerate(uses_iv):
        (groups[find(ks[0])] if ks else constant)[1].append(j)
    for j, ks in enumerate(uses_pred):
        (groups[find(ks[0])] if ks else constant)[2].append(j)
    runs = in_domain = reached = single = 1
    for loops, iv_ids, pred_ids in [constant, *groups.values()]:
        part = _group_counts(fors, loops, [ivs[j] for j in iv_ids], [values[j] for j in iv_ids],
                             [conjuncts[j] for j in pred_ids], [k for k in loops if k < copies])
        if part is None:
            return None
        g_runs, g_in, g_reached, g_single = part
        runs, in_domain, reached, single = runs * g_runs, in_domain * g_in, reached * g_reached, single * g_single
    domain = math.prod(int(iv.dom.extent) for iv in ivs) * math.prod(int(f.extent) for f in fors[:copies])
    return PointCounts(domain=domain, twice=reached - single, missed=domain - reached, outside=runs - in_domain)


def _renamed(expr, fors, fresh):
    def on_var(v):
        return next((new for f, new in zip(fors, fresh) if v.same_as(f.loop_var)), v)
    return tvm_ffi.structural_map(expr, (tvm.ir.Var, on_var))


def _conjuncts(pred) -> list:
    if isinstance(pred, tirx.And):
        return _conjuncts(pred.a) + _conjuncts(pred.b)
    if isinstance(pred, tirx.IntImm) and int(pred.value):
        return []
    return [pred]


def _group_counts(fors, loops, ivs, values, conjuncts, copy_loops=()):
    """(loop iterations that run, of them those inside the domain, domain points reached, points reached once)
    of one group: ``loops`` (positions in ``fors``), the iterators bound by them and the predicate's
    conjuncts over them, ``copy_loops`` those of ``loops`` whose iterations each have a copy of the domain
    (their values are coordinates of the points too); None when it cannot be evaluated."""
    extents = [int(fors[k].extent) for k in loops]
    points = math.prod(extents)
    if points > MAX_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) + int(fors[k].min) for e, k in zip(extents, loops)],
                        indexing="ij") if loops else []
    env = {fors[k].loop_var.name: g.reshape(-1) for k, g in zip(loops, grids)}
    run = np.ones(points, dtype=bool)
    for c in conjuncts:
        v = evaluate_index(c, env)
        if v is None:
            return None
        run &= np.broadcast_to(np.asarray(v, dtype=bool), (points,))
    dims = [int(iv.dom.extent) for iv in ivs]
    inside = run.copy()
    coords = []
    for iv, value, d in zip(ivs, values, dims):
        v = evaluate_index(value, env)
        if v is None:
            return None
        v = np.broadcast_to(np.asarray(v, dtype=np.int64), (points,)) - int(iv.dom.min)
        inside &= (v >= 0) & (v < d)
        coords.append(v)
    for k in copy_loops:
        coords.append(env[fors[k].loop_var.name] - int(fors[k].min))
        dims.append(int(fors[k].extent))
    runs, hits_in = int(run.sum()), int(inside.sum())
    size = math.prod(dims)
    if not dims:
        return runs, hits_in, int(hits_in > 0), int(hits_in == 1)
    flat = np.ravel_multi_index([c[inside] for c in coords], dims)
    if size <= 4 * MAX_POINTS:
        hits = np.bincount(flat, minlength=size)
        return runs, hits_in, int((hits > 0).sum()), int((hits == 1).sum())
    _, counts = np.unique(flat, return_counts=True)       # a large domain reached by few iterations
    return runs, hits_in, int(counts.size), int((counts == 1).sum())


def reads_tiles_one_to_one(stmt, buf, tiles) -> bool:
    """Does ``stmt`` read ``buf`` once, each tiled axis at an iterator of its own or a constant (no reshape
    between them)? Then TVM's bound of the iterations under a tile is the tile itself."""
    regions = [r.region for r in stmt.reads if r.source.same_as(buf)]
    if len(regions) != 1 or len(regions[0]) != len(tiles):
        return False
    indices = [regions[0][a].min for a, t in enumerate(tiles) if t is not None]
    plain = [i for i in indices if isinstance(i, tirx.Var)]
    distinct = all(not a.same_as(b) for k, a in enumerate(plain) for b in plain[k + 1:])
    return distinct and all(isinstance(i, (tirx.Var, tirx.IntImm)) for i in indices)


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
    if reads_tiles_one_to_one(stmt, buf, tiles):
        return True                             # each tiled axis one to one with its own iterator
    if len(regions) == 1:
        # axes whose indices share no iterator are independent: a tile is a box iff its part in every group
        # of axes sharing iterators is one (a packed accumulator's f // 16 and f % 16 form one group, the
        # rows another); the groups' grids are small where the whole one would not be evaluated
        groups = _independent_groups(stmt, indices)
        if len(groups) > 1:
            return all(_tile_boxes(stmt, [indices[k] for k in g], [tiles[tiled[k]] for k in g], 1)
                       for g in groups)
    return _tile_boxes(stmt, indices, [tiles[a] for a in tiled], len(regions))


def _independent_groups(stmt, indices) -> list:
    """The positions of ``indices`` grouped so that no two groups use a common iterator of ``stmt``."""
    uses = [{iv.var.name for iv in stmt.iter_vars if _uses(e, iv.var)} for e in indices]
    groups: list = []
    for k, names in enumerate(uses):
        merged = [g for g in groups if names & g[1]]
        for g in merged:
            groups.remove(g)
        groups.append(([k] + [i for g in merged for i in g[0]], names.union(*(g[1] for g in merged))))
    return [sorted(g[0]) for g in groups]


def _tile_boxes(stmt, indices, sizes, n_regions) -> bool:
    """``tiles_are_boxes`` over ``indices`` (``n_regions`` reads of ``len(sizes)`` tiled axes each, in order)."""
    grid = _grid(stmt, indices)
    if grid is None:
        return False
    coords, values = grid
    per = len(sizes)
    ids = []
    for r in range(n_regions):
        tile = np.zeros(values[0].shape, dtype=np.int64)
        for k in range(per):
            q = values[r * per + k] // sizes[k]
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
    if None in extents or math.prod(extents) > MAX_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in extents], indexing="ij") if ivs else []
    env = {iv.var.name: g.reshape(-1) for iv, g in zip(ivs, grids)}
    values = []
    for e in exprs:
        v = evaluate_index(e, env)
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


def loop_tiles(sch, block, loop) -> list | None:
    """The tile of ``block``'s output one iteration of ``loop`` (one of its loops) writes, per axis of that
    output: how many consecutive indices of the axis the loops nested inside ``loop`` sweep (None: the whole
    axis), for ``tiles_are_boxes``. None when an index is not integer arithmetic of static loops or a tile
    does not start at a multiple of its size (then nothing can be placed per tile)."""
    realize = get_realize(sch, block)
    loops = list(sch.get_loops(block))
    pos = next((k for k, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(loop))), None)
    if pos is None:
        return None
    write = realize.block.writes[0]
    # only the loops the written indices depend on (a conv's reduction loops would make the grid huge)
    used = [iv.var for iv in realize.block.iter_vars if any(_uses(rg.min, iv.var) for rg in write.region)]
    binding = {iv.var.name: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)
               if any(iv.var.same_as(u) for u in used)}
    fors = [sch.get(lp) for lp in loops]
    outer = fors[:pos + 1]
    inner = [f for f in fors[pos + 1:] if any(_uses(v, f.loop_var) for v in binding.values())]
    extents = [int(f.extent) if isinstance(f.extent, tirx.IntImm) else None for f in inner]
    if None in extents or math.prod(extents) > MAX_POINTS:
        return None
    shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in write.source.ty.shape]
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in extents], indexing="ij") if inner else []
    tiles = []
    for axis, rg in enumerate(write.region):
        tile = []
        for outer_at in (0, 1):          # the first two tiles along the outermost tiled loop: same size, aligned
            env = {f.loop_var.name: np.int64(outer_at if k == pos else 0) for k, f in enumerate(outer)}
            env.update({f.loop_var.name: np.int64(0) for f in fors[pos + 1:]})
            env.update({f.loop_var.name: g.reshape(-1) for f, g in zip(inner, grids)})
            env.update({name: evaluate_index(value, env) for name, value in binding.items()})
            if any(v is None for v in env.values()):
                return None
            idx = evaluate_index(rg.min, env)
            if idx is None:
                return None
            idx = np.atleast_1d(idx)
            tile.append((int(idx.min()), int(idx.max()) + 1))
        (lo, hi), (next_lo, _) = tile
        size = hi - lo
        if shape[axis] is None or lo % size or next_lo % size:
            return None
        tiles.append(None if size >= shape[axis] else size)
    return tiles
