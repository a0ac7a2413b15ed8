"""Sizing and loop helpers shared by the schedule rules.

Tile sizes come from the AscendTarget (usable UB, double buffering, 32 B alignment); vector width and
thread count come from the llvm host target, because on this host UB tiling is cache blocking.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from ..target import AscendTarget

__all__ = ["block_infos", "buffer_bytes", "extent", "host_of", "num_cores", "vector_lanes", "vector_width_for",
           "tile_elements", "is_output_block", "try_", "ok", "loops_through", "root_blocks", "innermost_vector",
           "vector_storable"]


def host_of(host):
    """The llvm host target: the one given, else the one in scope, else None (generic x86-64 assumed)."""
    if host is not None:
        return host if isinstance(host, tvm.target.Target) else tvm.target.Target(host)
    return tvm.target.Target.current(allow_none=True)


def vector_lanes(host, dtype_bits: int) -> int:
    """Lanes of one host vector register for this element width (16 fp32 lanes on AVX-512)."""
    bits = 128
    host = host_of(host)
    if host is not None and host.kind.name == "llvm":
        try:
            bits = int(tvm.target.codegen.llvm_get_vector_width(host)) or 128
        except Exception:  # an llvm without that query: assume SSE width
            bits = 128
    return max(1, bits // max(8, dtype_bits))


def num_cores(host) -> int:
    host = host_of(host)
    if host is not None and "num-cores" in host.attrs:
        return max(1, int(host.attrs["num-cores"]))
    return 1


def extent(sch: s_tir.Schedule, loop) -> int | None:
    """Static extent of a loop, None when symbolic."""
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def writes_as_many(sch: s_tir.Schedule, block, shape) -> bool:
    """Does ``block`` write exactly as many elements as a buffer of ``shape`` holds?

    An epilogue may be computed per tile of its producer only then (bias, activation, reshape, transpose).
    A block that writes more (a concatenate reading the tile in one branch of an if_then_else) gets a wrong
    region from reverse_compute_at, so such blocks must run after the producer instead."""
    def count(dims):
        n = 1
        for d in dims:
            if not isinstance(d, tirx.IntImm):
                return None
            n *= int(d)
        return n

    want = count(shape)
    return want is not None and all(count(w.source.ty.shape) == want for w in sch.get(block).writes)


def accumulating_store(stmt):
    """The ``C[...] = C[...] + ...`` store of a reduction block with an init, else None (GEMM/conv matchers)."""
    body = stmt.body
    if stmt.init is None or not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return None
    return body


def selects_by_index(sch: s_tir.Schedule, block) -> bool:
    """Does ``block`` choose between sources by its own indices (a concatenate, possibly inlined into a
    slice)? Such a block reads a producer tile only in one branch, and reverse_compute_at derives its
    region from that branch alone, so it must not be placed per tile. Value conditions (leaky_relu's
    ``x > 0``) read a buffer in the condition and are fine."""
    found = []

    def by_index(cond) -> bool:
        loads, variables = [], []
        tvm_ffi.structural_walk(cond, [(tvm.ir.expr.TensorLoad, loads.append), (tvm.ir.Var, variables.append)])
        return bool(variables) and not loads

    def on_call(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "prim.if_then_else" and by_index(call.args[0]):
            found.append(call)

    def on_select(sel):
        if by_index(sel.condition):
            found.append(sel)

    tvm_ffi.structural_walk(sch.get(block).body, [(tvm.ir.expr.Call, on_call),
                                                  (tvm.ir.prim.expr.Select, on_select)])
    return bool(found)


def tile_local(sch: s_tir.Schedule, block, shape) -> bool:
    """May ``block`` (an epilogue) be computed per tile of a producer whose output has ``shape``?"""
    return writes_as_many(sch, block, shape) and not selects_by_index(sch, block)


def vector_width_for(ext: int | None, lanes: int) -> int:
    """Largest power of two <= lanes dividing a static extent (no scalar tail inside a vector loop).
    A symbolic extent gets the full width: its tail is predicated."""
    if ext is None:
        return lanes
    v = 1
    while v * 2 <= lanes and ext % (v * 2) == 0:
        v *= 2
    return v


def buffer_bytes(buf) -> int:
    return tvm.DataType(str(buf.dtype)).bits // 8


def tile_elements(target: AscendTarget, bytes_per_element: int, align_elems: int = 1) -> int:
    """Elements per tile so that the tile's working set (``bytes_per_element`` summed over the buffers it
    touches, doubled when double-buffered, each buffer padded to the UB alignment) fits usable UB."""
    copies = 2 if target.double_buffer else 1
    budget = target.ub_usable // copies
    n = budget // max(1, bytes_per_element)
    # leave room for rounding every buffer up to the alignment
    n -= math.ceil(target.ub_align / max(1, bytes_per_element)) * 4
    step = max(1, align_elems)
    return max(step, (n // step) * step)


def block_infos(sch: s_tir.Schedule):
    """dlight's normal form of the function's blocks (iter kinds S/R/O per block), or None."""
    return normalize_prim_func(sch)


def root_blocks(sch: s_tir.Schedule):
    root = sch.get_sblock(sch.mod["main"].body.block.name_hint)
    return sch.get_child_blocks(root)


def is_output_block(sch: s_tir.Schedule, block) -> bool:
    """Whether the block writes a parameter buffer of the function."""
    params = [p for p in sch.mod["main"].params if isinstance(p.ty, tirx.BufferType)]
    return any(w.source.same_as(p) for w in sch.get(block).writes for p in params)


def try_(step, *args, **kwargs):
    """Run one optional schedule primitive; a ScheduleError (legality check) means 'skip this step'.
    Primitives check legality before they change the IR, so the schedule stays valid."""
    try:
        return step(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any refusal of an optional step
        return None


def loops_through(sch: s_tir.Schedule, block, info, n_iters: int):
    """The block's loops from the outermost down to the loop of its ``n_iters``-th non-unit iterator
    (normalised infos skip unit dims; the loop nest still has them)."""
    loops = sch.get_loops(block)
    if n_iters <= 0:
        return []
    target_loop = sch.get(info.iters[n_iters - 1].loop_rv)
    for pos, loop in enumerate(loops):
        if sch.get(loop).same_as(target_loop):
            return loops[:pos + 1]
    return loops[:n_iters]


def ok(step, *args, **kwargs) -> bool:
    """Like ``try_`` for primitives that return nothing: True when the step was applied."""
    try:
        step(*args, **kwargs)
        return True
    except Exception:  # noqa: BLE001 - any refusal of an optional step
        return False


def vector_storable(sch: s_tir.Schedule, block) -> bool:
    """May a loop storing this block's outputs be vectorised? Not when it writes a bool or sub-byte buffer.

    TVM's StorageRewrite retypes an allocated bool buffer whose every access is vectorised to ``int8xN`` and
    then stores those int8 vectors into bool buffers (``dtype mismatch on BufferStore ... T.int8x4``: ONNX
    And/Or/Not staged through UB); sub-byte elements have no addressable lane at all. Scalar stores of
    these types lower fine, so only the vectorisation is skipped."""
    for region in sch.get(block).writes:
        dtype = tvm.DataType(str(region.source.dtype))
        if str(region.source.dtype) == "bool" or dtype.bits < 8:
            return False
    return True


def innermost_vector(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorise the innermost loop of a block by the widest legal width (no-op when none, or when the block
    stores bool/sub-byte values, see ``vector_storable``)."""
    if not vector_storable(sch, block):
        return
    loops = sch.get_loops(block)
    if not loops or not isinstance(sch.get(loops[-1]).body, s_tir.SBlockRealize):
        return          # the innermost loop also runs other blocks (an anchor loop): never vectorise it
    inner = loops[-1]
    v = vector_width_for(extent(sch, inner), lanes)
    if v < 2:
        return
    ext = extent(sch, inner)
    if ext is None:
        return   # a symbolic tail would scalarise the whole loop; leave it to LLVM's loop vectorizer
    if ext > v:
        inner = sch.split(inner, [None, v])[1]
    ok(sch.vectorize, inner)
