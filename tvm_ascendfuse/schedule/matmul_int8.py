"""Int8MatmulRule: a uint8 x int8 -> int32 GEMM (+ injective epilogue) on the host's int8 dot product.

Recognised from the blocks: one ``C[.., m, n] += int32(A[.., m, k]) * int32(B[k, n])`` block with A uint8,
B an int8 constant (layout-free parameter) and C int32, every other block injective (the zero-point
correction, scale, bias, activation, the next quantize: ``graph_fusion/matmul_quant``). No batch on B.

Schedule: B packed once at compile time to ``B'[n // 16, k // 4, n % 16, k % 4]`` (16 columns x 4 depths
= one 64-byte vector per step); a register tile of ``mr`` rows x ``nv`` 16-lane int32 vectors accumulates
over K, each step one ``vpdpbusd`` per vector (AVX-512 VNNI: 4 u8 x s8 products summed into each int32
lane; ``tensor_intrin.x86`` ``dot_16x4_vnni``), the A bytes broadcast per row. The epilogue runs on each
finished tile, vectorised along N. Without VNNI the same tile is computed with plain int32 vector
arithmetic (exact, slower). Shapes the tile does not divide (K % 4, N % 16) are declined: the generic
GEMM rule takes them.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import find_gemm
from .base import ScheduleRule
from .common import new_schedule, extent, ok, root_blocks
from .dot_gemm import dot_gemm_operands, pair_packing, split_dot_tile
from .hostvec import has_int8_dot, host_vector
from .int8_dot import DEPTH, LANES, dot_16x4_u8s8, register_tile
from .layout import mark_prepack, packable_param


def _dtype(buf) -> str:
    return str(buf.dtype)


def _int8_gemm(sch: s_tir.Schedule):
    found = find_gemm(sch)
    if found is None:
        return None
    blocks, gi, info = found
    if (_dtype(info.a_buf), _dtype(info.b_buf), _dtype(info.c_buf)) != ("uint8", "int8", "int32"):
        return None
    return found if dot_gemm_operands(sch, blocks, gi, info) else None


class Int8MatmulRule(ScheduleRule):
    """See the module docstring."""

    name = "matmul_int8"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = new_schedule(func)
        found = _int8_gemm(sch)
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
        # rows of the tile from the innermost M iterator (outer ones stay loops of their own: a fused M
        # would bind the rows by division, which the intrinsic's block cannot be carved out of)
        tile = register_tile(ext[info.m[-1]], n_len // LANES, hv.accumulators + hv.accumulators // 2)
        if tile is None:
            return None
        mr, nv = tile

        # the epilogue as one block computing the output from the accumulator (a kernel with a second
        # output inside its epilogue is left to the generic rule); blocks in front of the GEMM compute epilogue
        # operands (the widened run-time zero point) and are inlined into it too
        for blk in blocks[:gi] + list(root_blocks(sch))[gi + 1:-1]:
            if not ok(sch.compute_inline, blk):
                return None
        rest = list(root_blocks(sch))
        epilogue = rest[-1] if len(rest) > 1 else None

        mark_prepack(sch, gemm, info.b_read, pair_packing(info, LANES, DEPTH))
        vnni = has_int8_dot(host)
        # VNNI: the 16 x 4 (lanes x depths) step is the intrinsic; else depths outside the 16 vector lanes
        tiled = split_dot_tile(sch, gemm, info, mr, nv, LANES, DEPTH, depth_inside=vnni)
        if tiled is None:
            return None
        outer, ko, mi, nvo, ni, ki = tiled
        # the accumulator tile lives in registers; the epilogue reads it directly, tile by tile. Without an
        # epilogue the tile accumulates in the output itself (a write-back stage would be a copy of it)
        acc = sch.cache_write(gemm, 0, "global") if epilogue is not None else None  # global: as the intrinsic
        if not vnni:    # the same tile in int32 vector arithmetic: the 4 depths unrolled, 16 lanes a vector
            sch.unroll(ki)
            sch.vectorize(ni)
        init = sch.decompose_reduction(gemm, ko)
        sch.vectorize(sch.get_loops(init)[-1])
        if vnni:
            sch.tensorize(ni, dot_16x4_u8s8())
        sch.unroll(mi)
        sch.unroll(nvo)
        if epilogue is not None:
            sch.compute_inline(acc)
            sch.reverse_compute_at(epilogue, outer)
            sch.vectorize(sch.split(sch.get_loops(epilogue)[-1], [None, LANES])[1])
        return sch
