"""Each point of a block's domain run once, each output element written once: a check on every rule's schedule.

A rule that places a block per tile (``reverse_compute_at`` of an epilogue under a tile loop) gets TVM's bound
of the block's iterations under one tile; where the block reads the tile through a reshape, that bound can be
larger than the tile and reach into the next one (GCViT's QKV projection: rows of a 14 x 14 plane padded to
16 in the accumulator, an epilogue under an 8-row register block given 8 pixels where the tile held 6). The
next tile's points then run in two tasks, one of which reads an accumulator that does not hold them: a race,
wrong numbers on some runs, no error. Rules check their own placements where they know the risk
(``row_blocks.runs_each_point_once``); this check runs on whatever any rule returns.

Two checks per block: its loops run each point of its iteration domain once (``row_blocks.point_counts``), and
its data-parallel points write distinct elements of the output (``elements_written_twice``; reduction
iterators write one element many times by definition). The first catches placements, the second rewrites of a
block's indices (a rule that remaps iterators, as the channel overlap does on purpose).

Which blocks: those writing a kernel output (a parameter buffer), where two tasks writing one element race in
memory every caller sees; and those writing a buffer of the kernel's own, counted per copy of it: TVM allocates
such a buffer inside the innermost loop around all the blocks that access it, so the iterations of the loops
above that point each have a copy, and a point computed again in another copy is the rules' intended
recomputation (a conv's padded input staged per tile with its halo rows, a key transpose per query block).
A point run twice within one copy is the race again: a buffer shared by the tasks (the blocks accessing it
placed apart, one at the root), written by two of them, one from a tile that does not hold the point (or, in
one task, written twice in turn, the later value kept whichever is right). Only
the domain check is made there: an intermediate's index map may overlap on purpose, and points never run are
points never read (a padded border a tile does not need).

A block that writes some output points twice by design carries ``OVERLAPPING_WRITES`` (the depthwise conv's
overlapping channel blocks, ``channel_overlap.py``: the same values from both blocks) and is not checked.

Cost: both checks evaluate with numpy, in groups of loops (iterators) that no index couples, so a block of
millions of iterations costs its largest group, usually a reshape's few loops; a group of more than
``row_blocks.MAX_POINTS`` is not evaluated (the block is not reported).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm import tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from .row_blocks import MAX_POINTS, PointCounts, evaluate_index, point_counts

# block annotation: this block writes points of its output more than once on purpose, with equal values
OVERLAPPING_WRITES = "ascendfuse.overlapping_writes"


@dataclasses.dataclass(frozen=True)
class Race:
    """A block writing ``buffer`` (a kernel output when ``output``, else a buffer of the kernel's own, per copy)
    whose loops do not run each point of its domain once, or that writes an output element from two points."""
    block: str
    buffer: str
    counts: PointCounts
    elements_twice: int = 0         # output elements two data-parallel points of the block write
    output: bool = True

    def describe(self) -> str:
        c = self.counts
        parts = [f"{c.twice} of its {c.domain} points run more than once"] if c.twice else []
        if c.missed and self.output:
            parts.append(f"{c.missed} never")
        if c.outside:
            parts.append(f"{c.outside} iterations outside its domain")
        if self.elements_twice:
            parts.append(f"{self.elements_twice} output elements written by two of its points")
        what = f"output {self.buffer}" if self.output else f"{self.buffer}, a buffer of the kernel's own"
        return f"block {self.block} (writing {what}): " + ", ".join(parts)


def output_races(sch) -> list[Race]:
    """Every block of ``sch``'s function ``main`` that writes a kernel output and that its loops do not run
    once per point of its domain (``row_blocks.point_counts``) or whose points write an output element twice
    (``elements_written_twice``), then every block writing a buffer of the kernel that runs a point twice
    within one copy of the buffer (module docstring). Blocks that cannot be evaluated (symbolic extents, a
    group of loops over ``row_blocks.MAX_POINTS`` iterations, non-integer bindings) and blocks marked
    ``OVERLAPPING_WRITES`` are not reported."""
    func = sch.mod["main"]
    params = [p for p in func.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
    blocks = _all_blocks(sch)
    races = []
    for rv, _ in blocks:
        block = sch.get(rv)
        if OVERLAPPING_WRITES in block.annotations or not block.iter_vars:
            continue
        written = next((w.source for w in block.writes for p in params if w.source.same_as(p)), None)
        if written is None:
            continue
        counts = point_counts(sch, rv)
        twice = elements_written_twice(block, written)
        if (counts is not None and not counts.once) or twice:
            counts = counts or PointCounts(domain=0, twice=0, missed=0, outside=0)
            races.append(Race(block.name_hint, str(written.name), counts, twice or 0))
    return races + _intermediate_races(sch, func, blocks)


def _intermediate_races(sch, func, blocks) -> list[Race]:
    """The blocks writing a buffer allocated at the kernel's root that run a point twice within one copy of it
    (the copies: the iterations of the loops around all the blocks accessing it). Buffers accessed by a block
    nested in another (a blockized tile, whose loops are counted from its outer block) are not analysed."""
    races = []
    for buf in func.body.block.alloc_buffers:
        users = [(rv, top) for rv, top in blocks
                 if any(r.source.same_as(buf) for r in list(sch.get(rv).reads) + list(sch.get(rv).writes))]
        writers = [rv for rv, _ in users if any(w.source.same_as(buf) for w in sch.get(rv).writes)]
        if not writers or not all(top for _, top in users):
            continue
        nests = [[sch.get(lp) for lp in sch.get_loops(rv)] for rv, _ in users]
        shared = 0                  # loops around every access: each iteration has its own copy
        while all(len(n) > shared and n[shared].same_as(nests[0][shared]) for n in nests):
            shared += 1
        for rv in writers:
            block = sch.get(rv)
            if OVERLAPPING_WRITES in block.annotations or not block.iter_vars:
                continue
            counts = point_counts(sch, rv, copies=shared)
            if counts is not None and (counts.twice or counts.outside):
                races.append(Race(block.name_hint, str(buf.name), counts, output=False))
    return races


def elements_written_twice(block, buf) -> int | None:
    """How many elements of ``buf`` two or more data-parallel points of ``block``'s domain write (its write
    indices evaluated over the data-parallel iterators; reduction iterators may not occur in them). None when
    that cannot be evaluated: a write of more than one element per point (a blockized block), a symbolic
    extent, an index that is not integer arithmetic of the iterators, a group over ``MAX_POINTS``."""
    regions = [w.region for w in block.writes if w.source.same_as(buf)]
    if len(regions) != 1 or any(not (isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1)
                                for r in regions[0]):
        return None
    indices = [r.min for r in regions[0]]
    ivs = list(block.iter_vars)
    if any(not isinstance(iv.dom.extent, tirx.IntImm) or not isinstance(iv.dom.min, tirx.IntImm) for iv in ivs):
        return None
    uses = []
    for index in indices:
        found = collect_vars_used_in_prim_expr(index)
        uses.append([k for k, iv in enumerate(ivs) if any(v.same_as(iv.var) for v in found)])
    if any(ivs[k].iter_type != tirx.IterVar.DataPar for ks in uses for k in ks):
        return None                 # a reduction iterator in an output index: not a reduction's form
    parallel = [k for k, iv in enumerate(ivs) if iv.iter_type == tirx.IterVar.DataPar]
    # data-parallel iterators grouped by the indices that use them together; one no index uses writes the
    # same elements at each of its values
    parent = {k: k for k in parallel}

    def find(k):
        while parent[k] != k:
            k = parent[k]
        return k

    for ks in uses:
        for k in ks[1:]:
            parent[find(k)] = find(ks[0])
    groups: dict = {}
    for k in parallel:
        groups.setdefault(find(k), ([], []))[0].append(k)
    for j, ks in enumerate(uses):
        if ks:
            groups[find(ks[0])][1].append(j)
    reached = single = 1
    for members, index_ids in groups.values():
        extents = [int(ivs[k].dom.extent) for k in members]
        points = math.prod(extents)
        if points > MAX_POINTS:
            return None
        if not index_ids:
            reached, single = reached, single * (1 if points == 1 else 0)
            continue
        grids = np.meshgrid(*[np.arange(e, dtype=np.int64) + int(ivs[k].dom.min) for e, k in zip(extents, members)],
                            indexing="ij")
        env = {ivs[k].var.name: g.reshape(-1) for k, g in zip(members, grids)}
        values = []
        for j in index_ids:
            v = evaluate_index(indices[j], env)
            if v is None:
                return None
            values.append(np.broadcast_to(np.asarray(v, dtype=np.int64), (points,)))
        _, counts = np.unique(np.stack(values), axis=1, return_counts=True)
        reached, single = reached * int(counts.size), single * int((counts == 1).sum())
    return reached - single


def _all_blocks(sch) -> list:
    """(handle, whether its parent is the root) of every block of ``main`` below its root (names can repeat,
    so no lookup by name)."""
    root = sch.get_sblock(sch.mod["main"].body.block.name_hint, func_name="main")
    out, todo = [], [(root, None)]
    while todo:
        parent, _ = todo.pop()
        children = [(c, parent is root) for c in sch.get_child_blocks(parent)]
        out += children
        todo += children
    return out
