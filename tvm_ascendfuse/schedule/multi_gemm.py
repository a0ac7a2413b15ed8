"""Several independent GEMMs in one kernel, combined elementwise: SwiGLU's ``silu(x·Wg) * (x·Wu)``.

Each product runs as its own register-blocked stage over all rows (K1 recipe: ``local.UB`` accumulator tile,
prepacked constant weight, parallel over column panels); the elementwise combine is inlined into one output
stage tiled through UB (``injective.tile_injective``). A single-GEMM kernel is left to ``MatmulRule``.
Tunable: the register block is one sampled decision shared by the products (``contraction.gemm_root_candidates``).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import is_contraction
from .base import Scheduled, ScheduleRule
from .bf16_gemm import bf16_gemm_root
from .common import new_schedule, block_infos, is_output_block, num_cores, ok, parallel_vector, root_blocks, vector_lanes
from .contraction import is_widening_block, schedule_gemm_root
from .injective import tile_injective


class MultiGemmRule(ScheduleRule):
    """Two or more products with no other reduction, none consuming another's result."""

    name = "multi-matmul"
    min_products = 2
    tunable = True      # one register block for the products: ``tiles`` chooser (base.ScheduleRule)

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "Scheduled | None":
        notes = []
        sch = self.schedule(new_schedule(func), target, host, notes)
        return None if sch is None else Scheduled(sch, "; ".join(notes) or None)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host, notes=None) -> "s_tir.Schedule | None":
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines.
        ``notes``: a list the report's notes are appended to (how each product computes, when not the
        float32 register block)."""
        notes = [] if notes is None else notes
        infos = block_infos(sch)
        if not infos:
            return None
        products = [b for b in infos if b.is_reduction()]
        if len(products) < 2 or not all(is_contraction(sch, b.block_rv) for b in products):
            return None
        names = {b.name for b in products}
        for b in products:                      # independent products only (attention chains are not)
            producers = {sch.get(p).name_hint for p in sch.get_producers(b.block_rv)}
            if producers & names:
                return None
        lanes = vector_lanes(host, 32)
        for b in infos:
            if is_widening_block(sch, b.block_rv):
                # a 16-bit input converted once, vectorised, for all the products: inlined, each product's
                # micro-kernel would convert one element per FMA row and per column panel
                parallel_vector(sch, b.block_rv, lanes)
            elif not b.is_reduction() and not is_output_block(sch, b.block_rv):
                ok(sch.compute_inline, b.block_rv)
        choose = _SharedTiles(self.choose)
        for b in products:
            # a bfloat16 kernel's products on the host's bf16 dot product where it has one (bf16_gemm.py)
            note = bf16_gemm_root(sch, b.block_rv, host)
            if note is not None:
                notes.append(note)
                continue
            if not schedule_gemm_root(sch, b.block_rv, lanes, num_cores(host), choose=choose):
                return None
        for blk in root_blocks(sch):
            stmt = sch.get(blk)
            if stmt.name_hint in names or stmt.name_hint.endswith("_local.UB") or stmt.name_hint.endswith("_init"):
                continue
            if all(iv.iter_type == tirx.IterVar.DataPar for iv in stmt.iter_vars) and is_output_block(sch, blk):
                tile_injective(sch, blk, target, host, stage=True)
        return sch


class _SharedTiles:
    """One tile decision for all the products (the first product's candidates): each later product takes the
    register block drawn for the first when it is one of its own candidates, else its own default; at the
    first product's default every product keeps its own default (the untuned schedule)."""

    def __init__(self, choose):
        self.choose = choose
        self.first = None       # (default, pick) of the first product

    def __call__(self, sch, default, candidates):
        if self.first is None:
            self.first = (default, self.choose(sch, default, candidates))
            return self.first[1]
        first_default, pick = self.first
        return default if pick == first_default or pick not in candidates() else pick
