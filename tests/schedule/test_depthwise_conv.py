"""DepthwiseConv2dRule: numbers equal to the unscheduled kernel for depthwise convs of the shapes MobileNet,
EfficientNet and ConvNeXt run (3x3 / 5x5 / 7x7, stride 1 and 2) and odd ones (channel counts that are not a
multiple of the vector, odd sizes, asymmetric padding, dilation, batch 2, symbolic batch, fp16), with each
epilogue real models put after it (folded-BN bias, ReLU, ReLU6 as clip and as max+min, hardswish, SiLU,
residual add, the transpose to channels-last, none) and with an SE block's pool of its output in the same
kernel; the register transposes on both sides (used, and exact); UB within capacity; what it must decline,
with the reason in the report."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.base import Declined
from tvm_ascendfuse.schedule.depthwise_conv import DepthwiseConv2dRule, choose_depthwise_tiles, stage_bytes
from tvm_ascendfuse.schedule.hostvec import host_vector
from tvm_ascendfuse.target import get_target

AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})


def _scalar(v, dtype):
    return relax.const(np.array(v, dtype))


def epilogue(name, dtype="float32"):
    """The op chain after conv + bias, as the ONNX importer writes it for each activation."""
    def act(y, r=None):
        if name == "relu":
            return op.nn.relu(y)
        if name == "relu6":                        # Clip(0, 6)
            return op.clip(y, 0.0, 6.0)
        if name == "relu6_max_min":                # Clip with min/max inputs: maximum then minimum
            return op.minimum(op.maximum(y, _scalar(0.0, dtype)), _scalar(6.0, dtype))
        if name == "hardswish":                    # x * clip(x + 3, 0, 6) / 6 (MobileNetV3)
            return op.multiply(y, op.divide(op.clip(op.add(y, _scalar(3.0, dtype)), 0.0, 6.0), _scalar(6.0, dtype)))
        if name == "silu":
            return op.nn.silu(y)
        if name == "residual":
            return op.add(y, r)
        if name == "nhwc":                         # ConvNeXt: the depthwise conv's output goes channels-last
            return op.permute_dims(y, [0, 2, 3, 1])
        return y
    return act


def dw_kernel(x_shape, k, stride=1, pad=None, dilation=1, act="relu6", dtype="float32", bias=True):
    c = x_shape[1]
    pad = [k // 2 * dilation] * 4 if pad is None else list(pad)

    def build(x, w, *rest):
        y = op.nn.conv2d(x, w, strides=stride, padding=pad, dilation=dilation, groups=c)
        if bias:
            y = op.add(y, rest[0])
        return epilogue(act, dtype)(y, rest[-1] if act == "residual" else None)

    shapes = [x_shape, (c, 1, k, k)] + ([(1, c, 1, 1)] if bias else [])
    if act == "residual":
        n, _, h, w = x_shape
        kh = (k - 1) * dilation + 1
        oh = (h + pad[0] + pad[2] - kh) // stride + 1
        ow = (w + pad[1] + pad[3] - kh) // stride + 1
        shapes.append((n, c, oh, ow))
    return fused_kernel(build, shapes, dtype)


CASES = {
    # name: (x shape, kernel, stride, padding or None, dilation, epilogue)
    "mbv2_3x3_s1": ((1, 32, 16, 16), 3, 1, None, 1, "relu6"),
    "mbv2_3x3_s2": ((1, 48, 17, 17), 3, 2, None, 1, "relu6_max_min"),
    "effnet_5x5_s1_silu": ((1, 32, 14, 14), 5, 1, None, 1, "silu"),
    "effnet_5x5_s2_silu": ((1, 32, 15, 15), 5, 2, None, 1, "silu"),
    "mbv3_hardswish": ((1, 32, 14, 14), 3, 1, None, 1, "hardswish"),
    "mbv3_relu": ((1, 16, 12, 12), 3, 2, None, 1, "relu"),
    "convnext_7x7_nhwc": ((1, 32, 14, 14), 7, 1, None, 1, "nhwc"),
    "residual": ((1, 32, 8, 16), 3, 1, None, 1, "residual"),
    "bias_only": ((1, 16, 7, 7), 3, 1, None, 1, None),
    "odd_channels": ((1, 5, 9, 11), 3, 1, None, 1, "relu6"),
    "channels_not_a_vector": ((1, 24, 10, 10), 3, 2, None, 1, "silu"),     # 8 lanes
    "channels_40_5x5": ((1, 40, 9, 9), 5, 1, None, 1, "hardswish"),
    "width_not_a_block": ((1, 16, 6, 13), 3, 1, None, 1, "relu6"),         # 8-column blocks, predicated tail
    "asymmetric_pad": ((1, 16, 9, 10), 3, 1, (0, 1, 2, 1), 1, "relu"),
    "dilated": ((1, 16, 12, 12), 3, 1, None, 2, "relu6"),
    "no_padding": ((1, 16, 9, 9), 3, 1, (0, 0, 0, 0), 1, "relu"),
    "batch2": ((2, 32, 9, 9), 3, 1, None, 1, "relu6"),
    "stride2_even": ((1, 16, 14, 14), 3, 2, None, 1, "relu6"),
    "three_columns": ((1, 16, 9, 9), 3, 1, None, 1, "relu6"),     # input rows staged 3 columns a transpose
    "two_columns": ((1, 16, 2, 2), 3, 1, None, 1, "relu"),        # a 2x2 plane: 2-column transposes both ways
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("packed", [True, False])
def test_depthwise_matches_unscheduled(name, packed):
    xs, k, stride, pad, dil, act = CASES[name]
    func = dw_kernel(xs, k, stride, pad, dil, act)
    if packed:
        func = func.with_attr("layout_free_buffers", [1])
    mod, note = check_rule(DepthwiseConv2dRule(), func, host=NATIVE, with_note=True)
    assert note.startswith("depthwise-conv2d")
    assert ("layout_rewrite_preproc" in mod.script()) is packed     # (C/vl, 1, KH, KW, vl), once
    assert "local.UB" in mod.script()


@pytest.mark.parametrize("name", ["mbv2_3x3_s2", "odd_channels", "effnet_5x5_s1_silu", "convnext_7x7_nhwc"])
def test_portable_host(name):
    xs, k, stride, pad, dil, act = CASES[name]
    check_rule(DepthwiseConv2dRule(), dw_kernel(xs, k, stride, pad, dil, act), host=HOST)


def test_no_epilogue():
    func = fused_kernel(lambda x, w: op.nn.conv2d(x, w, padding=[1] * 4, groups=16), [(1, 16, 8, 8), (16, 1, 3, 3)])
    check_rule(DepthwiseConv2dRule(), func, host=NATIVE)


@pytest.mark.parametrize("act", ["relu6", "silu"])
def test_float16(act):
    func = dw_kernel((1, 32, 10, 10), 3, 1, None, 1, act, dtype="float16")
    check_rule(DepthwiseConv2dRule(), func, host=NATIVE)


def test_symbolic_batch():
    n = tirx.Var("n", "int64")
    func = dw_kernel((n, 32, 12, 12), 3, 2, None, 1, "relu6")
    check_rule(DepthwiseConv2dRule(), func, host=NATIVE, sizes={"n": 3})


@pytest.mark.parametrize("load, store", [(True, True), (False, False), (True, False), (False, True)])
def test_register_transposes_are_exact_and_used(load, store):
    """AVX-512 fp32, 16 channels a block: the staged input comes in through register transposes (a copy
    predicated on the tile's halo rows, rewritten after scheduling) and the NCHW output leaves through them
    (tensorized store); each switched off keeps the lane-by-lane copy; all four exact, 8 and 7 columns."""
    rule = DepthwiseConv2dRule(transpose_store=store, transpose_load=load)
    for xs in ((1, 32, 16, 16), (1, 32, 14, 14)):
        func = dw_kernel(xs, 3, 1, None, 1, "relu6").with_attr("layout_free_buffers", [1])
        result = rule.apply_with_note(func, NPU, AVX512)
        script = result.sch.mod.script()
        assert ("_transposed" in script) is load
        assert ("T.Shuffle" in script) is (load or store)
        assert ("input staged through register transposes" in result.note) is load
        assert ("NCHW store through register transposes" in result.note) is store
        check_rule(rule, func, host=NATIVE)


@pytest.mark.parametrize("act", ["silu", "relu6", "hardswish"])
def test_epilogue_columns_unrolled(act):
    """The activation runs on the register block's columns unrolled (their dependent exp/clip chains
    interleave), vectorised over the channels, and stays exact; switched off, the column loop is serial."""
    from tvm.tirx import ForKind

    func = dw_kernel((1, 32, 16, 16), 3, 1, None, 1, act).with_attr("layout_free_buffers", [1])
    for unroll in (True, False):
        rule = DepthwiseConv2dRule(unroll_epilogue=unroll)
        sch = rule.apply_with_note(func, NPU, AVX512).sch
        (epi,) = sch.get_consumers(sch.get_sblock("group_conv2d_nchw_update"))
        cols, lanes = (sch.get(loop) for loop in sch.get_loops(epi)[-2:])
        assert lanes.kind == ForKind.VECTORIZED and int(lanes.extent) == 16
        assert (cols.kind == ForKind.UNROLLED) is unroll and int(cols.extent) == 8
        check_rule(rule, func, host=NATIVE)


AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})


@pytest.mark.parametrize("xs, host, act", [((1, 24, 16, 16), NATIVE, "relu"),       # 8 | 24: 8-lane blocks
                                           ((1, 72, 14, 14), NATIVE, "hardswish"),  # MNASNet/MobileNetV3's 72
                                           ((1, 32, 16, 16), AVX2, "silu")])        # AVX2: 8 lanes
def test_eight_lane_blocks_go_through_register_transposes(xs, host, act):
    """Channel blocks of 8 (a count 16 does not divide, with the overlapping blocks off, or an AVX2 host)
    stage the input and store the output through 8x8 register transposes like the 16-lane blocks, exactly; 8
    and 7 columns."""
    func = dw_kernel(xs, 3, 1, None, 1, act).with_attr("layout_free_buffers", [1])
    mod, note = check_rule(DepthwiseConv2dRule(overlap=False), func, host=host, with_note=True)
    assert "8ch" in note
    assert "input staged through register transposes" in note
    assert "NCHW store through register transposes" in note


OVERLAP_CASES = {
    # name: (x shape, kernel, stride, epilogue); channel counts 16 does not divide, as the models have them
    "shufflenet_58": ((1, 58, 14, 14), 3, 1, None),         # 2 lanes before: 4 blocks, the last from 42
    "shufflenet_116_s2": ((1, 116, 15, 15), 3, 2, None),    # 4 lanes before
    "mnasnet_72_5x5_s2": ((1, 72, 13, 13), 5, 2, "relu"),
    "mbv3_120_5x5": ((1, 120, 10, 10), 5, 1, "hardswish"),
    "mbv3_200_silu": ((1, 200, 7, 7), 3, 1, "silu"),
    "residual_24": ((1, 24, 8, 16), 3, 1, "residual"),      # the residual read at the block's own channels
    "relu6_40": ((1, 40, 10, 10), 3, 1, "relu6_max_min"),
}


def _block_lanes(note: str) -> int:
    """The channels a block of the note's schedule holds (``packed 16ch x 2rows, ...``: 16)."""
    return int(re.search(r"(\d+)ch x", note).group(1))


