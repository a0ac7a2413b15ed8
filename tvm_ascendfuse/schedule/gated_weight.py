"""A conv whose input is gated per channel (``conv(x * g)``, SE's projection conv) computed as ``conv`` of
``x`` with the gate on the weight: ``C[n, f, y, x] += X[n, c, ..] * (W[f, c, r, s] * G[n, c])``.

The grouping puts SE's channel-wise ``x * gate`` in front of the projection conv (``grouping/conv_prologue``).
Left there, the multiply makes the conv's input a computed tensor, and every path of the conv2d schedule
that reads a plain input loses it: the input is materialised once at the root (one more pass and fork/join,
unvectorised on 7x7 and 14x14 planes), the NCHW[16]c staging gathers lane by lane instead of through the
register transpose, and the pixel-vector path (pointwise convs on 56x56 and 112x112 planes) is refused.
Moved onto the weight, the conv reads ``x`` as an ungated conv does and takes the same path; the multiply
is one per weight element a register block loads (a weight vector times a broadcast gate value on
channel vectors, reused by the block's columns; a scalar per broadcast weight on pixel vectors, reused by its
pixel vectors), not a pass over the input. Exact up to rounding: ``(x * g) * w`` vs ``x * (w * g)``.

A rewrite of the unscheduled PrimFunc (no schedule primitive moves a factor between operands): the multiply
block stores ``x`` alone, and the conv block multiplies its weight load by the gate. Applies where the
multiply block's only consumer is the conv's input block (its zero padding, or a copy for a 1x1 conv; zero
padding commutes with the per-channel scale), the gate varies along N and C only and is read at the
multiply's own (n, c), and dtypes agree. Shared by the conv rules; it imports no rule.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .analysis import LOAD, match_conv2d
from .common import new_schedule, root_blocks

GATED_NOTE = "gate on the weight"


def gate_on_weight(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with its conv's per-channel input gate moved onto the weight (module docstring), None when
    ``func`` has no such gate or its form is not the one this rewrite knows."""
    sch = new_schedule(tvm.IRModule({"main": func}))
    blocks = list(root_blocks(sch))
    convs = [b for b in blocks if match_conv2d(sch, b) is not None]
    if len(convs) != 1:
        return None
    conv = convs[0]
    info = match_conv2d(sch, conv)
    cstmt = sch.get(conv)
    data = cstmt.reads[info.data_read].source
    pad = _writer(sch, blocks, data)
    if pad is None or not _only_reader(sch, pad, conv):
        return None
    pstmt = sch.get(pad)
    src = _padded_copy_source(pstmt)
    if src is None:
        return None
    mul = _writer(sch, blocks, src)
    if mul is None or not _only_reader(sch, mul, pad):
        return None
    gate = _gate_of(sch.get(mul))
    if gate is None:
        return None
    x_load, g_load = gate
    gbuf = g_load.source
    if str(gbuf.ty.dtype) != str(info.weight_buf.ty.dtype):
        return None
    # the conv's (n, rc) iterators index the gate as the multiply's (n, c) did
    n, rc = cstmt.iter_vars[0].var, cstmt.iter_vars[4].var
    batch = g_load.indices[0]
    g_idx = [batch if isinstance(batch, tirx.IntImm) else n, rc, *g_load.indices[2:]]
    gate_in_conv = tirx.BufferLoad(gbuf, g_idx)
    weight = info.weight_buf
    mul_name, conv_name = sch.get(mul).name_hint, cstmt.name_hint

    def on_load(load):
        if load.source.same_as(weight):
            return tirx.Mul(load, gate_in_conv)
        return load

    def on_block(b):
        if b.name_hint == mul_name:
            store = b.body
            reads = [r for r in b.reads if not r.source.same_as(gbuf)]
            return s_tir.SBlock(list(b.iter_vars), reads, list(b.writes), b.name_hint,
                                tirx.BufferStore(store.buffer, x_load, store.indices), b.init,
                                list(b.alloc_buffers), list(b.match_buffers), dict(b.annotations))
        if b.name_hint == conv_name:
            store = b.body
            value = tvm_ffi.structural_map(store.value, (LOAD, on_load))
            one = tirx.IntImm(str(rc.ty.dtype) if hasattr(rc.ty, "dtype") else "int64", 1)
            region = tirx.BufferRegion(gbuf, [tvm.ir.Range.from_min_extent(i, one) for i in g_idx])
            annotations = dict(b.annotations)
            annotations["ascendfuse.gated_weight"] = 1
            return s_tir.SBlock(list(b.iter_vars), [*b.reads, region], list(b.writes), b.name_hint,
                                tirx.BufferStore(store.buffer, value, store.indices), b.init,
                                list(b.alloc_buffers), list(b.match_buffers), annotations)
        return b

    root = func.body.block
    body = tvm_ffi.structural_map(root.body, (s_tir.SBlock, on_block))
    new_root = s_tir.SBlock(list(root.iter_vars), list(root.reads), list(root.writes), root.name_hint, body,
                            root.init, list(root.alloc_buffers), list(root.match_buffers),
                            dict(root.annotations))
    out = tirx.PrimFunc(func.params, s_tir.SBlockRealize([], True, new_root), func.ret_type, func.attrs)
    # the multiply is a copy now: inlined, the conv's input block reads ``x`` as an ungated conv's does
    done = new_schedule(tvm.IRModule({"main": out}))
    try:
        done.compute_inline(done.get_sblock(mul_name))
    except s_tir.ScheduleError:
        return None
    return done.mod["main"]


