"""Output channels padded to the host's vector width: a conv whose channel count no full vector divides.

A conv's register block keeps its output channels on the vector lanes (``conv_schedule.py``). With OC = 116
or 58 (ShuffleNetV2), 232 or 40, the widest vector dividing OC has 4, 2 or 8 lanes, so each FMA does a
quarter or an eighth of the work a full vector does. Here the conv instead computes ``padded`` channels
(the next multiple of the full vector): its weight gets zero rows up to ``padded`` (a block of its own at
the root, which the weight pre-packing turns into a compile-time constant when the weight is one), its
accumulator has ``padded`` channels, and the epilogue blocks still read only the first OC of them, so the
padded lanes are computed on zeros and never stored.

A rewrite of the unscheduled PrimFunc (TVM's schedule primitives cannot enlarge a block's iteration
domain): the conv block's channel iterator and its loop get the padded extent, the accumulator buffer and
the weight the conv reads are replaced by padded ones. Shared by the conv rules (the conv2d-padded rule, and
the pool rule for a conv in front of a pool: SqueezeNet's classifier conv of 1000 channels + ReLU + global
mean); it imports no rule. ``padding_pays`` is when to pad, ``pack_padded_weight`` how the padded weight
follows the register block the conv schedule chose.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .common import extent
from .conv_schedule import ConvOptions, choose_conv_tiles, pixel_vector_plan
from .layout import PREPROC_ANNOTATION, is_layout_free

WEIGHT_PAD_BLOCK = "weight_channel_pad"


def padding_pays(sch, block, info, before, hv, target) -> int | None:
    """The padded output channel count when padding the conv ``block`` (``info``: its ConvBlock; ``before``:
    the root blocks in front of it) takes fewer vector FMAs per broadcast input pixel than the conv2d
    schedule would: to the host's full vector where the widest power of two dividing OC is narrower (116
    channels: 8 full vectors instead of 29 of 4 lanes; 1000: 63 instead of 125 of 8 lanes; not 8 channels:
    one vector either way), or to an even count of full vectors where an odd count leaves a short row's
    register block one vector wide (``_paired_vectors``); and the conv does not run on pixel vectors (its
    channels are not on the lanes there); else None. Float convs only (an int8 x int8 -> int32 conv has
    rules of its own)."""
    loops = sch.get_loops(block)
    oc, oh, ow = extent(sch, loops[1]), extent(sch, loops[2]), extent(sch, loops[3])
    lanes = hv.lanes(info.out_dtype)
    if oc is None or ow is None or not str(info.out_dtype).startswith("float"):
        return None
    if oc % lanes == 0:
        padded = _paired_vectors(oc, ow, info.out_dtype, hv, target)
        if padded is None:
            return None
    else:
        vl = choose_conv_tiles(oc, ow, info.out_dtype, hv, target).vl
        padded = padded_channels(oc, lanes)
        if padded // lanes >= oc // vl:
            return None
    if pixel_vector_plan(ConvOptions(), sch, block, info, before, (oc, oh, ow), hv) is not None:
        return None
    return padded


# at most 1/PAIR_WASTE more channels computed than the conv has, for a register block twice as wide
PAIR_WASTE = 8


def _paired_vectors(oc: int, ow: int, dtype: str, hv, target) -> int | None:
    """OC rounded up to an even count of full vectors, when OC is an odd count of them (RegNet's 400 and
    784 channels: 25 and 49 vectors of 16) and the conv2d schedule's register block is then one vector by
    a short row (a 7x7 plane: 1 x 7, 7 of the host's accumulators, one broadcast input pixel per FMA) where
    the padded channels give a block of two vectors with at least twice the accumulators; and at most
    1/PAIR_WASTE of the FMAs are on padded channels (9+ vectors). Measured faster for 1x1 convs of 400
    channels on a 7x7 plane, warm and after a cache flush; rows long enough for a column block of half
    the accumulators keep one vector."""
    lanes = hv.lanes(dtype)
    padded = padded_channels(oc, 2 * lanes)
    if padded == oc or (padded - oc) * PAIR_WASTE > oc:
        return None
    t = choose_conv_tiles(oc, ow, dtype, hv, target)
    if t.vl != lanes or t.ocr != 1:
        return None
    p = choose_conv_tiles(padded, ow, dtype, hv, target)
    return padded if p.ocr * p.owr >= 2 * t.ocr * t.owr else None


def pack_padded_weight(sch, func, weight, ocb: int) -> None:
    """Lay the padded weight out (OC/ocb, IC, KH, KW, ocb) for the register block of ``ocb`` channels the
    conv schedule chose; computed once at compile time when ``weight`` is a constant of the pipeline (the
    conv rules' prepack does not see it: the padded weight is no parameter)."""
    pad = sch.get_sblock(WEIGHT_PAD_BLOCK)
    sch.transform_layout(pad, ("write", 0), lambda f, c, r, s: (f // ocb, c, r, s, f % ocb))
    if is_layout_free(func, weight):
        sch.annotate(pad, PREPROC_ANNOTATION, 1)


def padded_channels(oc: int, lanes: int) -> int:
    """The next multiple of ``lanes`` from ``oc``."""
    return -(-oc // lanes) * lanes


def _find_block(stmt, name):
    found = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, lambda b: found.append(b) if b.name_hint == name else None))
    return found[0] if len(found) == 1 else None


def _find_realize(stmt, block):
    found = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlockRealize,
                                   lambda r: found.append(r) if r.block.same_as(block) else None))
    return found[0] if len(found) == 1 else None


def _like(buf, shape, name):
    """A new buffer (Var) of ``buf``'s dtype and scope with ``shape``."""
    ty = buf.ty
    return tirx.decl_buffer(shape, ty.dtype, name, scope=ty.storage_scope)


def pad_conv_output_channels(func: tirx.PrimFunc, conv_name: str, weight, padded: int) -> tirx.PrimFunc | None:
    """``func`` with the conv block ``conv_name`` computing ``padded`` output channels (module docstring);
    None where the form is not the one this rewrite knows (the caller then keeps the unpadded kernel).

    Expects the legalized form: the conv block at the root in its own loop nest, bound trivially
    (block iterator i = loop i), its output channel iterator second (NCHW), its accumulator a buffer of the
    function (not a parameter: an output conv gets a copy block first, see ``with_output_copy``), and
    ``weight`` (OIHW) read at the bare output channel iterator."""
    root = func.body.block
    conv = _find_block(func.body, conv_name)
    if conv is None or conv.init is None or len(conv.writes) != 1:
        return None
    realize = _find_realize(func.body, conv)
    acc = conv.writes[0].source
    if realize is None or not any(acc.same_as(b) for b in root.alloc_buffers):
        return None
    f_iv = conv.iter_vars[1]
    oc = int(f_iv.dom.extent) if isinstance(f_iv.dom.extent, tirx.IntImm) else None
    loop_var = realize.iter_values[1]
    w_shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in weight.ty.shape]
    a_shape = list(acc.ty.shape)
    if oc is None or padded <= oc or not isinstance(loop_var, tirx.Var) or None in w_shape or w_shape[0] != oc \
            or len(a_shape) != 4 or not isinstance(a_shape[1], tirx.IntImm) or int(a_shape[1]) != oc:
        return None
    dtype = str(weight.ty.dtype)
    itype = f_iv.var.ty.dtype if hasattr(f_iv.var.ty, "dtype") else "int64"
    acc_p = _like(acc, [a_shape[0], tirx.IntImm(str(a_shape[1].ty.dtype), padded), *a_shape[2:]],
                  f"{acc.name}_chpad")
    wp_shape = [padded, *w_shape[1:]]
    w_p = tirx.decl_buffer([tirx.IntImm(itype, d) for d in wp_shape], dtype, f"{weight.name}_chpad")

    def swap(mapping):
        def on_var(v):
            for old, new in mapping:
                if v.same_as(old):
                    return new
            return v
        return lambda node: tvm_ffi.structural_map(node, (tvm.ir.Var, on_var))

    in_conv = swap([(weight, w_p)])
    everywhere = swap([(acc, acc_p)])

    def on_block(b):
        if b.name_hint == conv_name:
            ivs = list(b.iter_vars)
            ivs[1] = tirx.IterVar(tvm.ir.Range.from_min_extent(f_iv.dom.min, tirx.IntImm(itype, padded)),
                                  ivs[1].var, ivs[1].iter_type)
            return s_tir.SBlock(ivs, [in_conv(r) for r in b.reads], list(b.writes), b.name_hint,
                                in_conv(b.body), in_conv(b.init), list(b.alloc_buffers),
                                list(b.match_buffers), dict(b.annotations))
        return b

    def on_for(loop):
        if loop.loop_var.same_as(loop_var):
            return tirx.For(loop.loop_var, loop.min, tirx.IntImm(str(loop.extent.ty.dtype), padded), loop.kind,
                            loop.body, loop.thread_binding, dict(loop.annotations))
        return loop

    body = tvm_ffi.structural_map(root.body, [(s_tir.SBlock, on_block), (tirx.For, on_for)])
    body = everywhere(body)
    allocs = [acc_p if b.same_as(acc) else b for b in root.alloc_buffers] + [w_p]
    new_root = s_tir.SBlock(list(root.iter_vars), list(root.reads), list(root.writes), root.name_hint,
                            tirx.SeqStmt([_weight_pad_nest(weight, w_p, oc, padded, itype), body]), root.init,
                            allocs, list(root.match_buffers), dict(root.annotations))
    new_func = tirx.PrimFunc(func.params, s_tir.SBlockRealize([], True, new_root), func.ret_type,
                             func.attrs)
    return new_func