@pytest.mark.parametrize("name", list(OVERLAP_CASES))
@pytest.mark.parametrize("packed", [True, False])
def test_overlapping_channel_blocks(name, packed):
    """Channels no full vector divides run as full vector blocks, the last one pulled back to end at the
    last channel (it recomputes channels of the block before it, the same values), with a constant weight
    packed once (a slot-indexed copy marked for the compile-time pre-packing) and with a weight passed at run
    time; switched off, the narrower blocks come back. The models' counts scheduled for AVX-512 (16-lane
    blocks) and AVX2 (8 lanes: only where 8 does not divide them); exact against the unscheduled kernel on
    this host, the count moved off a multiple of its vector where the model's is one (72 on 8 lanes: 76)."""
    xs, k, stride, act = OVERLAP_CASES[name]

    def kernel(channels):
        func = dw_kernel((xs[0], channels, *xs[2:]), k, stride, None, 1, act)
        return func.with_attr("layout_free_buffers", [1]) if packed else func

    for host in (AVX512, AVX2):     # scheduled only: AVX-512 code may not run on this host
        lanes = host_vector(host).lanes("float32")
        result = DepthwiseConv2dRule().apply_with_note(kernel(xs[1]), NPU, host)
        note = result.note
        assert _block_lanes(note) == lanes and "NCHW store through register transposes" in note
        assert (f"{xs[1]} channels as overlapping full-vector blocks" in note) is (xs[1] % lanes != 0)
        assert ("packed" in note) is (packed or xs[1] % lanes != 0)
        assert ("layout_rewrite_preproc" in result.sch.mod.script()) is packed
        off = DepthwiseConv2dRule(overlap=False).apply_with_note(kernel(xs[1]), NPU, host).note
        assert "overlapping" not in off and (_block_lanes(off) < lanes) is (xs[1] % lanes != 0)
    lanes = host_vector(NATIVE).lanes("float32")
    channels = xs[1] if xs[1] % lanes else xs[1] + lanes // 2
    mod, note = check_rule(DepthwiseConv2dRule(), kernel(channels), host=NATIVE, with_note=True)
    assert f"packed {lanes}ch" in note and f"{channels} channels as overlapping full-vector blocks" in note
    assert ("layout_rewrite_preproc" in mod.script()) is packed
    assert "NCHW store through register transposes" in note
    _, off = check_rule(DepthwiseConv2dRule(overlap=False), kernel(channels), host=NATIVE, with_note=True)
    assert _block_lanes(off) < lanes and "overlapping" not in off


