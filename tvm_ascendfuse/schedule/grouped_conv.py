"""GroupedConv2dRule: an NCHW conv2d with 1 < groups < channels (RegNet, ResNeXt) + injective epilogue.

Recognised from the blocks (``analysis.match_grouped_conv2d``): one reduction block
``C[n, f, y, x] += D[n, f // OCg * ICg + rc, y*s + ry*d, x*s + rx*d] * W[f, rc, ry, rx]``, the kernel's only
reduction besides a global pool of its output (an SE block's mean, run after it: ``plane_pool.py``), at least
two output channels per group (one per group is depthwise: ``depthwise_conv.py``).

Each group is a GEMM of OCg output channels x (ICg * KH * KW) x pixels. The conv2d schedule
(``conv_schedule.schedule_conv2d``) runs it as it runs a dense conv, with its register block (ocb output
channels x owr columns) sized from the channels of one group instead of all output channels: ocb divides OCg,
so every output channel of a register block reads the same input channels and the input pixel is one
broadcast per FMA, as in the dense conv. A group narrower than the host's vector (ResNeXt's first stages:
4 or 8 channels) gets narrower vectors (vl = the largest power of two dividing OCg). The schedule's paths
that treat the reduction as all input channels (input channel chunks, small-plane chunks, the NCHW[c] input
re-layout, the strided-pointwise gather) are off: a group reads only ICg of them.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import has_reduce, match_grouped_conv2d
from .base import Declined, ScheduleRule, Scheduled
from .common import new_schedule, as_target, extent, root_blocks
from .conv_schedule import ConvChoice, ConvOptions, choose_conv_tiles, conv_candidates, schedule_conv2d
from .fast_math import use_fast_math
from .hostvec import host_vector
from .plane_pool import schedule_plane_pool, split_plane_pool


class GroupedConv2dRule(ScheduleRule):
    """Grouped conv2d (OCg >= 2 output channels per group) + epilogue, register-blocked within a group."""

    name = "grouped-conv2d"
    tunable = True      # register block within a group and output-row blocks: ``tiles`` chooser (base.ScheduleRule)

    def apply_with_note(self, func: tirx.PrimFunc, target: AscendTarget, host) -> Scheduled | Declined | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        return self.schedule(new_schedule(tvm.IRModule({"main": use_fast_math(func)})), target, host)

    def schedule(self, sch: s_tir.Schedule, target: AscendTarget, host) -> Scheduled | Declined | None:
        """Schedule ``sch`` in place (a MetaSchedule space passes its own traced schedule); None declines."""
        blocks = list(root_blocks(sch))
        reductions = [i for i, b in enumerate(blocks) if has_reduce(sch, b)]
        found = [(i, g) for i, g in ((i, match_grouped_conv2d(sch, blocks[i])) for i in reductions)
                 if g is not None and g.out_per_group >= 2]
        if not found:
            return None
        ci, info = found[0]
        ri, why = split_plane_pool(sch, blocks, ci)
        if why is not None:
            return Declined(f"the grouped conv shares the kernel with {why}: only injective ops, or one global "
                            "pool of its output, may surround it")
        loops = sch.get_loops(blocks[ci])
        ow = extent(sch, loops[3])
        if ow is None or extent(sch, loops[1]) is None:
            return Declined("symbolic output channels or width (only the batch may be symbolic)")
        hv = host_vector(host)
        pool_note = ""
        if ri is not None:
            # an SE block's pool of the conv's output: its own loop nest after the conv part
            pool_note = ", " + schedule_plane_pool(sch, blocks[ri:], hv.lanes(info.out_dtype))
            blocks = blocks[:ri]
        npu = as_target(target)
        tiles = choose_conv_tiles(info.out_per_group, ow, info.out_dtype, hv, npu, columns_first=info.kernel[1] > 1)

        used = [tiles]      # the register block the schedule took (a tuner's pick), for the note

        def within_group(sch_, default: ConvChoice, candidates) -> ConvChoice:
            # the conv schedule's candidates are sized for all output channels; a group's register block
            # divides the group's channels (its row-block choices are kept)
            mine = ConvChoice(tiles, default.row_blocks)
            chosen = self.choose(sch_, mine, lambda: conv_candidates(
                mine, info.out_per_group, ow, info.out_dtype, hv, npu,
                row_blocks=list(dict.fromkeys(c.row_blocks for c in candidates()))))
            used[0] = chosen.tiles
            return chosen

        opts = ConvOptions(channel_chunk=0, nchwc_min_ic=0, plane_chunks=False, subsample_strided=False,
                           tiles=within_group)
        if schedule_conv2d(sch, blocks, ci, info, npu, hv, opts) is None:
            return None
        return Scheduled(sch, f"grouped-conv2d: {info.groups} groups of {info.in_per_group}->"
                              f"{info.out_per_group} channels, register block {used[0].ocb}ch x {used[0].owr}cols"
                              f"{pool_note}")
