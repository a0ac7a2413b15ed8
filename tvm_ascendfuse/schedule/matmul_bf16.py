"""Bf16MatmulRule: a float32 GEMM (+ injective epilogue) of a kernel stored in bfloat16, on the host's bf16
dot product.

Taken only when the kernel is marked bfloat16 on chip (``precision/on_chip.py``: a ``force_bf16`` /
``allow_mix_precision_bf16`` build or a bf16 model, where the NPU's cube multiplies bf16 operands and
accumulates in float32) and the host has AVX512-BF16 (``hostvec.has_bf16_dot``); otherwise the float32 GEMM
rule takes the kernel. Recognised from the blocks: one ``C[.., m, n] += A[.., m, k] * B[k, n]`` block,
float32 (A may be a bf16 parameter widened by an inlined prologue: a bf16 model's input), B a constant
(layout-free) parameter, every other block injective. No batch on B.

Schedule: B packed once at compile time to bf16 ``B'[n // 16, k // 2, n % 16, k % 2]`` (16 columns x 2 depths
= one 64-byte vector per step; its values are bf16 already: the mode rounded the weights, ``round_weights``);
A converted to bf16 once per kernel (round to nearest even, as the cube's operand). A register tile of ``mr``
rows x ``nv`` 16-lane float32 vectors accumulates over K, each step one ``vdpbf16ps`` per vector
(``bf16_dot.py``), the A pair broadcast per row, the tile in a buffer of its own (registers). The epilogue runs
on each finished tile as it is stored, vectorised along N.
Shapes the tile does not divide (K % 2, N % 16, rows) are declined: the float32 GEMM rule takes them.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..precision.on_chip import on_chip_float
from ..target import AscendTarget
from .analysis import find_gemm
from .base import Scheduled, ScheduleRule
from .bf16_dot import DEPTH, DOT_16x2_BF16, IMPORT_ANNOTATION, LANES, LLVM_WRAPPER
from .common import new_schedule, extent, ok, root_blocks
from .dot_gemm import dot_gemm_operands, pair_packing, split_dot_tile
from .hostvec import has_bf16_dot, host_vector
from .layout import mark_prepack, packable_param

MAX_ROWS = 8        # register tile rows
# The tile's buffer must stay below the bytes TVM allocates on the stack (1 KiB, ``LowerTVMBuiltin``): a
# larger one is a heap workspace, which LLVM cannot keep in registers (it stored every accumulator at every
# k step: 0.6x the float32 rule).
MAX_TILE_VECTORS = 1024 // (LANES * 4) - 1
# Fewer accumulators than this leave the dot product waiting on its latency (a prime row count such as ViT's
# 197 tokens allows one row per tile: 197x768x768 ran at 0.6x the float32 rule): the float32 rule, which pads
# the rows, takes such GEMMs.
MIN_TILE_VECTORS = 8


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


def _bf16_gemm(sch: s_tir.Schedule):
    found = find_gemm(sch)
    if found is None:
        return None
    blocks, gi, info = found
    if gi > 0:
        # a prologue on the operands (a bf16 model's input widened to float32, operand_cast.py) inlined into
        # the GEMM: its A then is what the prologue reads (converted to bf16 in the A stage)
        for blk in blocks[:gi]:
            if not ok(sch.compute_inline, blk):
                return None
        found = find_gemm(sch)
        if found is None:
            return None
        blocks, gi, info = found
    if str(info.a_buf.dtype) not in ("float32", "bfloat16") or \
            {str(b.dtype) for b in (info.b_buf, info.c_buf)} != {"float32"}:
        return None
    return (blocks, gi, info) if dot_gemm_operands(sch, blocks, gi, info) else None


class Bf16MatmulRule(ScheduleRule):
    """See the module docstring."""

    name = "matmul_bf16"

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | None:
        if not isinstance(func, tirx.PrimFunc) or on_chip_float(func) != "bfloat16" or not has_bf16_dot(host):
            return None
        sch = new_schedule(func)
        found = _bf16_gemm(sch)
        if found is None:
            return None
        blocks, gi, info = found
        gemm = blocks[gi]
        if packable_param(sch, info.b_buf) is None:
            return None
        loops = sch.get_loops(gemm)
        ext = [extent(sch, lp) for lp in loops]
        if None in ext:
            return None
        k_len, n_len = ext[info.k], ext[info.n]
        if k_len % DEPTH or n_len % LANES:
            return None
        hv = host_vector(host)
        tile = register_tile(ext[info.m[-1]], n_len // LANES, hv.accumulators)
        if tile is None or tile[0] * tile[1] < MIN_TILE_VECTORS:
            return None
        mr, nv = tile

        # the epilogue as one block computing the output from the accumulator (as the int8 GEMM rule)
        for blk in blocks[:gi] + list(root_blocks(sch))[gi + 1:-1]:
            if not ok(sch.compute_inline, blk):
                return None
        rest = list(root_blocks(sch))
        epilogue = rest[-1] if len(rest) > 1 else None

        # B packed and converted to bf16 in the compile-time preproc block; A converted once, at the root
        b_copy = mark_prepack(sch, gemm, info.b_read, pair_packing(info, LANES, DEPTH))
        sch.unsafe_set_dtype(b_copy, 0, "bfloat16")
        a_stage = sch.cache_read(gemm, info.a_read, "global")
        sch.unsafe_set_dtype(a_stage, 0, "bfloat16")
        tiled = split_dot_tile(sch, gemm, info, mr, nv, LANES, DEPTH)
        if tiled is None:
            return None
        outer, ko, mi, nvo, ni, _ = tiled
        # the accumulator tile in a buffer of its own, one tile large (registers once unrolled): in the
        # kernel's output or a buffer of its size LLVM keeps it in memory (the A pair is read through a
        # pointer that might alias it). Global scope: TVM puts a small global buffer on the stack (a local
        # one is a heap workspace)
        acc = sch.cache_write(gemm, 0, "global")
        sch.reverse_compute_at(acc, outer)
        init = sch.decompose_reduction(gemm, ko)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.tensorize(ni, DOT_16x2_BF16)
        sch.unroll(mi)
        sch.unroll(nvo)
        # the LLVM wrapper the intrinsic calls, imported once for the kernel (lowered to an AttrStmt)
        sch.annotate(outer, IMPORT_ANNOTATION, LLVM_WRAPPER)
        store = acc
        if epilogue is not None:
            # the epilogue computed from the finished tile as it is stored
            if ok(sch.reverse_compute_inline, epilogue):
                store = acc
            else:
                sch.reverse_compute_at(epilogue, outer)
                store = epilogue
                sch.vectorize(sch.split(sch.get_loops(acc)[-1], [None, LANES])[1])
        sch.vectorize(sch.split(sch.get_loops(store)[-1], [None, LANES])[1])
        # the tile's stores unrolled too: indexed by constants only, the tile's buffer is promoted to registers
        # (read at a run-time index, LLVM kept it in memory and stored every accumulator at every k step)
        for lp in sch.get_loops(store)[1:-1]:
            sch.unroll(lp)
        a_loops = sch.get_loops(a_stage)
        if len(a_loops) > 1:
            sch.parallel(sch.fuse(*a_loops[:-1]))
        if k_len % LANES == 0:
            sch.vectorize(sch.split(a_loops[-1], [None, LANES])[1])
        # the report says how this kernel computes: bf16 products, float32 sums
        return Scheduled(sch, f"bf16 dot product (vdpbf16ps): {mr} rows x {nv * LANES} columns of float32 "
                              "accumulators, weight packed to bf16 pairs, A rounded to bf16 once")
