"""PaddedConv2dRule: an NCHW conv2d whose output channels no full vector divides, computed on full vectors.

The conv2d rule's register block puts the output channels on the lanes, in vectors of the widest power of
two dividing OC: ShuffleNetV2's 116 and 58 channels get 4 and 2 lanes of the host's 16 (AVX-512), its 232
and MNASNet's 40 get 8 in blocks of one vector, and every FMA does a fraction of a full vector's work.
This rule pads the conv's output channels to the next multiple of the full vector (``channel_pad.py``: zero
weight rows, packed into the constant weight at compile time; the padded lanes are never stored) and
schedules it with the conv2d schedule (``conv_schedule.py``) on full vectors.

Applies where that pays: where it takes fewer vector FMAs per broadcast input pixel than the conv2d
rule's vectors of the widest power of two dividing OC (116 channels: 8 full vectors instead of 29 of 4
lanes; 24: 2 instead of 3 of 8 lanes, an 8-lane FMA issuing at the rate of a 16-lane one on AVX-512;
not 8 channels: one vector either way), and not where a pointwise conv runs on pixel vectors (its
channels are not on the lanes). The epilogue runs after the conv's tiles on the accumulator's first OC
channels (per tile, with the channel predicate the padding needs, it measured slower).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..target import AscendTarget
from .analysis import has_reduce, match_conv2d
from .base import ScheduleRule
from .channel_pad import WEIGHT_PAD_BLOCK, pack_padded_weight, pad_conv_output_channels, padding_pays
from .common import new_schedule, as_target, root_blocks
from .conv_schedule import ConvOptions, schedule_conv2d
from .fast_math import use_fast_math
from .gated_weight import gate_on_weight
from .hostvec import host_vector


class PaddedConv2dRule(ScheduleRule):
    """NCHW conv2d + epilogue with its output channels padded to the host's vector width."""

    name = "conv2d-padded"

    def apply(self, func: tirx.PrimFunc, target: AscendTarget, host) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        hv = host_vector(host)
        func = gate_on_weight(func) or func     # an SE-gated input read as an ungated conv reads it
        sch = new_schedule(tvm.IRModule({"main": func}))
        conv = _the_conv(sch)
        if conv is None:
            return None
        block, info = conv
        blocks = list(root_blocks(sch))
        ci = next(i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(block)))
        padded_oc = padding_pays(sch, block, info, blocks[:ci], hv, as_target(target))
        if padded_oc is None:
            return None
        name = sch.get(block).name_hint
        if any(p.same_as(sch.get(block).writes[0].source) for p in func.params):
            # no epilogue: the conv writes the output itself; a copy of the first OC channels stores it
            sch.cache_write(block, 0, "global")
            func = sch.mod["main"]
        padded = pad_conv_output_channels(func, name, info.weight_buf, padded_oc)
        if padded is None:
            return None
        return _schedule_padded(padded, info.weight_buf, target, hv)


def _the_conv(sch):
    """(block, ConvBlock) of the kernel's one reduction when it is a plain conv2d, else None."""
    blocks = list(root_blocks(sch))
    reductions = [b for b in blocks if has_reduce(sch, b)]
    if len(reductions) != 1:
        return None
    info = match_conv2d(sch, reductions[0])
    return None if info is None else (reductions[0], info)


def _schedule_padded(func, weight, target, hv) -> s_tir.Schedule | None:
    sch = new_schedule(tvm.IRModule({"main": use_fast_math(func)}))
    conv = _the_conv(sch)
    if conv is None:
        return None
    block, info = conv
    pad = sch.get_sblock(WEIGHT_PAD_BLOCK)
    blocks = [b for b in root_blocks(sch) if not sch.get(b).same_as(sch.get(pad))]
    ci = next(i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(block)))
    chosen = []

    def keep(_sch, default, _candidates):
        chosen.append(default)
        return default

    # the chooser only reports the register block the schedule picks (its own default), which the
    # padded weight is packed by; the prepack of the conv rule does not see the padded weight (not a parameter)
    if schedule_conv2d(sch, blocks, ci, info, target, hv, ConvOptions(tiles=keep)) is None or not chosen:
        return None
    pack_padded_weight(sch, func, weight, chosen[0].tiles.ocb)
    sch.annotate(block, "ascendfuse.channel_pad", f"{info.out_dtype} channels padded for {hv.bits}-bit vectors")
    return sch
