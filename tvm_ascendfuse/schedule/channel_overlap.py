"""Channel blocks of a depthwise conv that overlap at the end: full vectors for channel counts no vector divides.

The depthwise schedule keeps ``vl`` channels on the vector lanes, ``vl`` the widest power of two within a host
vector dividing the channel count C. ShuffleNetV2's 58, 116 and 232 channels give 2, 4 and 8 lanes of the 16
an AVX-512 register holds (MobileNetV3 and MNASNet: 72, 120, 200 and 184 give 8): each tap's FMA does an
eighth to a half of the work a full vector does, and the staging copy and the store move as many short
vectors. Here the kernel instead runs ``P = ceil(C / L)`` blocks of L (the full vector) channels, the last
block starting at C - L: it overlaps the block before it, whose channels it computes again (the same
values, stored twice), so every block is a full vector, no lane reads outside the tensors, and no padded
channel needs a zero.

A rewrite of the kernel after its prologue and epilogue are inlined (three blocks: the padded input stage,
the conv, the last epilogue block), before it is tiled (TVM's schedule primitives cannot enlarge a block's
iteration domain): the three blocks iterate over P * L "slots", slot s standing for channel
``src(s) = min(s // L * L, C - L) + s % L``. Buffers of the kernel (the stage, the accumulator) get P * L
channels indexed by the slot; every access to a tensor outside the kernel (input, bias, residual, output)
indexes ``src(slot)``. The epilogue writes a slot-indexed intermediate and a new last block copies it to the
output at ``src(slot)``, so the rule's NCHW store takes whole channel blocks as before. The weight is read
through a slot-indexed copy (a root block the weight pre-packing turns into a constant when the weight is
one, ``OVERLAP_WEIGHT_BLOCK``). A shared module: imports no rule.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .layout import PREPROC_ANNOTATION, is_layout_free
from .write_once import OVERLAPPING_WRITES

OVERLAP_WEIGHT_BLOCK = "weight_channel_overlap"
OVERLAP_STORE_BLOCK = "channel_overlap_store"


def overlapped_blocks(channels: int, lanes: int) -> int | None:
    """Channel blocks of ``lanes`` when C is not a multiple of a full vector but holds at least one; else None
    (a multiple runs as it is; fewer channels than lanes cannot fill a vector)."""
    if lanes <= 1 or channels % lanes == 0 or channels < lanes:
        return None
    return -(-channels // lanes)


def source_channel(slot, channels: int, lanes: int):
    """The channel slot ``slot`` computes: its block's start (the last block pulled back to C - lanes) plus
    its lane."""
    dt = str(slot.ty.dtype) if hasattr(slot.ty, "dtype") else "int64"
    lanes_c, last = tirx.IntImm(dt, lanes), tirx.IntImm(dt, channels - lanes)
    return tirx.min(tirx.floordiv(slot, lanes_c) * lanes_c, last) + tirx.floormod(slot, lanes_c)


def _find_realize(stmt, name):
    found = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlockRealize,
                                   lambda r: found.append(r) if r.block.name_hint == name else None))
    return found[0] if len(found) == 1 else None


def _like(buf, shape, name):
    ty = buf.ty
    return tirx.decl_buffer(shape, ty.dtype, name, scope=ty.storage_scope)


def _swap_buffers(node, mapping):
    def on_var(v):
        for old, new in mapping:
            if v.same_as(old):
                return new
        return v
    return tvm_ffi.structural_map(node, (tvm.ir.Var, on_var))


def _index_outside(node, outside, var, repl):
    """``node`` with ``var`` replaced by ``repl`` in the indices of every load of a buffer in ``outside``."""
    def on_load(ld):
        if not any(ld.source.same_as(b) for b in outside):
            return ld
        idx = [tvm_ffi.structural_map(i, (tvm.ir.Var, lambda v: repl if v.same_as(var) else v))
               for i in ld.indices]
        return tirx.BufferLoad(ld.source, idx)
    return tvm_ffi.structural_map(node, (tvm.ir.expr.TensorLoad, on_load))


def _uses_outside_indices(node, var, indexed) -> bool:
    """Does ``var`` occur in ``node`` other than in the indices of a load or store of a buffer in ``indexed``
    (the kernel's slot-indexed buffers, where it is the slot, and the tensors outside the kernel, whose loads
    ``_index_outside`` re-indexed by the channel the slot stands for)?"""
    def blank(indices):
        return [tirx.IntImm(str(i.ty.dtype), 0) if hasattr(i, "ty") and hasattr(i.ty, "dtype") else i
                for i in indices]

    def on_load(ld):
        return tirx.BufferLoad(ld.source, blank(ld.indices)) if any(ld.source.same_as(b) for b in indexed) \
            else ld

    def on_store(st):
        return tirx.BufferStore(st.buffer, st.value, blank(st.indices)) \
            if any(st.buffer.same_as(b) for b in indexed) else st

    rest = tvm_ffi.structural_map(node, [(tvm.ir.expr.TensorLoad, on_load), (tirx.BufferStore, on_store)])
    found = []
    tvm_ffi.structural_walk(rest, (tvm.ir.Var, lambda v: found.append(v) if v.same_as(var) else None))
    return bool(found)


def _regions(block, buffers):
    reads, writes = s_tir.analysis.get_sblock_read_write_region(block, {b: b for b in buffers})
    return list(reads), list(writes)


def _copy_nest(name, dst, dst_at, src, src_at, shape, itype, buffers, reads=None, annotations=None):
    """A root loop nest of one block over ``shape``: ``dst[dst_at(vars)] = src[src_at(vars)]``; its access
    regions detected from the body over ``buffers`` unless ``reads`` is given."""
    loops = [tirx.Var(f"{name}_i{i}", itype) for i in range(len(shape))]
    ivs = [tirx.IterVar(tvm.ir.Range.from_min_extent(tirx.IntImm(itype, 0), tirx.IntImm(itype, n)),
                        tirx.Var(f"v_{name}_{i}", itype), tirx.IterVar.DataPar) for i, n in enumerate(shape)]
    vs = [iv.var for iv in ivs]
    store = tirx.BufferStore(dst, tirx.BufferLoad(src, src_at(vs)), dst_at(vs))
    detected, writes = _regions(s_tir.SBlock(ivs, [], [], name, store), buffers)
    block = s_tir.SBlock(ivs, detected if reads is None else reads, writes, name, store, None, [], [],
                         dict(annotations or {}))
    stmt = s_tir.SBlockRealize(loops, True, block)
    for var, iv in reversed(list(zip(loops, ivs))):
        stmt = tirx.For(var, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def overlap_channel_blocks(func: tirx.PrimFunc, stage: str, conv: str, last: str, weight,
                           lanes: int) -> tirx.PrimFunc | None:
    """``func`` with the blocks ``stage``, ``conv`` and ``last`` running over overlapping channel blocks of
    ``lanes`` (module docstring); None where the form is not the one this rewrite knows (the caller then
    keeps the kernel as it is).

    Expects each of the three blocks at the root in its own loop nest, its channel iterator second and bound
    to a bare loop variable, the stage and the conv writing buffers of the kernel, ``last`` writing a
    parameter (the output) with the channel iterator second, and the conv reading ``weight`` (a parameter)."""
    root = func.body.block
    realizes = [_find_realize(func.body, n) for n in (stage, conv, last)]
    if None in realizes:
        return None
    s_r, c_r, e_r = realizes
    f_iv = c_r.block.iter_vars[1]
    if not isinstance(f_iv.dom.extent, tirx.IntImm):
        return None
    channels = int(f_iv.dom.extent)
    nb = overlapped_blocks(channels, lanes)
    if nb is None:
        return None
    slots = nb * lanes
    params = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    allocs = list(root.alloc_buffers)
    is_alloc = lambda b: any(b.same_as(a) for a in allocs)  # noqa: E731
    is_param = lambda b: any(b.same_as(p) for p in params)  # noqa: E731
    st_buf, acc, out = (r.block.writes[0].source for r in realizes)
    if any(len(r.block.writes) != 1 for r in realizes) or not (is_alloc(st_buf) and is_alloc(acc)) \
            or not is_param(out) or not is_param(weight):
        return None
    for r in realizes:
        iv = r.block.iter_vars[1]
        if len(r.iter_values) < 2 or not isinstance(r.iter_values[1], tirx.Var) \
                or not isinstance(iv.dom.extent, tirx.IntImm) or int(iv.dom.extent) != channels:
            return None
    for buf in (st_buf, acc):
        if len(buf.ty.shape) != 4 or not isinstance(buf.ty.shape[1], tirx.IntImm) \
                or int(buf.ty.shape[1]) != channels:
            return None
    w_shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in weight.ty.shape]
    if len(w_shape) != 4 or None in w_shape or w_shape[0] != channels:
        return None
    itype = str(f_iv.var.ty.dtype) if hasattr(f_iv.var.ty, "dtype") else "int64"
    wide = lambda shape: [shape[0], tirx.IntImm(str(shape[1].ty.dtype), slots), *shape[2:]]  # noqa: E731
    st_p = _like(st_buf, wide(list(st_buf.ty.shape)), f"{st_buf.name}_slots")
    acc_p = _like(acc, wide(list(acc.ty.shape)), f"{acc.name}_slots")
    if len(out.ty.shape) != 4:
        return None
    res_p = tirx.decl_buffer(wide(list(out.ty.shape)), out.ty.dtype, f"{out.name}_slots")
    w_p = tirx.decl_buffer([tirx.IntImm(itype, d) for d in [slots, *w_shape[1:]]], weight.ty.dtype,
                           f"{weight.name}_slots")
    outside = [p for p in params if not p.same_as(out)]
    all_bufs = params + allocs + [st_p, acc_p, res_p, w_p]

    slot_bufs = [st_p, acc_p, res_p, w_p]
    refused = []

    def widen(block, body, init=None):
        ivs = list(block.iter_vars)
        ivs[1] = tirx.IterVar(tvm.ir.Range.from_min_extent(ivs[1].dom.min, tirx.IntImm(itype, slots)),
                              ivs[1].var, ivs[1].iter_type)
        var = ivs[1].var
        body = _index_outside(body, outside, var, source_channel(var, channels, lanes))
        if init is not None:
            init = _index_outside(init, outside, var, source_channel(var, channels, lanes))
        # the channel used other than as an index (a concat's part chosen by ``c < 24`` in the staged input)
        # would still see the slot, not the channel it stands for: not rewritten
        indexed = slot_bufs + outside
        if _uses_outside_indices(body, var, indexed) or \
                (init is not None and _uses_outside_indices(init, var, indexed)):
            refused.append(block.name_hint)
        new = s_tir.SBlock(ivs, [], [], block.name_hint, body, init, list(block.alloc_buffers),
                           list(block.match_buffers), dict(block.annotations))
        reads, writes = _regions(new, all_bufs)
        return s_tir.SBlock(ivs, reads, writes, block.name_hint, body, init, list(block.alloc_buffers),
                            list(block.match_buffers), dict(block.annotations))

    def on_block(b):
        if b.name_hint == stage:
            return widen(b, _swap_buffers(b.body, [(st_buf, st_p)]))
        if b.name_hint == conv:
            mapping = [(st_buf, st_p), (acc, acc_p), (weight, w_p)]
            return widen(b, _swap_buffers(b.body, mapping),
                         _swap_buffers(b.init, mapping) if b.init is not None else None)
        if b.name_hint == last:
            return widen(b, _swap_buffers(b.body, [(acc, acc_p), (out, res_p)]))
        return b

    loop_vars = [r.iter_values[1] for r in realizes]

    def on_for(loop):
        if any(loop.loop_var.same_as(v) for v in loop_vars):
            return tirx.For(loop.loop_var, loop.min, tirx.IntImm(str(loop.extent.ty.dtype), slots), loop.kind,
                            loop.body, loop.thread_binding, dict(loop.annotations))
        return loop

    body = tvm_ffi.structural_map(root.body, [(s_tir.SBlock, on_block), (tirx.For, on_for)])
    if refused:
        return None

    # the output: the slot-indexed result copied to the channel each slot stands for
    o_shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in res_p.ty.shape]
    if None in o_shape:
        return None     # a symbolic batch: the copy nest's extent would be symbolic (not built here)
    at_channel = lambda vs: [vs[0], source_channel(vs[1], channels, lanes), *vs[2:]]  # noqa: E731
    # the last block's slots store channels C - L .. C - 1, some of which the block before stored too: the
    # same values (both computed from the same input, weight and bias channels), so the two stores of a
    # channel agree whichever task lands last; marked for the schedule phase's write-once check
    store_nest = _copy_nest(OVERLAP_STORE_BLOCK, out, at_channel, res_p, lambda vs: vs, o_shape, itype,
                            all_bufs, annotations={OVERLAPPING_WRITES: 1})
    # the weight: a slot-indexed copy, read whole (the pre-packing moves the block out of the kernel)
    w_full = [tvm.ir.Range.from_min_extent(tirx.IntImm(itype, 0), d) for d in weight.ty.shape]
    weight_nest = _copy_nest(OVERLAP_WEIGHT_BLOCK, w_p, lambda vs: vs, weight,
                             lambda vs: [source_channel(vs[0], channels, lanes), *vs[1:]],
                             [slots, *w_shape[1:]], itype, all_bufs, [tirx.BufferRegion(weight, w_full)])

    new_allocs = [st_p if b.same_as(st_buf) else acc_p if b.same_as(acc) else b for b in allocs] + [res_p, w_p]
    new_root = s_tir.SBlock(list(root.iter_vars), list(root.reads), list(root.writes), root.name_hint,
                            tirx.SeqStmt([weight_nest, body, store_nest]), root.init, new_allocs,
                            list(root.match_buffers), dict(root.annotations))
    return tirx.PrimFunc(func.params, s_tir.SBlockRealize([], True, new_root), func.ret_type, func.attrs)


def pack_overlap_weight(sch, func, weight, lanes: int) -> None:
    """Lay the slot-indexed weight out (P, 1, KH, KW, lanes) blocks, the layout the depthwise rule reads;
    annotated for the compile-time pre-packing when ``weight`` is a constant."""
    blk = sch.get_sblock(OVERLAP_WEIGHT_BLOCK)
    sch.transform_layout(blk, ("write", 0), lambda c, r, h, w: (c // lanes, r, h, w, c % lanes))
    if is_layout_free(func, weight):
        sch.annotate(blk, PREPROC_ANNOTATION, 1)
