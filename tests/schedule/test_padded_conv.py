"""PaddedConv2dRule: a conv whose output channels no full vector divides (ShuffleNetV2's 116 and 58, 232,
MNASNet's 40, 24/72/120) computes them padded to the host's vector width with the padded lanes never stored;
numbers equal to the unscheduled kernel, on AVX-512, AVX2 and the portable x86-64 host; declined where
padding saves no vector FMA (a full vector divides the channels, or 8 channels on 16 lanes)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax import op

from tests.helpers import assert_close, compile_ours, random_inputs, run_reference, run_vm, tol
from tests.schedule.kernels import HOST, NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.channel_pad import pad_conv_output_channels
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.hostvec import host_vector
from tvm_ascendfuse.schedule.padded_conv import PaddedConv2dRule

AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
# half a vector of this host (8 channels on AVX-512, 4 on AVX2): the cases whose point is a channel count
# only half a vector divides are sized by it, so they pad on whichever width runs them
HALF = host_vector(NATIVE).lanes("float32") // 2


def conv_block(stride=1, pad=0, act="relu", residual=False):
    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad] * 4), b)
        if residual:
            y = op.add(y, r[0])
        return {"relu": op.nn.relu, "silu": op.nn.silu, "none": lambda v: v}[act](y)
    return build


def kernel(xs, ws, stride=1, act="relu", residual=False, dtype="float32"):
    pad = ws[2] // 2
    oh = (xs[2] + 2 * pad - ws[2]) // stride + 1
    ow = (xs[3] + 2 * pad - ws[3]) // stride + 1
    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(xs[0], ws[0], oh, ow)] if residual else [])
    func = fused_kernel(conv_block(stride, pad, act, residual), shapes, dtype=dtype)
    return func.with_attr("layout_free_buffers", [1])


@pytest.mark.parametrize("xs,ws,stride,act,residual", [
    ((1, 116, 14, 14), (116, 116, 1, 1), 1, "relu", False),   # ShuffleNetV2 stage 3 (4-lane vectors unpadded)
    ((1, 58, 28, 28), (58, 58, 1, 1), 1, "relu", False),      # stage 2 (2 lanes)
    # half-vector lanes in blocks of one vector, residual (232 on AVX-512: 8 lanes; 116 on AVX2: 4)
    ((1, 29 * HALF, 7, 7), (29 * HALF, 29 * HALF, 1, 1), 1, "relu", True),
    # 3x3 strided, odd plane, batch 2, SiLU (40 channels on AVX-512, 20 on AVX2)
    ((2, 5 * HALF, 11, 13), (5 * HALF, 5 * HALF, 3, 3), 2, "silu", False),
    ((1, 19, 9, 9), (58, 19, 3, 3), 1, "none", False),        # odd input channels, bias only
])
def test_padded_channels_compute_the_unscheduled_numbers(xs, ws, stride, act, residual):
    mod = check_rule(PaddedConv2dRule(), kernel(xs, ws, stride, act, residual), host=NATIVE)
    lanes = host_vector(NATIVE).lanes("float32")
    padded = -(-ws[0] // lanes) * lanes
    assert "channels padded" in mod.script()
    # the weight, padded to whole full vectors, is packed (OC/ocb, IC, KH, KW, ocb) with ocb full vectors
    weight = [b for b in mod["main"].body.block.alloc_buffers if b.name == "p1_chpad"]
    assert len(weight) == 1
    shape = [int(d) for d in weight[0].ty.shape]
    assert shape[1:4] == list(ws[1:]) and shape[4] % lanes == 0 and shape[0] * shape[4] == padded


def test_a_large_plane_on_pixel_vectors_is_left_to_the_conv2d_rule():
    """ShuffleNetV2's first 1x1 (24 -> 58 on 56x56). AVX-512 pads its channels (no pixel-vector block of 16
    accumulators reaches one load per two FMAs with 58 channels). AVX2 runs it on pixel vectors, 2 channels x
    4 vectors: the channels are not on the lanes, so padding them saves nothing and the padded rule declines.
    Either way the kernel this host builds computes the unscheduled numbers."""
    func = kernel((1, 24, 56, 56), (58, 24, 1, 1))
    assert PaddedConv2dRule().apply(func, NPU, AVX2) is None
    assert "pixel vectors: 2 channels x 4 x 8 pixels" in Conv2dRule().apply(func, NPU, AVX2).mod.script()
    assert "channels padded" in PaddedConv2dRule().apply(func, NPU, AVX512).mod.script()
    rule = Conv2dRule() if PaddedConv2dRule().apply(func, NPU, NATIVE) is None else PaddedConv2dRule()
    check_rule(rule, func, host=NATIVE)


def test_float16_and_symbolic_batch():
    """fp16 (32 lanes on AVX-512: 116 padded to 128) and a batch known only at run time."""
    check_rule(PaddedConv2dRule(), kernel((1, 58, 10, 10), (116, 58, 1, 1), dtype="float16"), host=NATIVE)
    n = tirx.Var("n", "int64")
    func = fused_kernel(conv_block(), [(n, 58, 9, 9), (58, 58, 1, 1), (1, 58, 1, 1)])
    check_rule(PaddedConv2dRule(), func.with_attr("layout_free_buffers", [1]), host=NATIVE, sizes={"n": 2})


def test_conv_without_epilogue():
    func = fused_kernel(lambda x, w: op.nn.conv2d(x, w), [(1, 58, 14, 14), (116, 58, 1, 1)])
    check_rule(PaddedConv2dRule(), func.with_attr("layout_free_buffers", [1]), host=NATIVE)


def test_weight_computed_at_run_time_is_padded_in_the_kernel():
    """A weight that is not a constant (no layout_free_buffers) is padded by the kernel on every call."""
    func = fused_kernel(conv_block(), [(1, 58, 14, 14), (58, 58, 1, 1), (1, 58, 1, 1)])
    mod = check_rule(PaddedConv2dRule(), func, host=NATIVE)
    assert "layout_rewrite_preproc" not in mod.script()


@pytest.mark.parametrize("host,xs,ws", [
    (AVX2, (1, 116, 14, 14), (116, 116, 1, 1)),     # 8 lanes: 116 takes 4-lane vectors, padded to 120
    (HOST, (1, 58, 10, 10), (58, 58, 1, 1)),        # 4 lanes (SSE): 58 takes 2, padded to 60
    (HOST, (1, 16, 9, 9), (14, 16, 3, 3)),          # 3x3, 14 -> 16
])
def test_other_vector_widths(host, xs, ws):
    check_rule(PaddedConv2dRule(), kernel(xs, ws), host=host)


@pytest.mark.parametrize("host,oc", [
    (NATIVE, 64),   # a full vector divides the channels: the conv2d rule
    (NATIVE, 8),    # one vector of 8 lanes or one of 16: no fewer FMAs padded
    (HOST, 116),    # 4 lanes divide 116
])
def test_declines_where_padding_saves_no_vector_fma(host, oc):
    check_rule(PaddedConv2dRule(), kernel((1, 16, 14, 14), (oc, 16, 1, 1)), host=host, expect=False)


def _padded_weight(mod) -> list[int]:
    (weight,) = [b for b in mod["main"].body.block.alloc_buffers if b.name == "p1_chpad"]
    return [int(d) for d in weight.ty.shape]


@pytest.mark.parametrize("xs,ws,stride", [
    ((1, 40, 28, 28), (24, 40, 1, 1), 1),       # three 8-lane vectors unpadded, two full ones padded
    ((1, 72, 14, 14), (120, 72, 3, 3), 2),      # 15 of 8 lanes -> 8 of 16
])
def test_multiples_of_8_are_padded_to_full_vectors(xs, ws, stride):
    """Multiples of 8 channels, not of 16: on AVX-512 padded to whole 16-lane vectors (scheduled only: the
    host may lack AVX-512); AVX2's 8-lane vector divides them, nothing to pad. The numbers on this host, with
    the count as many half vectors of its own width (24 and 120 on AVX-512, 12 and 60 on AVX2)."""
    func = use_fast_math(kernel(xs, ws, stride))
    padded = PaddedConv2dRule().apply(func, NPU, AVX512)
    assert padded is not None
    shape = _padded_weight(padded.mod)
    assert shape[4] % 16 == 0 and shape[0] * shape[4] == -(-ws[0] // 16) * 16
    assert PaddedConv2dRule().apply(func, NPU, AVX2) is None
    lanes, oc = 2 * HALF, ws[0] // 8 * HALF
    mod = check_rule(PaddedConv2dRule(), kernel(xs, (oc, *ws[1:]), stride), host=NATIVE)
    shape = _padded_weight(mod)
    assert shape[4] % lanes == 0 and shape[0] * shape[4] == -(-oc // lanes) * lanes


def test_declines_a_pointwise_conv_on_pixel_vectors():
    """A large plane's pointwise conv runs on pixel vectors in the conv2d rule: its channels are not on the
    lanes, padding would only add work. The smallest such block at one load per two FMAs (4 channels x 4
    pixel vectors) needs 16 accumulators, AVX2's 16 registers leave 8: there the conv keeps channel vectors
    and its 36 channels are padded. Declined exactly where the conv2d rule takes pixel vectors, on AVX-512,
    AVX2 and this host."""
    func = kernel((1, 16, 56, 56), (36, 16, 1, 1))

    def on_pixel_vectors(host):
        return "pixel vectors" in Conv2dRule().apply(use_fast_math(func), NPU, host).mod.script()

    assert on_pixel_vectors(AVX512)
    for host in (AVX512, AVX2):
        assert (PaddedConv2dRule().apply(use_fast_math(func), NPU, host) is None) is on_pixel_vectors(host)
    check_rule(PaddedConv2dRule(), func, host=NATIVE, expect=not on_pixel_vectors(NATIVE))


def test_padding_rewrite_keeps_the_numbers_unscheduled():
    """The rewrite alone (no schedule): the padded conv computes the same outputs as the kernel it came from."""
    func = kernel((1, 10, 6, 6), (13, 10, 3, 3))
    padded = pad_conv_output_channels(func, "conv2d_nchw", func.params[1], 16)
    assert padded is not None
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params]
    outs = []
    for f in (func, padded):
        lib = tvm.compile(tvm.IRModule({"main": use_fast_math(f)}), target="llvm")
        args = [tvm.runtime.tensor(a.copy()) for a in arrays]
        lib["main"](*args)
        outs.append(args[-1].numpy())
    scale = np.abs(outs[0]).max()
    assert scale > 0 and np.abs(outs[1] - outs[0]).max() <= 1e-5 * scale


def test_pipeline_takes_the_padded_rule_and_agrees():
    """Through the whole pipeline (constant weights packed at compile time), on this host: a ShuffleNet-like
    unit of 58-channel convs agrees with TVM's default build."""
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((1, 58, 28, 28), "float32"))

    def const(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.1)

    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, const(58, 58, 1, 1)), const(1, 58, 1, 1))))
            y = bb.emit(op.add(op.nn.conv2d(y, const(58, 1, 3, 3), padding=[1] * 4, groups=58), const(1, 58, 1, 1)))
            y = bb.emit_output(op.nn.relu(op.add(op.nn.conv2d(y, const(58, 58, 1, 1)), const(1, 58, 1, 1))))
        bb.emit_func_output(y)
    mod = bb.get()
    inputs = random_inputs(mod)
    ref = run_reference(mod, inputs)
    for portable in (True, False):      # x86-64's 4 lanes (58 takes 2, padded to 60), this host's own
        result = compile_ours(mod, portable=portable)
        assert_close(run_vm(result.executable, inputs), ref, **tol("float32"))
        rules = [k["rule"] for k in result.report.kernels]
        assert "conv2d-padded" in rules, (portable, rules)


