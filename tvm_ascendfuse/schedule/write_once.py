"""Each point of an output block's domain run once: the schedule phase's check on every rule's schedule.

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

Which blocks: those writing a kernel output (a parameter buffer), since two tasks writing one output element
race in memory every caller sees. A block writing a buffer the kernel allocates is not checked: the rules
recompute such blocks on purpose (a conv's padded input staged per tile with its halo rows, the overlap read
by two tiles), each task into its own copy or with the same values, and a wrong value computed into one
reaches an output only through a block that is checked here or by the numerical checks.

A block that writes some output points twice by design carries ``OVERLAPPING_WRITES`` (the depthwise conv's
overlapping channel blocks, ``channel_overlap.py``: the same values from both blocks) and is not checked.

Cost: both checks evaluate with numpy, in groups of loops (iterators) that no index couples, so a block of
millions of iterations costs its largest group, usually a reshape's few loops; a group of more than
``row_blocks._MAX_POINTS`` is not evaluated (the block is not reported).
"""

from __future__ import annotations

import dataclasses

import math

import numpy as np
from tvm import tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from .row_blocks import _MAX_POINTS, PointCounts, _evaluate, point_counts

# block annotation: this block writes points of its output more than once on purpose, with equal values
OVERLAPPING_WRITES = "ascendfuse.overlapping_writes"


@dataclasses.dataclass(frozen=True)
class Race:
    """A block writing output ``output`` whose loops do not run each point of its domain once."""
    block: str
    output: str
    counts: PointCounts
    elements_twice: int = 0         # output elements two data-parallel points of the block write

    def describe(self) -> str:
        c = self.counts
        parts = [f"{c.twice} of its {c.domain} points run more than once"] if c.twice else []
        if c.missed:
            parts.append(f"{c.missed} never")
        if c.outside:
            parts.append(f"{c.outside} iterations outside its domain")
        if self.elements_twice:
            parts.append(f"{self.elements_twice} output elements written by two of its points")
        return f"block {self.block} (writing output {self.output}): " + ", ".join(parts)


def output_races(sch) -> list[Race]:
    """Every block of ``sch``'s function ``main`` that writes a kernel output and that its loops do not run
    once per point of its domain (``row_blocks.point_counts``). Blocks it cannot evaluate (symbolic extents,
    a group of loops over ``row_blocks._MAX_POINTS`` iterations, non-integer bindings) and blocks marked
    ``OVERLAPPING_WRITES`` are not reported."""
    func = sch.mod["main"]
    params = [p for p in func.params if isinstance(getattr(p, "ty", None), tirx.BufferType)]
    races = []
    for rv in _all_blocks(sch):
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
    return races


def elements_written_twice(block, buf) -> int | None:
    """How many elements of ``buf`` two or more data-parallel points of ``block``'s domain write (its write
    indices evaluated over the data-parallel iterators; reduction iterators may not occur in them). None when
    that cannot be evaluated: a write of more than one element per point (a blockized block), a symbolic
    extent, an index that is not integer arithmetic of the iterators, a group over ``_MAX_POINTS``."""
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
        if points > _MAX_POINTS:
            return None
        if not index_ids:
            reached, single = reached, single * (1 if points == 1 else 0)
            continue
        grids = np.meshgrid(*[np.arange(e, dtype=np.int64) + int(ivs[k].dom.min) for e, k in zip(extents, members)],
                            indexing="ij")
        env = {ivs[k].var.name: g.reshape(-1) for k, g in zip(members, grids)}
        values = []
        for j in index_ids:
            v = _evaluate(indices[j], env)
            if v is None:
                return None
            values.append(np.broadcast_to(np.asarray(v, dtype=np.int64), (points,)))
        _, counts = np.unique(np.stack(values), axis=1, return_counts=True)
        reached, single = reached * int(counts.size), single * int((counts == 1).sum())
    return reached - single


def _all_blocks(sch) -> list:
    """Every block of ``main`` below its root, as block handles (names can repeat, so no lookup by name)."""
    root = sch.get_sblock(sch.mod["main"].body.block.name_hint, func_name="main")
    out, todo = [], [root]
    while todo:
        children = sch.get_child_blocks(todo.pop())
        out += list(children)
        todo += list(children)
    return out
