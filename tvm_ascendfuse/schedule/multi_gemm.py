"""Several independent GEMMs in one kernel, combined elementwise: SwiGLU's ``silu(x·Wg) * (x·Wu)``.

Each product runs as its own register-blocked stage over all rows (K1 recipe: ``local.UB`` accumulator tile,
prepacked constant weight, parallel over column panels); the elementwise combine is inlined into one output
stage tiled through UB (``injective.tile_injective``). A single-GEMM kernel is left to ``MatmulRule``.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import is_contraction
from .base import ScheduleRule
from .common import block_infos, is_output_block, num_cores, ok, root_blocks, vector_lanes
from .contraction import schedule_gemm_root
from .injective import tile_injective


class MultiGemmRule(ScheduleRule):
    """Two or more products with no other reduction, none consuming another's result."""

    name = "multi-matmul"
    min_products = 2

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        sch = s_tir.Schedule(func)
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
        for b in infos:
            if not b.is_reduction() and not is_output_block(sch, b.block_rv):
                ok(sch.compute_inline, b.block_rv)
        lanes = vector_lanes(host, 32)
        for b in products:
            if not schedule_gemm_root(sch, b.block_rv, lanes, num_cores(host)):
                return None
        for blk in root_blocks(sch):
            stmt = sch.get(blk)
            if stmt.name_hint in names or stmt.name_hint.endswith("_local.UB") or stmt.name_hint.endswith("_init"):
                continue
            if all(iv.iter_type == tirx.IterVar.DataPar for iv in stmt.iter_vars) and is_output_block(sch, blk):
                tile_injective(sch, blk, target, host, stage=True)
        return sch