@pytest.mark.parametrize("rule", [PaddedConv2dRule, Conv2dRule])
def test_channel_shuffle_prologue_that_is_also_an_output(rule):
    """ShuffleNetV2's concat + channel shuffle in front of a conv, also an output of the kernel (the next unit
    reads it): the conv2d schedule kept it at the root instead of raising on moving it into its parallel
    loop (the kernel went to the fallback rule); both outputs equal the unscheduled kernel's."""
    def build(x, y, w, b):
        shuffled = op.permute_dims(op.reshape(op.concat([x, y], axis=1), (1, 2, 58, 14, 14)), [0, 2, 1, 3, 4])
        conv = op.nn.conv2d(op.reshape(shuffled, (1, 116, 14, 14)), w)
        return relax.Tuple([shuffled, op.nn.relu(op.add(conv, b))])

    func = fused_kernel(build, [(1, 58, 14, 14), (1, 58, 14, 14), (116, 116, 1, 1), (1, 116, 1, 1)])
    check_rule(rule(), func.with_attr("layout_free_buffers", [2]), host=NATIVE)


@pytest.mark.parametrize("xs,ws,residual", [
    ((1, 32, 7, 7), (144, 32, 1, 1), False),     # 9 vectors of 16 on 7-column rows: 1 x 7 -> 2 x 7 on 160
    ((1, 24, 7, 7), (144, 24, 1, 1), True),      # ... with a residual epilogue
])
def test_odd_vector_counts_on_short_rows_are_padded_to_pairs(xs, ws, residual):
    """OC a multiple of the full vector but an odd count of them (RegNet's 400 and 784 channels) on a 7x7
    plane: the conv2d rule's block would be one vector x 7 columns (7 accumulators); padded to an even
    count it is two vectors x 7. Numbers equal to the unscheduled kernel where the host runs it so."""
    func = kernel(xs, ws, 1, "relu", residual)
    mod = PaddedConv2dRule().apply(use_fast_math(func), NPU, AVX512).mod
    weight = [b for b in mod["main"].body.block.alloc_buffers if b.name == "p1_chpad"]
    assert len(weight) == 1 and int(weight[0].ty.shape[0]) * int(weight[0].ty.shape[4]) == 160
    assert "ocr=2, owr=7" in mod.script()
    check_rule(PaddedConv2dRule(), func, host=NATIVE, expect=host_vector(NATIVE).lanes("float32") == 16)


