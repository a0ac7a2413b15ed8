"""Conv2dRule: an NCHW conv2d (any kernel, stride, padding, dilation; groups=1) + injective epilogue.

Recognised from the blocks: one reduction block ``C[n, f, y, x] += D[n, c, ..y.., ..x..] * W[f, c, r, s]``
(casts allowed) whose output and weight indices are bare iterators in NCHW / OIHW order
(``analysis.match_conv2d``). The schedule (register-blocked, UB-tiled, epilogue fused into each output tile)
is ``conv_schedule.schedule_conv2d``; the pool rule applies the same function to a conv in front of a pool.
Grouped and depthwise convs have another index structure and are left to the fallback rule.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import has_reduce, match_conv2d
from .base import ScheduleRule
from .common import new_schedule, root_blocks
from .conv_schedule import ConvOptions, schedule_conv2d
from .fast_math import use_fast_math
from .gated_weight import gate_on_weight
from .hostvec import host_vector


class Conv2dRule(ScheduleRule):
    """NCHW conv2d + epilogue, register-blocked and UB-tiled (see ``conv_schedule.py``)."""

    name = "conv2d"
    tunable = True      # register block and output-row blocks: ``tiles`` chooser (base.ScheduleRule)

    def __init__(self, **options):
        """``options``: the fields of ``ConvOptions`` (the defaults are the measured recipe). With ``tiles``
        (``tiles(sch, default, candidates)``) a tuner picks the ConvChoice to use, see ``tunable.py``."""
        self.options = ConvOptions(**{"column_pad": True, **options})

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        return self.schedule(new_schedule(tvm.IRModule({"main": use_fast_math(self.prepare(func))})),
                             target, host)

    @staticmethod
    def prepare(func: tirx.PrimFunc) -> tirx.PrimFunc:
        """The kernel as the rule schedules it (``base.ScheduleRule.prepare``): an SE-gated input moved onto
        the weight (``gated_weight.py``), so the conv reads its input as an ungated conv does; other kernels
        unchanged. The tuner searches, and its records are keyed by, this form."""
        return gate_on_weight(func) or func

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> s_tir.Schedule | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        blocks = list(root_blocks(sch))
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        if len(reductions) != 1:
            return None
        ci = reductions[0]
        info = match_conv2d(sch, blocks[ci])
        if info is None:
            return None
        return schedule_conv2d(sch, blocks, ci, info, target, host_vector(host), self.options)
