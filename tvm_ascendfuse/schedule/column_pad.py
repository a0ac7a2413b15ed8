"""Output columns padded to whole register blocks: a conv whose row no good register block divides.

The conv2d schedule unrolls a register block of ``owr`` output columns (``conv_schedule.py``). A row ``owr``
does not divide (71, 73 and 149 columns are prime: Inception-v3's stem; 17 on its 17x17 stage) either leaves
a tail, which puts every column of the unrolled block (its FMAs, init and store) under a condition, or takes a
block whose columns divide the row and which may be one column wide, each weight vector then feeding a single
FMA (4 vectors x 1 column on a 16-register host for 71 columns). Here the conv instead computes ``padded``
columns, the next multiple of ``owr``: its accumulator has ``padded`` columns, the columns past the row read
the input of the row's last column (so no read leaves the input), and the epilogue blocks still read only the
first OW of them, so the padded columns are computed and never stored. Only the epilogue's store of the last
block of a row is predicated (TVM bounds it when the epilogue is placed in the tile), the FMAs are not.

A rewrite of the unscheduled PrimFunc (TVM's schedule primitives cannot enlarge a block's iteration
domain), as ``channel_pad.py`` does for output channels: the conv block's column iterator and its loop get
the padded extent, its accumulator is replaced by a padded one, and its reads of every other buffer index
``min(x, OW - 1)``. A shared module: it imports no rule.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx


def padded_columns(width: int, owr: int) -> int | None:
    """Columns of a row of ``width`` padded to whole blocks of ``owr`` when ``owr`` leaves a tail of a row it
    fits in; else None."""
    if owr <= 1 or width % owr == 0 or width < owr:
        return None
    return -(-width // owr) * owr


def _find_realize(stmt, name):
    found = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlockRealize,
                                   lambda r: found.append(r) if r.block.name_hint == name else None))
    return found[0] if len(found) == 1 else None


def _swap(node, old, new):
    return tvm_ffi.structural_map(node, (tvm.ir.Var, lambda v: new if v.same_as(old) else v))


def _clamp_reads(node, keep, var, repl):
    """``node`` with ``var`` replaced by ``repl`` in the indices of every load of a buffer other than ``keep``."""
    def on_load(ld):
        if ld.source.same_as(keep):
            return ld
        idx = [tvm_ffi.structural_map(i, (tvm.ir.Var, lambda v: repl if v.same_as(var) else v))
               for i in ld.indices]
        return tirx.BufferLoad(ld.source, idx)
    return tvm_ffi.structural_map(node, (tvm.ir.expr.TensorLoad, on_load))


def _uses_var_elsewhere(node, var, acc) -> bool:
    """Does ``var`` occur in ``node`` other than in the indices of the accumulator ``acc`` and inside a ``min``
    the reads were clamped with?"""
    def blank(indices):
        return [tirx.IntImm(str(i.ty.dtype), 0) for i in indices]

    def has_var(expr):
        found = []
        tvm_ffi.structural_walk(expr, (tvm.ir.Var, lambda v: found.append(v) if v.same_as(var) else None))
        return bool(found)

    rest = tvm_ffi.structural_map(node, [
        (tvm.ir.expr.TensorLoad, lambda ld: tirx.BufferLoad(ld.source, blank(ld.indices))
         if ld.source.same_as(acc) else ld),
        (tirx.BufferStore, lambda st: tirx.BufferStore(st.buffer, st.value, blank(st.indices))
         if st.buffer.same_as(acc) else st)])
    rest = tvm_ffi.structural_map(rest, (tirx.Min, lambda m: tirx.IntImm(str(m.ty.dtype), 0) if has_var(m) else m))
    return has_var(rest)


def pad_conv_columns(func: tirx.PrimFunc, conv_name: str, padded: int) -> tirx.PrimFunc | None:
    """``func`` with the conv block ``conv_name`` computing ``padded`` output columns (module docstring);
    None where the form is not the one this rewrite knows (the caller then keeps the unpadded kernel).

    Expects the legalized form: the conv block at the root in its own loop nest, its column iterator fourth
    (NCHW) and bound to a bare loop variable, and its accumulator a 4-D buffer of the function (not a
    parameter)."""
    root = func.body.block
    realize = _find_realize(func.body, conv_name)
    if realize is None or realize.block.init is None or len(realize.block.writes) != 1:
        return None
    block = realize.block
    acc = block.writes[0].source
    if not any(acc.same_as(b) for b in root.alloc_buffers) or len(acc.ty.shape) != 4:
        return None
    if len(block.iter_vars) < 4 or len(realize.iter_values) < 4 or not isinstance(realize.iter_values[3], tirx.Var):
        return None
    x_iv = block.iter_vars[3]
    if x_iv.iter_type != tirx.IterVar.DataPar or not isinstance(x_iv.dom.extent, tirx.IntImm) \
            or not isinstance(acc.ty.shape[3], tirx.IntImm) or int(acc.ty.shape[3]) != int(x_iv.dom.extent):
        return None
    width = int(x_iv.dom.extent)
    if padded <= width:
        return None
    itype = str(x_iv.var.ty.dtype) if hasattr(x_iv.var.ty, "dtype") else "int64"
    shape = list(acc.ty.shape)
    acc_p = tirx.decl_buffer([*shape[:3], tirx.IntImm(str(shape[3].ty.dtype), padded)], acc.ty.dtype,
                             f"{acc.name}_padded", scope=acc.ty.storage_scope)
    var = x_iv.var
    last = tirx.min(var, tirx.IntImm(itype, width - 1))
    body = _clamp_reads(_swap(block.body, acc, acc_p), acc_p, var, last)
    init = _swap(block.init, acc, acc_p)
    if _uses_var_elsewhere(body, var, acc_p) or _uses_var_elsewhere(init, var, acc_p):
        return None      # the column used other than as an index (a select on it): not rewritten
    ivs = list(block.iter_vars)
    ivs[3] = tirx.IterVar(tvm.ir.Range.from_min_extent(x_iv.dom.min, tirx.IntImm(itype, padded)), var,
                          x_iv.iter_type)
    params = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    buffers = params + [acc_p if b.same_as(acc) else b for b in root.alloc_buffers]
    draft = s_tir.SBlock(ivs, [], [], block.name_hint, body, init, list(block.alloc_buffers),
                         list(block.match_buffers), dict(block.annotations))
    reads, writes = s_tir.analysis.get_sblock_read_write_region(draft, {b: b for b in buffers})
    new_block = s_tir.SBlock(ivs, list(reads), list(writes), block.name_hint, body, init,
                             list(block.alloc_buffers), list(block.match_buffers), dict(block.annotations))
    loop_var = realize.iter_values[3]

    def on_block(b):
        if b.name_hint == conv_name:
            return new_block
        # every other block reading the accumulator reads it at the same indices, now inside the padded one
        return s_tir.SBlock(list(b.iter_vars), [tirx.BufferRegion(acc_p, r.region) if r.source.same_as(acc) else r
                                                for r in b.reads],
                            [tirx.BufferRegion(acc_p, w.region) if w.source.same_as(acc) else w for w in b.writes],
                            b.name_hint, _swap(b.body, acc, acc_p),
                            None if b.init is None else _swap(b.init, acc, acc_p), list(b.alloc_buffers),
                            list(b.match_buffers), dict(b.annotations))

    def on_for(loop):
        if loop.loop_var.same_as(loop_var):
            return tirx.For(loop.loop_var, loop.min, tirx.IntImm(str(loop.extent.ty.dtype), padded), loop.kind,
                            loop.body, loop.thread_binding, dict(loop.annotations))
        return loop

    new_body = tvm_ffi.structural_map(root.body, [(s_tir.SBlock, on_block), (tirx.For, on_for)])
    allocs = [acc_p if b.same_as(acc) else b for b in root.alloc_buffers]
    new_root = s_tir.SBlock(list(root.iter_vars), list(root.reads), list(root.writes), root.name_hint, new_body,
                            root.init, allocs, list(root.match_buffers), dict(root.annotations))
    return tirx.PrimFunc(func.params, s_tir.SBlockRealize([], True, new_root), func.ret_type, func.attrs)
