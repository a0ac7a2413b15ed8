"""The bf16 dot-product GEMM as a schedule step, for every rule whose kernel holds one float32 GEMM that a
bfloat16 kernel (``precision/on_chip.py``) may run on the host's AVX512-BF16 (``bf16_dot.py``): the GEMM rule
of its own (``matmul_bf16.py``: GEMM + injective epilogue), the GEMM stage of a GEMM + norm kernel
(``reduction.GemmNormRule``: the FFN's down projection + residual + LayerNorm) and the products of a SwiGLU
kernel (``multi_gemm.MultiGemmRule``), the last two through ``bf16_gemm_root``.

``bf16_gemm_stage``: B packed once at compile time to bf16 ``B'[n // 16, k // 2, n % 16, k % 2]`` (16 columns x
2 depths = one 64-byte vector per step; its values are bf16 already: the mode rounded the weights,
``round_weights``); A converted to bf16 once per kernel (round to nearest even, as the cube's operand); a
register tile of ``mr`` rows x ``nv`` 16-lane float32 vectors accumulates over K, each step one ``vdpbf16ps``
per vector, the A pair broadcast per row, the tile in a buffer of its own (registers), stored to the GEMM's
output once finished. What the caller does with that store (an epilogue computed from it, a norm reading the
GEMM's output) stays with the caller.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..kinds import LOAD, GemmBlock, accumulating_store, strip_cast
from ..precision.on_chip import on_chip_float
from .analysis import match_gemm
from .bf16_dot import DEPTH, IMPORT_ANNOTATION, LANES, LLVM_WRAPPER, dot_16x2_bf16
from .common import extent, ok
from .dot_gemm import pair_packing, split_dot_tile
from .hostvec import bf16_dot_pays, host_vector
from .layout import mark_prepack, packable_param

MAX_ROWS = 8        # register tile rows
# The tile's buffer must stay below the bytes TVM allocates on the stack (1 KiB, ``LowerTVMBuiltin``): a
# larger one is a heap workspace, which LLVM cannot keep in registers (it stored every accumulator at every
# k step: 0.6x the float32 rule).
MAX_TILE_VECTORS = 1024 // (LANES * 4) - 1
# Fewer accumulators than this leave the dot product waiting on its latency (a prime row count such as ViT's
# 197 tokens allows one row per tile: 197x768x768 ran at 0.6x the float32 rule): the float32 rules, which
# pad the rows, take such GEMMs.
MIN_TILE_VECTORS = 8


def wants_bf16_dot(func, host) -> bool:
    """Whether ``func``'s products run on the bf16 dot product: the kernel is bfloat16 on chip and the host
    has the instruction, on a CPU where it pays (``hostvec.bf16_dot_pays``). Float32 kernels (every kernel of
    a float32 build) never do."""
    return on_chip_float(func) == "bfloat16" and bf16_dot_pays(host)


def match_row_gemm(sch: s_tir.Schedule, block) -> GemmBlock | None:
    """``analysis.match_gemm``'s roles, also for a ``C[0, i, j] += A[0, i, k] * B[k, j]`` block whose unit
    batch axis the normal form indexed by the constant 0 (the GEMM stage of a GEMM + norm kernel of a
    Transformer: ``(1, seq, K) x (K, N)``), which ``match_gemm`` does not take. Loops ``i, j, k``, B 2-D."""
    info = match_gemm(sch, block)
    if info is not None:
        return info
    stmt = sch.get(block)
    body = accumulating_store(stmt)
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if body is None or len(loops) != 3 or kinds != [tirx.IterVar.DataPar, tirx.IterVar.DataPar,
                                                    tirx.IterVar.CommReduce]:
        return None
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize) or not all(
            isinstance(v, tirx.Var) and v.same_as(sch.get(lp).loop_var) for lp, v in zip(loops, realize.iter_values)):
        return None
    i, j, k = (iv.var for iv in stmt.iter_vars)

    def free(indices):
        """The iterators indexing ``indices`` once the constant-0 indices are dropped, or None."""
        out = []
        for idx in indices:
            if isinstance(idx, tirx.IntImm) and int(idx) == 0:
                continue
            if not isinstance(idx, tirx.Var):
                return None
            out.append(idx)
        return out

    val = body.value
    for acc, prod in ((val.a, val.b), (val.b, val.a)):
        acc, prod = strip_cast(acc), strip_cast(prod)
        if not (isinstance(acc, LOAD) and acc.source.same_as(body.buffer) and isinstance(prod, tirx.Mul)):
            continue
        c_iters = free(body.indices)
        if c_iters is None or len(c_iters) != 2 or not (c_iters[0].same_as(i) and c_iters[1].same_as(j)):
            return None
        for x, y in ((strip_cast(prod.a), strip_cast(prod.b)), (strip_cast(prod.b), strip_cast(prod.a))):
            if not (isinstance(x, LOAD) and isinstance(y, LOAD)) or len(y.indices) != 2:
                continue
            xa, ya = free(x.indices), free(y.indices)
            if xa is None or ya is None or len(xa) != 2 or not (xa[0].same_as(i) and xa[1].same_as(k)):
                continue
            if not (isinstance(y.indices[0], tirx.Var) and isinstance(y.indices[1], tirx.Var)):
                continue
            if y.indices[0].same_as(k) and y.indices[1].same_as(j):
                b_k, b_n = 0, 1
            elif y.indices[0].same_as(j) and y.indices[1].same_as(k):
                b_k, b_n = 1, 0
            else:
                continue
            reads = [r.source for r in stmt.reads]
            a_read = next((n for n, r in enumerate(reads) if r.same_as(x.source)), None)
            b_read = next((n for n, r in enumerate(reads) if r.same_as(y.source)), None)
            if a_read is None or b_read is None or a_read == b_read:
                return None
            return GemmBlock(block, x.source, y.source, body.buffer, a_read, b_read, batch=[], m=[0], n=1, k=2,
                             b_n_axis=b_n, b_k_axis=b_k)
    return None


def register_tile(rows: int, n_vectors: int, accumulators: int) -> tuple[int, int] | None:
    """(rows, vectors) of the tile: the most accumulators within the budget and ``MAX_TILE_VECTORS``, rows
    dividing ``rows`` and vectors dividing ``n_vectors`` (the intrinsic takes whole vectors)."""
    best = None
    budget = min(accumulators, MAX_TILE_VECTORS)
    for nv in (3, 2, 1):
        if n_vectors % nv:
            continue
        for mr in range(min(MAX_ROWS, budget // nv), 0, -1):
            if rows % mr == 0:
                if best is None or mr * nv > best[0] * best[1]:
                    best = (mr, nv)
                break
    return best


def bf16_gemm_stage(sch: s_tir.Schedule, gemm, info, host):
    """Schedule the GEMM block ``gemm`` (``info``: its ``analysis.match_gemm`` roles; A and B parameters, B a
    constant 2-D weight, loops ``m.., n, k``) on the bf16 dot product. Returns ``(outer, store, (mr, nv))``:
    the parallel loop over register tiles, the block storing each finished tile to the GEMM's output (for the
    caller's epilogue) and the tile; or a string saying why the GEMM does not fit the tile (the schedule is
    then unchanged)."""
    if packable_param(sch, info.b_buf) is None:
        return "its weight is not a constant parameter"
    loops = sch.get_loops(gemm)
    ext = [extent(sch, lp) for lp in loops]
    if None in ext:
        return "a symbolic extent"
    k_len, n_len = ext[info.k], ext[info.n]
    if k_len % DEPTH or n_len % LANES:
        return f"K {k_len} or N {n_len} is not a multiple of the tile's {DEPTH} depths x {LANES} lanes"
    tile = register_tile(ext[info.m[-1]], n_len // LANES, host_vector(host).accumulators)
    if tile is None or tile[0] * tile[1] < MIN_TILE_VECTORS:
        return f"{ext[info.m[-1]]} rows allow fewer than {MIN_TILE_VECTORS} accumulators"
    mr, nv = tile
    # B packed and converted to bf16 in the compile-time preproc block; A converted once, at the root
    b_copy = mark_prepack(sch, gemm, info.b_read, pair_packing(info, LANES, DEPTH))
    sch.unsafe_set_dtype(b_copy, 0, "bfloat16")
    params = list(sch.mod["main"].params)
    staged_before = str(info.a_buf.dtype) == "bfloat16" and not any(p.same_as(info.a_buf) for p in params)
    # (A read through the bf16 copy an earlier product's stage made of it: every reader of a buffer reads
    # its cache once one is made, so the products of a SwiGLU kernel share one)
    a_stage = None if staged_before else sch.cache_read(gemm, info.a_read, "global")
    if a_stage is not None:
        sch.unsafe_set_dtype(a_stage, 0, "bfloat16")
    tiled = split_dot_tile(sch, gemm, info, mr, nv, LANES, DEPTH)
    if tiled is None:
        return "its loops are not m.., n, k"
    outer, ko, mi, nvo, ni, _ = tiled
    # the accumulator tile in a buffer of its own, one tile large (registers once unrolled): in the
    # kernel's output or a buffer of its size LLVM keeps it in memory (the A pair is read through a
    # pointer that might alias it). Global scope: TVM puts a small global buffer on the stack (a local
    # one is a heap workspace)
    acc = sch.cache_write(gemm, 0, "global")
    sch.reverse_compute_at(acc, outer)
    init = sch.decompose_reduction(gemm, ko)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(ni, dot_16x2_bf16())
    sch.unroll(mi)
    sch.unroll(nvo)
    # the LLVM wrapper the intrinsic calls, imported once for the kernel (lowered to an AttrStmt)
    sch.annotate(outer, IMPORT_ANNOTATION, LLVM_WRAPPER)
    if a_stage is not None:
        a_loops = sch.get_loops(a_stage)
        if len(a_loops) > 1:
            sch.parallel(sch.fuse(*a_loops[:-1]))
        if k_len % LANES == 0:
            sch.vectorize(sch.split(a_loops[-1], [None, LANES])[1])
    return outer, acc, (mr, nv)


def describe(tile) -> str:
    """The report's words for a GEMM on this tile: bf16 products, float32 sums."""
    mr, nv = tile
    return (f"bf16 dot product (vdpbf16ps): {mr} rows x {nv * LANES} columns of float32 accumulators, weight "
            "packed to bf16 pairs, A rounded to bf16 once")


