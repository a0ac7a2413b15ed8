"""Index arithmetic of legalized layout ops, simplified with the iterators' bounds before a rule reads a kernel.

TVM legalizes a reshape by flattening and unflattening: ``reshape(197 x 2304 -> 197 x 1 x 3 x 768)`` reads
``X[((c * 768 + d) // 2304 + r) % 197, 0, (c * 768 + d) % 2304]``. With ``c < 3`` and ``d < 768`` that is
``X[r, 0, c * 768 + d]``, but nothing simplifies it on the way: inlined into a GEMM's epilogue, the ``% 197``
made the region analysis give the epilogue *every* row of the GEMM's tile column, so the accumulator that
should have been one register block in UB was compacted to all 197 rows of it (vit_b_16's QKV projection:
201728 B of UB against 188416 usable, where the grouping had sized one tile). Simplified, the epilogue reads
the tile's own rows and the buffer is the tile the grouping counted.

Only index expressions holding a floor division or modulo are rewritten, and only when the simplified form
holds fewer of them: loops, iterators and plain indices stay exactly as they were (the rules' matchers
want bare iterators; TVM's own StmtSimplify would also fold unit iterators into constants).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer
from tvm.tirx.expr import BufferLoad
from tvm.tirx.stmt import BufferRegion

_DIVMOD = (tirx.FloorDiv, tirx.FloorMod)


def _divmods(expr) -> int:
    found = []
    tvm_ffi.structural_walk(expr, (_DIVMOD, found.append))
    return len(found)


def simplify_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the div/mod index expressions of its blocks simplified under the block iterators'
    bounds (``func`` itself when none simplifies)."""
    if not isinstance(func, tirx.PrimFunc) or not _divmods(func.body):
        return func
    analyzer = Analyzer()
    bound = []

    def bind(block):
        for iv in block.iter_vars:
            if isinstance(iv.dom.extent, tirx.IntImm):
                analyzer.bind(iv.var, iv.dom)
                bound.append(iv.var)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, bind))
    if not bound:
        return func
    changed = []

    def simpler(index):
        n = _divmods(index)
        if not n:
            return index
        new = analyzer.simplify(index)
        if _divmods(new) < n:
            changed.append(index)
            return new
        return index

    def on_load(load):
        if not isinstance(getattr(load.source, "ty", None), tirx.BufferType):
            return load
        indices = [simpler(i) for i in load.indices]
        if all(a.same_as(b) for a, b in zip(indices, load.indices)):
            return load
        return BufferLoad(load.source, indices)

    def on_store(store):
        indices = [simpler(i) for i in store.indices]
        if all(a.same_as(b) for a, b in zip(indices, store.indices)):
            return store
        return tirx.BufferStore(store.buffer, store.value, indices)

    def on_region(region):
        if not isinstance(getattr(region.source, "ty", None), tirx.BufferType):
            return region
        ranges = [tvm.ir.Range.from_min_extent(simpler(r.min), r.extent) if isinstance(r.extent, tirx.IntImm)
                  and int(r.extent) == 1 else r for r in region.region]
        if all(a.same_as(b) for a, b in zip(ranges, region.region)):
            return region
        return BufferRegion(region.source, ranges)

    new = tvm_ffi.structural_map(func, [(tvm.ir.expr.TensorLoad, on_load), (tirx.BufferStore, on_store),
                                        (tvm.ir.expr.TensorRegion, on_region)], order="post")
    return new if changed else func