@pytest.mark.parametrize("host, lanes", [(AVX2, 8), (HOST, 4)])
def test_overlapping_channel_blocks_follow_the_host_vector(host, lanes):
    """On AVX2 (8 lanes) and a portable SSE host (4 lanes) the blocks are that host's full vector: 58 channels
    as 8 blocks of 8 and 15 of 4, exact."""
    func = dw_kernel((1, 58, 12, 12), 3, 1, None, 1, "relu6").with_attr("layout_free_buffers", [1])
    _, note = check_rule(DepthwiseConv2dRule(), func, host=host, with_note=True)
    assert f"packed {lanes}ch" in note and "overlapping" in note


def test_overlap_refuses_a_channel_used_other_than_as_an_index():
    """MixNet's mixed kernels end a depthwise conv with a concat and a slice: its last block picks the concat's
    part by ``c < 72``. The overlap rewrite re-indexes loads by the channel a slot stands for; a condition on
    the channel would have kept the slot (reads out of the other tensor: 4e33 on mixnet_s), so a block using
    its channel that way is not rewritten (``_uses_outside_indices``)."""
    from tvm_ascendfuse.schedule.channel_overlap import _uses_outside_indices

    c = tirx.Var("c", "int64")
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    acc = tirx.decl_buffer([i64(80)], "float32", "acc_slots")
    other = tirx.decl_buffer([i64(24)], "float32", "other")
    out = tirx.decl_buffer([i64(80)], "float32", "out_slots")
    src = tirx.Min(c, i64(71))
    indexed = tirx.BufferStore(out, tirx.BufferLoad(acc, [c]) + tirx.BufferLoad(other, [src - i64(64)]), [c])
    assert not _uses_outside_indices(indexed, c, [acc, other, out])
    chosen = tirx.BufferStore(out, tirx.Select(c < i64(72), tirx.BufferLoad(acc, [c]),
                                               tirx.BufferLoad(other, [src - i64(64)])), [c])
    assert _uses_outside_indices(chosen, c, [acc, other, out])