def _weight_pad_nest(weight, w_p, oc: int, padded: int, itype: str):
    """``w_p[f, ...] = weight[f, ...]`` for f < oc, 0 for the padded rows: a root loop nest of one block."""
    shape = [int(d) for d in w_p.ty.shape]
    loops = [tirx.Var(f"wp{i}", itype) for i in range(len(shape))]
    ivs = [tirx.IterVar(tvm.ir.Range.from_min_extent(tirx.IntImm(itype, 0), tirx.IntImm(itype, n)),
                        tirx.Var(f"v_wp{i}", itype), tirx.IterVar.DataPar) for i, n in enumerate(shape)]
    vs = [iv.var for iv in ivs]
    last = tirx.IntImm(itype, oc - 1)
    src = tirx.BufferLoad(weight, [tirx.min(vs[0], last), *vs[1:]])
    value = tirx.if_then_else(vs[0] < tirx.IntImm(itype, oc), src, tirx.const(0, str(weight.ty.dtype)))
    store = tirx.BufferStore(w_p, value, vs)
    w_full = [tvm.ir.Range.from_min_extent(tirx.IntImm(itype, 0), d) for d in weight.ty.shape]
    point = [tvm.ir.Range.from_min_extent(v, tirx.IntImm(itype, 1)) for v in vs]
    block = s_tir.SBlock(ivs, [tirx.BufferRegion(weight, w_full)], [tirx.BufferRegion(w_p, point)],
                         WEIGHT_PAD_BLOCK, store)
    stmt = s_tir.SBlockRealize(loops, True, block)
    for var, n in reversed(list(zip(loops, shape))):
        stmt = tirx.For(var, tirx.IntImm(itype, 0), tirx.IntImm(itype, n), tirx.ForKind.SERIAL, stmt)
    return stmt

