"""How one step of a loop moves through each buffer a block touches: the element stride of every access.

A vector loop loads and stores whole vectors only where its stride is 1 (contiguous) or 0 (the same element
for every lane, a broadcast); any other stride is a gather or a scatter. The fallback rule reads these
strides to decide which loop to vectorise, which trailing loops may be fused into one longer vector loop
(every access still contiguous or invariant across them), and which blocks read in another order than they
write (transposes: the read is contiguous along a loop the write is not).

Offsets are flattened (row-major) and written in the block's loop variables, so fused or split loops are
measured by what they do, not by how the block iterators are named.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from .common import get_realize

LOAD = tvm.ir.expr.TensorLoad


@dataclass(frozen=True)
class Access:
    buffer: object          # the buffer variable
    offset: object          # flat element offset, a PrimExpr in the block's loop variables
    write: bool


def _flat(indices, shape):
    offset, scale = None, None
    for idx, dim in zip(reversed(list(indices)), reversed(list(shape))):
        term = idx if scale is None else idx * scale
        offset = term if offset is None else offset + term
        scale = dim if scale is None else scale * dim
    return offset if offset is not None else tirx.const(0, "int64")


def accesses(sch: s_tir.Schedule, block) -> list[Access]:
    """Every load in the block's body and every store it makes, as flat offsets in its loop variables."""
    realize = get_realize(sch, block)
    stmt = realize.block
    pairs = list(zip([iv.var for iv in stmt.iter_vars], realize.iter_values))

    def bound(v):
        for var, value in pairs:
            if var.same_as(v):
                return value
        return v

    def in_loops(expr):
        return tvm_ffi.structural_map(expr, (tvm.ir.Var, bound))

    found = []

    def on_load(load):
        found.append(Access(load.source, in_loops(_flat(load.indices, load.source.ty.shape)), False))

    def on_store(store):
        found.append(Access(store.buffer, in_loops(_flat(store.indices, store.buffer.ty.shape)), True))

    tvm_ffi.structural_walk(stmt.body, [(LOAD, on_load), (tirx.BufferStore, on_store)])
    return found


def stride(access: Access, loop_var, analyzer: Analyzer | None = None) -> int | None:
    """Elements the access moves per step of ``loop_var``: an int, or None when that is not a constant (a
    gather by a computed index, a symbolic row length)."""
    analyzer = analyzer or Analyzer()

    def step(v):
        return v + 1 if v.same_as(loop_var) else v

    moved = tvm_ffi.structural_map(access.offset, (tvm.ir.Var, step))
    diff = analyzer.simplify(moved - access.offset)
    return int(diff) if isinstance(diff, tirx.IntImm) else None


def strides(sch: s_tir.Schedule, block, loop) -> list[int | None]:
    """``stride`` of every access of ``block`` along ``loop`` (stores first in body order, then loads)."""
    var = sch.get(loop).loop_var
    analyzer = Analyzer()
    return [stride(a, var, analyzer) for a in accesses(sch, block)]