def test_overlap_left_out_where_it_does_not_apply():
    """Fewer channels than a vector (nothing to fill), a symbolic batch and a channels-last output keep the
    kernel as it was, still exact; each with a channel count sized by the host's vector so that only that
    reason keeps the overlap out (12 and 24 on AVX-512's 16 lanes, 6 and 12 on AVX2's 8), scheduled for both
    widths and run on this host."""
    n = tirx.Var("n", "int64")

    def kernels(lanes):
        few, odd = lanes * 3 // 4, lanes * 3 // 2       # below one vector; one and a half vectors
        return ((dw_kernel((1, few, 9, 9), 3, 1, None, 1, "relu"), None),
                (dw_kernel((n, odd, 9, 9), 3, 1, None, 1, "relu6"), {"n": 2}),
                (dw_kernel((1, odd, 14, 14), 7, 1, None, 1, "nhwc"), None))

    for host in (AVX512, AVX2):
        for func, _ in kernels(host_vector(host).lanes("float32")):
            assert "overlapping" not in DepthwiseConv2dRule().apply_with_note(func, NPU, host).note
    for func, sizes in kernels(host_vector(NATIVE).lanes("float32")):
        _, note = check_rule(DepthwiseConv2dRule(), func, host=NATIVE, sizes=sizes, with_note=True)
        assert "overlapping" not in note


