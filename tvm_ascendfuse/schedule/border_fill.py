"""The zero fill of a staged, padded input tile restricted to the border the input copy does not cover.

``decompose_padding`` splits a padding stage into a block that fills the whole tile with the pad value and
the in-bound copy that then overwrites all but the border: one extra store per staged element. A schedule
marks such a fill with the in-bound box (``mark_border_fill``); after scheduling, ``rewrite_border_fills``
makes the fill's column loop run, in a row the input fills, over the columns left and right of it only, and
over the whole row elsewhere: one nest with a row-dependent count, so every loop and block stays defined
once. A rewrite of the scheduled function, which no trace records: a rule makes it where it builds the kernel,
``tuned.finish_traced`` where a traced schedule becomes one. Shared: imports no rule.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

FILL_ANNOTATION = "ascendfuse.border_fill"   # on a fill block: (first row, end row, first col, end col) in bounds


def mark_border_fill(sch, fill, box) -> None:
    """Mark ``fill`` (a pad-value block of ``decompose_padding``) for ``rewrite_border_fills``; ``box``: the
    (first row, end row, first column, end column) of the tile the in-bound copy writes, in the tile
    buffer's row and column coordinates."""
    sch.annotate(fill, FILL_ANNOTATION, [int(v) for v in box])


def _box_of(realize):
    if not isinstance(realize, s_tir.SBlockRealize):
        return None
    ann = realize.block.annotations
    if not ann or FILL_ANNOTATION not in ann:
        return None
    box = [int(v) for v in ann[FILL_ANNOTATION]]
    return box if len(box) == 4 else None


def rewrite_border_fills(func) -> tuple:
    """``func`` with every zero fill marked by ``mark_border_fill`` storing only where the in-bound copy does
    not: whole rows outside the input's rows, and in the others the columns left and right of it. Returns
    (function, fills rewritten); a fill nest not of the form (rows, columns, vectorised channels) stays."""
    done = []

    def on_for(rows):
        cols = rows.body
        lanes = cols.body if isinstance(cols, tirx.For) else None
        realize = lanes.body if isinstance(lanes, tirx.For) else None
        box = _box_of(realize)
        if box is None \
                or len(realize.iter_values) != 4 or not realize.iter_values[3].same_as(cols.loop_var) \
                or not isinstance(cols.extent, tirx.IntImm) or not isinstance(cols.min, tirx.IntImm) \
                or int(cols.min) != 0:
            return rows
        row_lo, row_hi, col_lo, col_hi = box
        width = int(cols.extent)
        dt = str(cols.extent.ty.dtype)
        c = lambda v: tirx.IntImm(dt, v)  # noqa: E731
        left, right = min(max(col_lo, 0), width), max(width - max(col_hi, 0), 0)
        if left + right >= width:
            return rows
        # one nest (each loop and block defined once): the column loop runs over the left columns then
        # the right ones in an input row, over all columns elsewhere
        row, k = realize.iter_values[2], cols.loop_var
        inside = tirx.And(tirx.LE(c(row_lo), row), tirx.LT(row, c(row_hi)))
        column = tirx.Select(inside, k + tirx.Select(tirx.LT(k, c(left)), c(0), c(width - right - left)), k)
        new_realize = s_tir.SBlockRealize([*realize.iter_values[:3], column], realize.predicate, realize.block)
        new_lanes = tirx.For(lanes.loop_var, lanes.min, lanes.extent, lanes.kind, new_realize,
                             lanes.thread_binding, dict(lanes.annotations))
        new_cols = tirx.For(k, cols.min, tirx.Select(inside, c(left + right), c(width)), cols.kind, new_lanes,
                            cols.thread_binding, dict(cols.annotations))
        done.append(realize.block.name_hint)
        return tirx.For(rows.loop_var, rows.min, rows.extent, rows.kind, new_cols, rows.thread_binding,
                        dict(rows.annotations))

    out = tvm_ffi.structural_map(func, (tirx.For, on_for))
    return out, len(done)