@pytest.mark.parametrize("xs,ws", [
    ((1, 32, 14, 14), (144, 32, 1, 1)),          # 14-column rows: one vector already takes 14 accumulators
    ((1, 32, 7, 7), (48, 32, 1, 1)),             # 3 vectors -> 4 would compute a third more
])
def test_odd_vector_counts_not_padded_where_it_does_not_pay(xs, ws):
    check_rule(PaddedConv2dRule(), kernel(xs, ws), host=AVX512, expect=False)


def test_pointwise_padded_conv_on_a_14_wide_plane_takes_two_vectors():
    """Xception's 1x1 conv 728->728 on 14x14 (+ bias + ReLU), padded to 736 = 46 vectors of 16: its register
    block is two vectors x 7 columns (14 accumulators) on AVX-512, not the pointwise one-vector block's 1 x 7
    (7 accumulators, measured slower); the numbers equal the unscheduled kernel's where the host runs it so.
    On AVX2 728 is 91 whole vectors of 8 and two of them x 7 columns would need 14 of its 8 accumulators:
    not padded."""
    func = kernel((1, 728, 14, 14), (728, 728, 1, 1))
    script = PaddedConv2dRule().apply(use_fast_math(func), NPU, AVX512).mod.script()
    assert "ConvTiles(vl=16, ocr=2, owr=7)" in script
    assert PaddedConv2dRule().apply(use_fast_math(func), NPU, AVX2) is None
    check_rule(PaddedConv2dRule(), func, host=NATIVE, expect=host_vector(NATIVE).lanes("float32") == 16)