@pytest.mark.parametrize("xs, k, stride, pad", [((1, 32, 16, 16), 3, 1, None),
                                                ((1, 48, 22, 22), 3, 2, None),             # only the left column
                                                ((1, 16, 9, 10), 3, 1, (0, 1, 2, 1)),      # asymmetric
                                                ((1, 58, 13, 13), 5, 2, None),             # overlapping blocks
                                                ((1, 32, 7, 7), 3, 1, None),               # 1-row tiles
                                                ((1, 16, 9, 9), 3, 1, (0, 0, 0, 0))])      # nothing to fill
def test_zero_fill_only_on_the_border(xs, k, stride, pad):
    """The staged rows' zero fill stores only what the in-bound copy leaves: whole rows above and below the
    input, the left and right columns in its rows (the fill's column loop runs over a row-dependent count);
    exact; switched off, the fill covers the whole tile. 58 channels overlap on 8 and 16 lanes alike; 32
    channels on a 7x7 plane are tiles of one row in several channel blocks on either width (a staged row
    ``fused % OH + ry`` of the fused parallel loop, which decompose_padding cannot analyse)."""
    func = dw_kernel(xs, k, stride, pad, 1, "relu").with_attr("layout_free_buffers", [1])
    for border in (True, False):
        rule = DepthwiseConv2dRule(border_fill=border)
        mod = check_rule(rule, func, host=NATIVE)
        row_dependent = []
        tvm_ffi.structural_walk(mod["main"], (tirx.For, lambda lp: row_dependent.append(lp)
                                              if isinstance(lp.extent, tirx.Select) else None))
        assert bool(row_dependent) is (border and pad != (0, 0, 0, 0))


