"""Bf16MatmulRule: a float32 GEMM (+ injective epilogue) of a kernel stored in bfloat16, on the host's bf16
dot product.

Taken only when the kernel is marked bfloat16 on chip (``precision/on_chip.py``: a ``force_bf16`` /
``allow_mix_precision_bf16`` build or a bf16 model, where the NPU's cube multiplies bf16 operands and
accumulates in float32) and the host has AVX512-BF16 where it pays (``hostvec.bf16_dot_pays``); otherwise the float32 GEMM
rule takes the kernel. Recognised from the blocks: one ``C[.., m, n] += A[.., m, k] * B[k, n]`` block,
float32 (A may be a bf16 parameter widened by an inlined prologue: a bf16 model's input), B a constant
(layout-free) parameter, every other block injective. No batch on B.

Schedule (``bf16_gemm.py``, shared with the GEMM stage of ``reduction.GemmNormRule``): B packed once at compile
time to bf16 pairs, A converted to bf16 once per kernel, a register tile of float32 accumulators on
``vdpbf16ps`` (``bf16_dot.py``). The epilogue runs on each finished tile as it is stored, vectorised along N.
Shapes the tile does not divide (K % 2, N % 16, rows) are declined: the float32 GEMM rule takes them.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import find_gemm
from .base import Scheduled, ScheduleRule
from .bf16_dot import LANES
from .bf16_gemm import bf16_gemm_stage, describe, vectorize_tile_store, wants_bf16_dot
from .common import new_schedule, ok, root_blocks
from .dot_gemm import dot_gemm_operands
from .layout import packable_param


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
        if not isinstance(func, tirx.PrimFunc) or not wants_bf16_dot(func, host):
            return None
        sch = new_schedule(func)
        found = _bf16_gemm(sch)
        if found is None:
            return None
        blocks, gi, info = found
        gemm = blocks[gi]
        if packable_param(sch, info.b_buf) is None:
            return None
        # the epilogue as one block computing the output from the accumulator (as the int8 GEMM rule)
        for blk in blocks[:gi] + list(root_blocks(sch))[gi + 1:-1]:
            if not ok(sch.compute_inline, blk):
                return None
        rest = list(root_blocks(sch))
        epilogue = rest[-1] if len(rest) > 1 else None
        staged = bf16_gemm_stage(sch, gemm, info, host)
        if isinstance(staged, str):
            return None
        outer, acc, tile = staged
        store = acc
        if epilogue is not None:
            # the epilogue computed from the finished tile as it is stored
            if not ok(sch.reverse_compute_inline, epilogue):
                sch.reverse_compute_at(epilogue, outer)
                store = epilogue
                sch.vectorize(sch.split(sch.get_loops(acc)[-1], [None, LANES])[1])
        vectorize_tile_store(sch, store)
        # the report says how this kernel computes: bf16 products, float32 sums
        return Scheduled(sch, describe(tile))
