"""GroupedConv2dRule: numbers equal to the unscheduled kernel for grouped convs of the shapes RegNet and ResNeXt
run (16 channels a group, and 4 / 8 / 32), odd channel counts and sizes, strides 1/2, asymmetric padding,
dilation, 1x1, batch 2, symbolic batch, fp16; register block inside one group; an SE block's pool of the
conv's output in the same kernel; depthwise convs, plain convs and a grouped conv with a channel mean after it
declined."""

from __future__ import annotations

import re

import pytest
from tvm import relax, tirx
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.base import Declined
from tvm_ascendfuse.schedule.grouped_conv import GroupedConv2dRule


def grouped(groups, stride=1, pad=(1, 1, 1, 1), dilation=1, epilogue="relu"):
    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride, padding=list(pad), dilation=dilation, groups=groups), b)
        if epilogue == "residual":
            y = op.add(y, r[0])
        return op.nn.relu(y) if epilogue in ("relu", "residual") else y
    return build


CASES = {
    # name: (x shape, w shape, groups, stride, pad, dilation)
    "regnet_16_per_group": ((1, 64, 12, 12), (64, 16, 3, 3), 4, 1, (1, 1, 1, 1), 1),
    "regnet_s2": ((1, 48, 15, 15), (48, 16, 3, 3), 3, 2, (1, 1, 1, 1), 1),
    "resnext_4_per_group": ((1, 32, 10, 10), (32, 4, 3, 3), 8, 1, (1, 1, 1, 1), 1),
    "resnext_8_per_group_s2": ((1, 32, 11, 11), (32, 8, 3, 3), 4, 2, (1, 1, 1, 1), 1),
    "resnext_32_per_group": ((1, 64, 7, 7), (64, 32, 3, 3), 2, 1, (1, 1, 1, 1), 1),
    "odd_channels": ((1, 9, 7, 11), (15, 3, 3, 3), 3, 1, (1, 1, 1, 1), 1),   # 5 outputs per group
    "expanding": ((1, 12, 8, 8), (24, 4, 3, 3), 3, 1, (1, 1, 1, 1), 1),      # 4 inputs -> 8 outputs a group
    "asymmetric_pad": ((1, 16, 9, 10), (16, 8, 3, 3), 2, 1, (0, 1, 2, 1), 1),
    "dilated": ((1, 16, 12, 12), (32, 8, 3, 3), 2, 1, (2, 2, 2, 2), 2),
    "pointwise": ((1, 16, 7, 7), (32, 4, 1, 1), 4, 1, (0, 0, 0, 0), 1),
    "5x5_s2": ((1, 16, 13, 13), (16, 4, 5, 5), 4, 2, (2, 2, 2, 2), 1),
    "batch2": ((2, 32, 9, 9), (32, 8, 3, 3), 4, 1, (1, 1, 1, 1), 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_grouped_conv_matches_unscheduled(name):
    xs, ws, groups, stride, pad, dil = CASES[name]
    func = fused_kernel(grouped(groups, stride, pad, dil), [xs, ws, (1, ws[0], 1, 1)])
    mod = check_rule(GroupedConv2dRule(), func.with_attr("layout_free_buffers", [1]), host=NATIVE)
    tiles = re.search(r"ConvTiles\(vl=(\d+), ocr=(\d+), owr=(\d+)\)", mod.script())
    vl, ocr = int(tiles[1]), int(tiles[2])
    assert (ws[0] // groups) % (vl * ocr) == 0, tiles[0]      # every register block inside one group
    check_rule(GroupedConv2dRule(), func, host=HOST)


def test_residual_epilogue_and_no_epilogue():
    func = fused_kernel(grouped(4, epilogue="residual"),
                        [(1, 32, 8, 8), (32, 8, 3, 3), (1, 32, 1, 1), (1, 32, 8, 8)])
    check_rule(GroupedConv2dRule(), func, host=NATIVE)
    bare = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=4, padding=[1] * 4), [(1, 16, 6, 6), (16, 4, 3, 3)])
    check_rule(GroupedConv2dRule(), bare, host=NATIVE)


def test_float16():
    func = fused_kernel(grouped(4), [(1, 32, 9, 9), (32, 8, 3, 3), (1, 32, 1, 1)], dtype="float16")
    check_rule(GroupedConv2dRule(), func, host=NATIVE)


def test_symbolic_batch():
    n = tirx.Var("n", "int64")
    func = fused_kernel(grouped(4), [(n, 32, 9, 9), (32, 8, 3, 3), (1, 32, 1, 1)])
    check_rule(GroupedConv2dRule(), func, host=NATIVE, sizes={"n": 3})


def test_ub_within_capacity():
    func = fused_kernel(grouped(20), [(1, 320, 14, 14), (320, 16, 3, 3), (1, 320, 1, 1)])
    usage = kernel_usage("k", GroupedConv2dRule().apply(func, NPU, NATIVE).mod["main"], NPU)
    assert 0 < usage.bytes("local.UB") <= NPU.ub_usable


def se_pool(groups, axis=(2, 3), keep_output=True):
    def build(x, w, b):           # RegNet-Y: grouped conv + ReLU, and the SE block's mean of it, one kernel
        y = op.nn.relu(op.add(op.nn.conv2d(x, w, groups=groups, padding=[1] * 4), b))
        m = op.mean(y, axis=list(axis), keepdims=True)
        return relax.Tuple([y, m]) if keep_output else m
    return build


@pytest.mark.parametrize("xs, ws, groups, keep", [
    ((1, 64, 16, 16), (64, 16, 3, 3), 4, True),     # 256 a plane: a full vector of partial sums
    ((1, 48, 14, 14), (48, 16, 3, 3), 3, True),     # 196: 14-lane partial sums (7 on AVX2)
    ((1, 32, 7, 7), (32, 8, 3, 3), 4, True),        # 49: 7-lane partial sums
    ((2, 30, 9, 9), (30, 6, 3, 3), 5, False),       # batch 2, odd group width, output stays inside; 81: 9
])
@pytest.mark.parametrize("host", [NATIVE, HOST], ids=["native", "portable"])
def test_se_pool_after_the_conv(xs, ws, groups, keep, host):
    func = fused_kernel(se_pool(groups, keep_output=keep), [xs, ws, (1, ws[0], 1, 1)])
    _, note = check_rule(GroupedConv2dRule(), func.with_attr("layout_free_buffers", [1]), host=host,
                         with_note=True)
    assert note.startswith("grouped-conv2d") and "plane pool after it" in note


def test_declines_what_is_not_a_grouped_conv():
    rule = GroupedConv2dRule()
    depthwise = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=8, padding=[1] * 4), [(1, 8, 6, 6), (8, 1, 3, 3)])
    dense = fused_kernel(lambda x, w: op.nn.conv2d(x, w, padding=[1] * 4), [(1, 8, 6, 6), (8, 8, 3, 3)])
    for func in (depthwise, dense):
        assert rule.apply(func, NPU, NATIVE) is None
    channel_mean = fused_kernel(se_pool(4, axis=(1,)), [(1, 32, 8, 8), (32, 8, 3, 3), (1, 32, 1, 1)])
    result = rule.apply_with_note(channel_mean, NPU, NATIVE)
    assert isinstance(result, Declined) and "not a pool over whole planes" in result.reason


def test_channel_multiplier():
    """groups == input channels with two outputs each (a depthwise conv with multiplier 2) is a grouped conv
    of 1 -> 2 channels here (register blocks of 2 output channels)."""
    func = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=8, padding=[1] * 4), [(1, 8, 6, 6), (16, 1, 3, 3)])
    check_rule(GroupedConv2dRule(), func, host=NATIVE)
