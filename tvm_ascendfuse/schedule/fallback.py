"""Whatever no other rule took (gathers, scatters, opaque blocks, odd reductions): still use the cores.

Per root block: parallelise the outermost loop when it is data parallel and vectorise the innermost loop
of injective blocks. Each step is optional; a step TVM refuses is skipped, so the rule always returns a
valid schedule (possibly unchanged) and never fails the build.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..target import AscendTarget
from .base import ScheduleRule
from .common import innermost_vector, num_cores, ok, root_blocks, vector_lanes, buffer_bytes


def _is_spatial_block(sch, block) -> bool:
    return all(iv.iter_type == tirx.IterVar.DataPar for iv in sch.get(block).iter_vars)


class FallbackRule(ScheduleRule):
    """Parallel outer loop + vectorised inner loop where legal; never returns None for a schedulable func."""

    name = "fallback"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> "s_tir.Schedule | None":
        try:
            sch = s_tir.Schedule(func)
            blocks = root_blocks(sch)
        except Exception:  # noqa: BLE001 - not schedulable TIR: leave it to TVM's lowering
            return None
        cores = num_cores(host)
        for block in blocks:
            try:
                loops = sch.get_loops(block)
            except Exception:  # noqa: BLE001
                continue
            if not loops:
                continue
            if _is_spatial_block(sch, block):
                writes = sch.get(block).writes
                bits = buffer_bytes(writes[0].source) * 8 if writes else 32
                innermost_vector(sch, block, vector_lanes(host, bits))
                loops = sch.get_loops(block)
            if cores > 1 and len(loops) >= 1:
                ok(sch.parallel, loops[0])
        return sch