def test_tiles_from_usable_ub():
    """The staged rows (halo included), weights, accumulator and epilogue tile of a tile fit usable UB on both
    presets; rows shrink with a smaller UB; every core gets several tiles."""
    from tvm_ascendfuse.schedule.hostvec import HostVector

    hv = HostVector(512, 32, 2)
    func = dw_kernel((1, 32, 112, 112), 3, 1, None, 1, "relu6")
    from tvm import s_tir

    from tvm_ascendfuse.schedule.analysis import match_depthwise_conv2d
    from tvm_ascendfuse.schedule.common import root_blocks

    sch = s_tir.Schedule(func)
    info = match_depthwise_conv2d(sch, list(root_blocks(sch))[1])
    for preset in ("ascend910b", "ascend310p"):
        target = get_target(preset)
        t = choose_depthwise_tiles(32, 112, 112, 114, 1, info, hv, target)
        assert t.vl == 16 and t.owr == 8 and 112 % t.rows == 0
        assert stage_bytes(t.rows, info, 114, 16, 8, 4, target) <= target.ub_usable
        assert (32 // 16) * (112 // t.rows) >= 8
    big = get_target("ascend910b")
    small = dataclasses.replace(big, ub_bytes=72 * 1024)
    rows = choose_depthwise_tiles(32, 112, 112, 114, 1, info, hv, big).rows
    fewer = choose_depthwise_tiles(32, 112, 112, 114, 1, info, hv, small)
    assert fewer.rows < rows and stage_bytes(fewer.rows, info, 114, 16, 8, 4, small) <= small.ub_usable


@pytest.mark.parametrize("preset", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("xs, k, stride", [((1, 32, 112, 112), 3, 1), ((1, 144, 56, 56), 3, 2),
                                           ((1, 1152, 7, 7), 5, 1), ((1, 96, 56, 56), 7, 1)])
def test_ub_bytes_within_capacity(preset, xs, k, stride):
    target = get_target(preset)
    func = dw_kernel(xs, k, stride, None, 1, "relu6").with_attr("layout_free_buffers", [1])
    result = DepthwiseConv2dRule().apply_with_note(func, target, NATIVE)
    usage = kernel_usage("k", result.sch.mod["main"], target)
    assert 0 < usage.bytes("local.UB") <= target.ub_usable
    assert not usage.symbolic("local.UB")


def se_pool(groups, act=op.nn.silu, axis=(2, 3), keep_output=True, reduce=op.mean):
    """conv + bias + activation, then a reduction of its output in the same kernel (the grouping puts an SE
    block's global mean there); ``axis`` (1,) is a channel mean, not a pool over the planes."""
    def build(x, w, b):
        y = act(op.add(op.nn.conv2d(x, w, groups=groups, padding=[1] * 4), b))
        m = reduce(y, axis=list(axis), keepdims=True)
        return relax.Tuple([y, m]) if keep_output else m
    return build


@pytest.mark.parametrize("xs, act, keep, reduce", [
    ((1, 32, 16, 16), op.nn.silu, True, op.mean),       # 256 a plane: 16-lane partial sums
    ((1, 48, 14, 14), op.nn.relu, True, op.mean),       # 196: 14-lane partial sums
    ((1, 40, 7, 7), op.nn.silu, True, op.mean),         # 49: 7-lane partial sums
    ((2, 24, 10, 10), op.nn.silu, True, op.max),        # batch 2, a max over the plane
    ((1, 5, 9, 9), op.nn.relu, True, op.mean),          # odd channels
    ((1, 32, 12, 12), op.nn.silu, False, op.mean),      # the conv's output is not a kernel output
])
@pytest.mark.parametrize("host", [NATIVE, HOST], ids=["native", "portable"])
def test_se_pool_after_the_conv(xs, act, keep, reduce, host):
    """EfficientNet / MobileNetV3: the depthwise conv's output and its mean over the plane in one kernel; the
    conv keeps its schedule and the pool runs after it."""
    c = xs[1]
    func = fused_kernel(se_pool(c, act, keep_output=keep, reduce=reduce), [xs, (c, 1, 3, 3), (1, c, 1, 1)])
    _, note = check_rule(DepthwiseConv2dRule(), func.with_attr("layout_free_buffers", [1]), host=host,
                         with_note=True)
    assert note.startswith("depthwise-conv2d: packed") and "plane pool after it" in note


def test_declines_with_reasons():
    rule = DepthwiseConv2dRule()
    shapes = [(1, 16, 8, 8), (16, 1, 3, 3), (1, 16, 1, 1)]
    result = rule.apply_with_note(fused_kernel(se_pool(16, axis=(1,)), shapes), NPU, NATIVE)
    assert isinstance(result, Declined) and "not a pool over whole planes" in result.reason

    def concat(x, w, other):    # an epilogue that is not per output tile
        return op.concat([op.nn.conv2d(x, w, groups=8, padding=[1] * 4), other], axis=1)

    result = rule.apply_with_note(fused_kernel(concat, [(1, 8, 6, 6), (8, 1, 3, 3), (1, 4, 6, 6)]), NPU, NATIVE)
    assert isinstance(result, Declined) and "per output tile" in result.reason

    sym = tirx.Var("h", "int64")
    result = rule.apply_with_note(dw_kernel((1, 16, sym, 8), 3), NPU, NATIVE)
    assert isinstance(result, Declined) and "symbolic" in result.reason

    dense = fused_kernel(lambda x, w: op.nn.conv2d(x, w, padding=[1] * 4), [(1, 8, 6, 6), (8, 8, 3, 3)])
    grouped = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=2, padding=[1] * 4), [(1, 8, 6, 6), (8, 4, 3, 3)])
    multiplier = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=8, padding=[1] * 4),
                              [(1, 8, 6, 6), (16, 1, 3, 3)])
    mm = fused_kernel(lambda a, b: op.matmul(a, b), [(8, 8), (8, 8)])
    for func in (dense, grouped, multiplier, mm):
        assert rule.apply_with_note(func, NPU, NATIVE) is None


