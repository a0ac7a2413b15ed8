"""Injective kernels: elementwise/broadcast chains, transposes, reshapes, concat, slices, padding.

Every block but the outputs is inlined, so a chain reads its inputs once and writes once. Each output is
computed tile by tile into a ``local.UB`` buffer and copied out (``injective.tile_injective``).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .base import ScheduleRule
from .common import new_schedule, block_infos, is_output_block, root_blocks, try_
from .injective import tile_injective


class ElementwiseRule(ScheduleRule):
    """All blocks injective (no reduction iterators): inline the chain, tile the outputs through UB."""

    name = "elementwise"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        sch = new_schedule(func)
        infos = block_infos(sch)
        if not infos or not all(b.is_injective() for b in infos):
            return None
        for info in infos:
            if not is_output_block(sch, info.block_rv):
                try_(sch.compute_inline, info.block_rv)
        for block in root_blocks(sch):
            tile_injective(sch, block, target, host, stage=True)
        return sch