def _writer(sch, blocks, buf):
    """The root block writing ``buf``, None when a parameter (or no single block) holds it."""
    found = [b for b in blocks if any(w.source.same_as(buf) for w in sch.get(b).writes)]
    return found[0] if len(found) == 1 else None


def _only_reader(sch, block, reader) -> bool:
    """``block`` writes one buffer, read by ``reader`` alone and not an output of the function."""
    stmt = sch.get(block)
    if len(stmt.writes) != 1:
        return False
    buf = stmt.writes[0].source
    if any(p.same_as(buf) for p in sch.mod["main"].params):
        return False
    consumers = sch.get_consumers(block)
    return len(consumers) == 1 and sch.get(consumers[0]).same_as(sch.get(reader))


def _padded_copy_source(stmt):
    """The buffer ``stmt`` copies, element (n, c) from element (n, c) (a 1x1 conv's copy, or zero padding:
    ``if_then_else(inside, src[..], 0)``), else None."""
    store = stmt.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) != 4 or len(stmt.iter_vars) != 4:
        return None
    value = store.value
    if isinstance(value, tvm.ir.expr.Call) and isinstance(value.op, tvm.ir.Op) \
            and value.op.name == "prim.if_then_else":
        _, inside, outside = value.args
        if not (isinstance(outside, (tirx.FloatImm, tirx.IntImm)) and float(outside.value) == 0.0):
            return None
        value = inside
    if not isinstance(value, LOAD) or len(value.indices) != 4:
        return None
    n, c = stmt.iter_vars[0].var, stmt.iter_vars[1].var
    if not all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(value.indices[:2], (n, c))):
        return None
    return value.source


def _gate_of(stmt):
    """(x load, gate load) when ``stmt`` stores ``x[n, c, h, w] * g[n or 0, c, 0, 0]`` (either order) at its
    own four iterators, ``g`` a 4-d buffer of (N or 1, C, 1, 1); else None."""
    store = stmt.body
    if not isinstance(store, tirx.BufferStore) or len(stmt.iter_vars) != 4 or stmt.init is not None:
        return None
    ivs = [iv.var for iv in stmt.iter_vars]
    if not all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(store.indices, ivs)):
        return None
    value = store.value
    if not isinstance(value, tirx.Mul):
        return None
    for x, g in ((value.a, value.b), (value.b, value.a)):
        if not (isinstance(x, LOAD) and isinstance(g, LOAD)) or len(x.indices) != 4 or len(g.indices) != 4:
            continue
        if not all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(x.indices, ivs)):
            continue
        shape = g.source.ty.shape
        if not all(isinstance(d, tirx.IntImm) and int(d) == 1 for d in shape[2:]):
            continue
        b, c, h, w = g.indices
        batch_ok = (isinstance(b, tirx.Var) and b.same_as(ivs[0])) or (
            isinstance(b, tirx.IntImm) and int(b) == 0 and isinstance(shape[0], tirx.IntImm) and int(shape[0]) == 1)
        if batch_ok and isinstance(c, tirx.Var) and c.same_as(ivs[1]) and all(
                isinstance(i, tirx.IntImm) and int(i) == 0 for i in (h, w)):
            return x, g
    return None