def test_decline_reason_reaches_the_report():
    """Through the schedule phase: a kernel with a channel mean goes to another rule and the report says why
    this one declined."""
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.schedule.apply import ApplyUBSchedules

    func = fused_kernel(se_pool(16, op.nn.relu, axis=(1,)), [(1, 16, 8, 8), (16, 1, 3, 3), (1, 16, 1, 1)])
    func = func.with_attr("global_symbol", "k")
    report = FusionReport()
    ApplyUBSchedules(NPU, report, HOST)(tvm.IRModule({tvm.ir.GlobalVar("k"): func}))
    assert report.sections["schedules"]["k"] != "depthwise-conv2d"
    assert any(n.startswith("depthwise-conv2d: the depthwise conv shares the kernel with a reduction after")
               for n in report.sections["schedule_notes"]["k"])


@pytest.mark.parametrize("case", [dict(cout=144, size=16), dict(cout=32, size=16, stride=2)],
                         ids=["stride1", "stride2"])
def test_int8_depthwise_bytes_go_through_register_transposes(case):
    """A QDQ depthwise conv (DepthwiseConv2DQuantFusionPass: uint8 in, int32 accumulation) read by a QDQ 1x1
    conv, its input a ReLU output (zero point 0, so the kernel pads it itself): its uint8 input is staged and
    its uint8 output stored through the register transposes, as float32 is (else 16 lane-strided byte loads
    and 16 lane extracts a vector); it agrees with onnxruntime within one output step."""
    from tests.graph_fusion.common import run_ort
    from tests.graph_fusion.quant_models import agreement
    from tests.graph_fusion.test_depthwise_conv_quant import _model
    from tests.graph_fusion.test_conv_quant import _inputs
    from tests.helpers import compile_ours, run_vm
    from tests.schedule.test_conv_int8 import _conv_node
    from tvm_ascendfuse.frontend import import_onnx

    model = _model(zero_point=-128, relu=True, **case)
    _conv_node(model, "y", "z", 32, case["cout"], 11)
    out = model.graph.output[0]
    out.name = "z"
    out.type.tensor_type.shape.dim[1].dim_value = 32
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), portable=False)
    (name,) = [k["name"] for k in result.report.kernels if k["rule"] == "depthwise-conv2d"]
    script = result.scheduled_module[name].script()
    assert "_transposed" in script          # the staging copy rewritten (transpose.rewrite_transposed_stages)
    assert "T.Shuffle" in script.split("_transposed")[-1]   # and the store's shuffle network after it
    ours, ref = run_vm(result.executable, inputs), run_ort(model, inputs)
    cos, diff = agreement(ours, ref)
    assert cos >= 0.999 and diff <= 0.03 * 1.001, (cos, diff / 0.03)   # 0.03: the 1x1 conv's output step