def bf16_gemm_root(sch: s_tir.Schedule, gemm, host) -> str | None:
    """A GEMM stage at the root of its kernel (a product whose output other blocks read: a GEMM + norm
    kernel's, each product of a SwiGLU kernel) on the bf16 dot product, when the kernel is bfloat16 on chip,
    the host has the instruction and the GEMM is one the tile takes (float32 A and B parameters, B a constant
    2-D weight, no batch); the report's note, or None (the caller's float32 register block then)."""
    if not wants_bf16_dot(sch.mod["main"], host):
        return None
    info = match_row_gemm(sch, gemm)
    if info is None or info.batch or len(info.b_buf.shape) != 2 or \
            {str(b.dtype) for b in (info.b_buf, info.c_buf)} != {"float32"}:
        return None
    params = list(sch.mod["main"].params)
    a_param = any(p.same_as(info.a_buf) for p in params)
    # A: a float32 parameter, or the bf16 copy of one an earlier product's stage made (bf16_gemm_stage)
    if not any(p.same_as(info.b_buf) for p in params) or \
            str(info.a_buf.dtype) != ("float32" if a_param else "bfloat16"):
        return None
    if not a_param:
        writers = [w for w in sch.get_producers(gemm) if any(r.source.same_as(info.a_buf) for r in sch.get(w).writes)]
        reads = [r.source for w in writers for r in sch.get(w).reads]
        if len(writers) != 1 or len(reads) != 1 or str(reads[0].dtype) != "float32" or \
                not any(p.same_as(reads[0]) for p in params):
            return None
    staged = bf16_gemm_stage(sch, gemm, info, host)
    if isinstance(staged, str):
        return None
    _, store, tile = staged
    vectorize_tile_store(sch, store)
    return "GEMM on the " + describe(tile)


def vectorize_tile_store(sch: s_tir.Schedule, store) -> None:
    """The tile's store vectorised along N and its other loops unrolled: indexed by constants only, the
    tile's buffer is promoted to registers (read at a run-time index, LLVM kept it in memory and stored
    every accumulator at every k step)."""
    sch.vectorize(sch.split(sch.get_loops(store)[-1], [None, LANES])[1])
    for lp in sch.get_loops(store)[1:-1]:
        ok(sch.unroll, lp)
