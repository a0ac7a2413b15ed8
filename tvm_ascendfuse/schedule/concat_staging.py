"""A conv's staged input that is a concat: one loop per part, so no element chooses its source.

A legalized concatenate writes each element through a chain of ``if_then_else(b <= c, part_k[c - b], ...)``
on its channel index. Inlined into a conv's input staging (the padded or NCHW[vl]c copy the conv rule
makes, with a BN + ReLU prologue applied on the way), every staged element evaluates that chain: a branch
per element, and a loop LLVM cannot vectorise (SqueezeNet's squeeze convs over ``concat(e1x1, e3x3)``,
DenseNet's dense layers over the concat of all earlier outputs, Inception's branch concats).

``channel_parts`` reads the part boundaries from the chain; ``partition_channels`` splits the staging loop
over channels at them (``loop_partition``: one block per part), so inside each part's loop the conditions
are constants the lowering folds away, and the part is a straight copy (or affine map) that vectorises.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import ScheduleError

from .common import blocks_under, extent


def channel_parts(sch, block, channel_iter: int = 1) -> list[int] | None:
    """Sorted channel indices (strictly inside the channel range) where ``block``'s stored value switches
    from one concat part to the next, or None when its value does not choose by its channel iterator
    (the ``channel_iter``-th block iterator) alone.

    Conditions recognised: comparisons (``<``, ``<=``, ``>``, ``>=``) of the channel iterator with a
    constant; a choice by any other expression (a padding test on rows or columns stays as it is:
    it is not a concat's) is left out, a choice by the channel in another form makes the answer None."""
    stmt = sch.get(block)
    if len(stmt.iter_vars) <= channel_iter:
        return None
    chan = stmt.iter_vars[channel_iter].var
    size = stmt.iter_vars[channel_iter].dom.extent
    if not isinstance(size, tirx.IntImm):
        return None
    bounds: set[int] = set()
    other = [False]

    def names_channel(expr) -> bool:
        found = []
        tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: found.append(v.same_as(chan))))
        return any(found)

    def boundary(cond) -> int | None:
        """The first channel of the part the condition starts or ends at: ``b <= c``, ``b > c``, ``c < b``,
        ``c >= b`` switch at b; ``b < c``, ``b >= c``, ``c > b``, ``c <= b`` at b + 1."""
        for kind in (tirx.LE, tirx.GT, tirx.LT, tirx.GE):
            if not isinstance(cond, kind):
                continue
            for const, var, const_first in ((cond.a, cond.b, True), (cond.b, cond.a, False)):
                if isinstance(const, tirx.IntImm) and isinstance(var, tirx.Var) and var.same_as(chan):
                    at_b = (kind in (tirx.LE, tirx.GT)) == const_first
                    return int(const) + (0 if at_b else 1)
        return None

    def on_call(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "prim.if_then_else" and names_channel(call.args[0]):
            b = boundary(call.args[0])
            if b is None:
                other[0] = True
            else:
                bounds.add(b)

    tvm_ffi.structural_walk(stmt.body, (tvm.ir.expr.Call, on_call))
    inside = sorted(b for b in bounds if 0 < b < int(size))
    if other[0] or not inside:
        return None
    return inside


def partition_channels(sch, loop, bounds: list[int], unit: int = 1) -> list | None:
    """Split ``loop`` (over channels in chunks of ``unit``, from channel 0, no annotation yet) at ``bounds``
    into one loop per part; the blocks of the parts, in order, or None (schedule untouched) when a bound
    is not a multiple of ``unit`` or the loop is not the whole channel range."""
    n = extent(sch, loop)
    if n is None or any(b % unit for b in bounds) or bounds[-1] >= n * unit:
        return None
    edges = [b // unit for b in bounds]
    sizes = [b - a for a, b in zip([0] + edges, edges)]
    # loop_partition takes the sizes of all parts but the last (inferred: a given total equal to the
    # extent is refused)
    try:
        loops = sch.loop_partition(loop, [*sizes, None])
    except ScheduleError:      # refused before any change (an annotated loop, ...): keep the one block
        return None
    return [blocks_under(sch, lp)[0] for lp in loops]

