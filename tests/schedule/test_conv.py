"""Conv2dRule: numbers equal to the unscheduled kernel for every conv shape family of the workloads
(1x1/3x3/7x7, stride 1/2, Focus 6x6 s2, residual epilogue, odd sizes, fp16, symbolic batch); UB use within
both presets; grouped/depthwise convs declined (the fallback schedules them)."""

from __future__ import annotations

import pytest
import tvm
from tvm import tirx
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.common import num_cores
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.hostvec import host_vector
from tvm_ascendfuse.schedule.indices import simplify_indices
from tvm_ascendfuse.target import get_target

# explicit hosts of both vector widths, for structure only (code built for them may not run on this machine)
AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})


def conv_bias_relu(stride=1, pad=0):
    def build(x, w, b):
        return op.nn.relu(op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad] * 4), b))
    return build


CASES = {
    # name: (x shape, w shape, stride, pad)
    "3x3_odd": ((1, 5, 13, 11), (7, 5, 3, 3), 1, 1),
    "3x3_s2": ((1, 8, 15, 15), (32, 8, 3, 3), 2, 1),
    "1x1": ((1, 24, 10, 10), (48, 24, 1, 1), 1, 0),
    "1x1_s2": ((1, 16, 14, 14), (32, 16, 1, 1), 2, 0),
    "7x7_s2": ((1, 3, 22, 22), (16, 3, 7, 7), 2, 3),
    "focus_6x6_s2": ((1, 12, 20, 20), (16, 12, 6, 6), 2, 2),
    "batch2": ((2, 8, 9, 9), (16, 8, 3, 3), 1, 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conv_bias_relu(name):
    xs, ws, stride, pad = CASES[name]
    func = fused_kernel(conv_bias_relu(stride, pad), [xs, ws, (1, ws[0], 1, 1)])
    mod = check_rule(Conv2dRule(), func, host=NATIVE)
    assert "local.UB" in mod.script()


def test_rows_the_block_does_not_divide_take_a_tail_free_block():
    """27 output columns: two vectors x 9 columns (18 accumulators on AVX-512) instead of 2 x 8 and a
    predicated 3-column tail; the numbers stay those of the unscheduled kernel."""
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    func = fused_kernel(conv_bias_relu(1, 1), [(1, 16, 9, 27), (32, 16, 3, 3), (1, 32, 1, 1)])
    assert "ocr=2, owr=9" in Conv2dRule().apply(func, NPU, avx512).mod.script()
    check_rule(Conv2dRule(), func, host=NATIVE)


def test_rows_only_three_columns_divide_take_four_vectors():
    """SqueezeNet's stem: 111 output columns (3 x 37; here 57 = 3 x 19) leave one or two vectors no tail-free
    block with half the accumulators busy; four vectors x 3 columns (12 accumulators) instead of 2 x 8 and a
    predicated tail."""
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    func = fused_kernel(conv_bias_relu(2, 0), [(1, 3, 9, 115), (64, 3, 3, 3), (1, 64, 1, 1)])   # 57 = 3 x 19 wide
    assert "ocr=4, owr=3" in Conv2dRule().apply(func, NPU, avx512).mod.script()
    check_rule(Conv2dRule(), func, host=NATIVE)


def test_portable_host():
    func = fused_kernel(conv_bias_relu(1, 1), [(1, 8, 9, 9), (16, 8, 3, 3), (1, 16, 1, 1)])
    check_rule(Conv2dRule(), func, host=HOST)


def test_residual_add_then_relu():
    def build(x, w, b, r):
        return op.nn.relu(op.add(op.add(op.nn.conv2d(x, w), b), r))

    check_rule(Conv2dRule(), fused_kernel(build, [(1, 16, 7, 7), (32, 16, 1, 1), (1, 32, 1, 1), (1, 32, 7, 7)]),
               host=NATIVE)


def test_conv_without_epilogue_and_packed_weight():
    func = fused_kernel(lambda x, w: op.nn.conv2d(x, w, padding=[1] * 4), [(1, 8, 10, 10), (32, 8, 3, 3)])
    mod = check_rule(Conv2dRule(), func.with_attr("layout_free_buffers", [1]), host=NATIVE)
    assert "layout_rewrite_preproc" in mod.script()      # OIHW -> (OC/ocb, IC, KH, KW, ocb), exact


def test_unpacked_when_weight_is_not_constant():
    func = fused_kernel(conv_bias_relu(1, 1), [(1, 8, 10, 10), (32, 8, 3, 3), (1, 32, 1, 1)])
    mod = check_rule(Conv2dRule(), func, host=NATIVE)
    assert "layout_rewrite_preproc" not in mod.script()


def test_float16():
    func = fused_kernel(conv_bias_relu(1, 1), [(1, 4, 9, 9), (16, 4, 3, 3), (1, 16, 1, 1)], dtype="float16")
    check_rule(Conv2dRule(), func, host=NATIVE)


def test_symbolic_batch():
    n = tirx.Var("n", "int64")
    func = fused_kernel(conv_bias_relu(1, 1), [(n, 4, 8, 8), (16, 4, 3, 3), (1, 16, 1, 1)])
    check_rule(Conv2dRule(), func, host=NATIVE, sizes={"n": 3})


def test_declines_grouped_depthwise_and_matmul():
    grouped = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=2), [(1, 8, 6, 6), (8, 4, 3, 3)])
    depthwise = fused_kernel(lambda x, w: op.nn.conv2d(x, w, groups=8), [(1, 8, 6, 6), (8, 1, 3, 3)])
    mm = fused_kernel(lambda a, b: op.matmul(a, b), [(8, 8), (8, 8)])
    for func in (grouped, depthwise, mm):
        assert Conv2dRule().apply(func, get_target("ascend910b"), NATIVE) is None


@pytest.mark.parametrize("preset", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("name", ["3x3_odd", "7x7_s2", "focus_6x6_s2", "1x1"])
def test_ub_bytes_within_capacity(preset, name):
    xs, ws, stride, pad = CASES[name]
    target = get_target(preset)
    func = fused_kernel(conv_bias_relu(stride, pad), [xs, ws, (1, ws[0], 1, 1)])
    usage = kernel_usage("k", Conv2dRule().apply(func, target, NATIVE).mod["main"], target)
    assert 0 < usage.bytes("local.UB") <= target.capacity("local.UB")
    assert not usage.symbolic("local.UB")


def test_wide_kernel_register_block_puts_columns_first():
    """A 3x3 conv re-reading its weights per register block takes 1 x 14 (14 columns per weight vector)
    on a 28-wide output and reads the NCHW input in place; a 1x1 conv takes the pointwise block 1 x 7.
    Both exact."""
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    for ws, pad, tiles in (((32, 32, 3, 3), 1, "ocr=1, owr=14"), ((32, 32, 1, 1), 0, "ocr=1, owr=7")):
        func = fused_kernel(conv_bias_relu(1, pad), [(1, 32, 28, 28), ws, (1, 32, 1, 1)])
        func = func.with_attr("layout_free_buffers", [1])
        script = Conv2dRule(plane_chunks=False).apply(func, NPU, avx512).mod.script()
        assert tiles in script
        if pad:
            assert "rc_0" not in script                      # no NCHW[16]c copy of the input
        check_rule(Conv2dRule(plane_chunks=False), func, host=NATIVE)


@pytest.mark.parametrize("residual", [False, True])
def test_accumulator_tile_transposed_through_shuffles(residual):
    """AVX-512 fp32 with 8-column register blocks: the NCHW[16]c tile reaches the NCHW epilogue through the
    shuffle intrinsic (every output channel and column lands in place, residual read in NCHW); a tile of
    another shape keeps the strided epilogue."""
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})

    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, padding=[1] * 4), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    shapes = [(1, 8, 6, 16), (64, 8, 3, 3), (1, 64, 1, 1)] + ([(1, 64, 6, 16)] if residual else [])
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])
    rule = Conv2dRule(plane_chunks=False)
    assert "T.Shuffle" in rule.apply(func, NPU, avx512).mod.script()
    assert "T.Shuffle" not in Conv2dRule(plane_chunks=False, transpose=False).apply(func, NPU, avx512).mod.script()
    check_rule(rule, func, host=NATIVE)
    for width in (12, 17, 37):       # 6-column blocks; one 17-column block; 8-column blocks over a padded row
        odd = fused_kernel(conv_bias_relu(1, 1), [(1, 8, 6, width), (64, 8, 3, 3), (1, 64, 1, 1)])
        check_rule(rule, odd, host=NATIVE)
    # 37 columns: padded to 40 (column_pad.py), whole 8-column blocks store through the shuffles; left with a
    # predicated tail, the tile is no transpose's shape
    assert "T.Shuffle" in rule.apply(odd, NPU, avx512).mod.script()
    assert "T.Shuffle" not in Conv2dRule(plane_chunks=False, column_pad=False).apply(odd, NPU, avx512).mod.script()


@pytest.mark.parametrize("chunk", [None, 4])
def test_input_channel_chunks_are_exact(chunk):
    """Chunked input channels (accumulator row kept across chunks) compute the same numbers; with
    chunk=None the chunk comes from the target's UB (here the input slice exceeds a quarter of it)."""
    func = fused_kernel(conv_bias_relu(1, 1), [(1, 64, 12, 240), (16, 64, 3, 3), (1, 16, 1, 1)])
    mod = check_rule(Conv2dRule(channel_chunk=chunk), func, host=NATIVE)
    assert "rc_0" in mod.script()
    usage = kernel_usage("k", mod["main"], get_target("ascend910b"))
    assert usage.bytes("local.UB") <= get_target("ascend910b").ub_usable


@pytest.mark.parametrize("xs,ws,stride,pad", [((1, 32, 16, 16), (16, 32, 1, 1), 1, 0),
                                              ((1, 32, 17, 17), (32, 32, 3, 3), 2, 1)])
def test_input_relaid_out_nchwc_is_exact(xs, ws, stride, pad):
    """Many channels on large planes: the input goes NCHW[vl]c inside the kernel (forced small here)."""
    rule = Conv2dRule(nchwc_min_ic=16, nchwc_min_plane=256, plane_chunks=False)
    func = fused_kernel(conv_bias_relu(stride, pad), [xs, ws, (1, ws[0], 1, 1)])
    mod = check_rule(rule, func.with_attr("layout_free_buffers", [1]), host=NATIVE)
    assert "rc_0" in mod.script() and "pad_temp" in mod.script()


def test_shape_changing_epilogue_runs_after_the_conv():
    """A concatenate merged into the conv kernel writes a larger buffer than the conv: it must not be
    computed per conv tile (it was, and half the channels came out as garbage)."""
    def build(x, w, b, other):
        return op.concat([other, op.nn.leakyrelu(op.add(op.nn.conv2d(x, w), b), 0.1)], axis=1)

    check_rule(Conv2dRule(), fused_kernel(build, [(1, 3, 8, 8), (4, 3, 1, 1), (1, 4, 1, 1), (1, 4, 8, 8)]),
               host=NATIVE)


def test_matmul_with_concat_epilogue():
    from tvm_ascendfuse.schedule.matmul import MatmulRule

    def build(x, w, other):
        return op.concat([op.nn.relu(op.matmul(x, w)), other], axis=1)

    func = fused_kernel(build, [(8, 16), (16, 32), (8, 8)])
    if MatmulRule().apply(func, get_target("ascend910b"), NATIVE) is not None:
        check_rule(MatmulRule(), func, host=NATIVE)


PLANE_CASES = {
    # small output planes: input-channel chunks outside the pixel loops, accumulator = a block of rows
    "3x3_7x7": (((1, 32, 7, 7), (128, 32, 3, 3), (1, 128, 1, 1)), 1, 1, False),
    "3x3_s2_to_7x7": (((1, 32, 13, 13), (128, 32, 3, 3), (1, 128, 1, 1)), 2, 1, False),
    "1x1_row_blocks": (((1, 64, 12, 12), (64, 64, 1, 1), (1, 64, 1, 1)), 1, 0, False),
    "1x1_residual": (((1, 64, 14, 14), (128, 64, 1, 1), (1, 128, 1, 1), (1, 128, 14, 14)), 1, 0, True),
    # a 28x28 plane's accumulator exceeds the budget: pointwise convs take blocks of rows instead
    "1x1_28x28_row_blocks": (((1, 32, 28, 28), (32, 32, 1, 1), (1, 32, 1, 1)), 1, 0, False),
    # input channels no power of two divides into chunks (MobileNet/EfficientNet widths): chunks of 48, 24, 40
    "1x1_144_channels": (((1, 144, 28, 28), (32, 144, 1, 1), (1, 32, 1, 1)), 1, 0, False),
    "1x1_72_channels_residual": (((1, 72, 14, 14), (48, 72, 1, 1), (1, 48, 1, 1), (1, 48, 14, 14)), 1, 0, True),
    "3x3_120_channels": (((1, 120, 7, 7), (128, 120, 3, 3), (1, 128, 1, 1)), 1, 1, False),
}


@pytest.mark.parametrize("name", list(PLANE_CASES))
def test_small_plane_channel_chunks_are_exact(name):
    shapes, stride, pad, residual = PLANE_CASES[name]

    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad] * 4), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    func = fused_kernel(build, list(shapes)).with_attr("layout_free_buffers", [1])

    def chunked(script):
        return "rc_0" in script and "yy_0" in script      # chunked reduction, row blocks

    # the rule's own path for every case on AVX-512; on AVX2 (8 accumulators) the 72 -> 48 case's 14-wide row
    # takes 1 x 7, a load per FMA, and the flat plane's block takes it (``test_conv_flat_plane.py``): the
    # chunks are asked for with the flat plane off, at both widths and on this host
    assert chunked(Conv2dRule().apply(func, NPU, AVX512).mod.script())
    rule = Conv2dRule(flat_plane=False)
    for host in (AVX512, AVX2):
        assert chunked(rule.apply(func, NPU, host).mod.script()), host
        assert "yy_0" not in Conv2dRule(flat_plane=False, plane_chunks=False).apply(func, NPU, host).mod.script()
    assert chunked(check_rule(rule, func, host=NATIVE).script())
    for preset in ("ascend910b", "ascend310p"):
        target = get_target(preset)
        used = kernel_usage("k", rule.apply(func, target, NATIVE).mod["main"], target).bytes("local.UB")
        assert 0 < used <= target.ub_usable // 4     # the accumulator block is sized from the target's UB


@pytest.mark.parametrize("xs,ws,residual", [((1, 160, 7, 7), (96, 160, 1, 1), True),
                                            ((2, 72, 6, 6), (40, 72, 1, 1), False),
                                            ((1, 37, 5, 7), (48, 37, 1, 1), False)])
def test_pointwise_on_a_row_of_one_register_block_is_not_chunked(xs, ws, residual):
    """A 1x1 conv whose output row is one pointwise register block (7x7 planes on AVX-512) keeps the
    register-resident reduction over all input channels instead of the plane's channel chunks; exact
    (residual, batch 2, 8-lane channels, odd input channels); a 3x3 conv on the same plane still chunks."""
    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(xs[0], ws[0], xs[2], xs[3])] if residual else [])
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    assert "rc_0" not in Conv2dRule().apply(func, NPU, avx512).mod.script()
    check_rule(Conv2dRule(), func, host=NATIVE)
    wide = fused_kernel(conv_bias_relu(1, 1), [(1, 32, 7, 7), (128, 32, 3, 3), (1, 128, 1, 1)])
    assert "rc_0" in Conv2dRule().apply(wide.with_attr("layout_free_buffers", [1]), NPU, avx512).mod.script()


def test_plane_chunks_keep_two_tasks_per_core():
    """A prime row count (7) with one channel block would leave a single parallel task: not chunked then (one
    block: 2 x 16 of 32 channels on AVX-512, one 8-lane vector of 8 channels on AVX2). 32 channels on AVX2 are
    four 8-channel blocks, two tasks per core: chunked."""
    for host, oc, chunks in ((AVX512, 32, False), (AVX2, 8, False), (AVX2, 32, True)):
        func = fused_kernel(conv_bias_relu(1, 1), [(1, 32, 7, 7), (oc, 32, 3, 3), (1, oc, 1, 1)])
        script = Conv2dRule().apply(func, NPU, host).mod.script()
        assert ("rc_0" in script and "yy_0" in script) == chunks, (host, oc)
        assert ("T.parallel(T.int64(7))" in script) == (not chunks), (host, oc)


def test_large_planes_keep_the_nchwc_input():
    """1x1 on 56x56 (12.5 KB channel planes) on channel vectors (pixel vectors off: the path a computed input
    takes): the input is still re-laid out NCHW[vl]c, no row blocks."""
    func = fused_kernel(conv_bias_relu(1, 0), [(1, 128, 56, 56), (32, 128, 1, 1), (1, 32, 1, 1)])
    script = Conv2dRule(pixel_vectors=False).apply(func, NPU, NATIVE).mod.script()
    assert "yy_0" not in script and "pad_temp" in script


@pytest.mark.parametrize("xs,ws,stride,residual", [
    ((1, 32, 48, 48), (48, 32, 1, 1), 1, False),     # input staged NCHW[16]c, 8-column blocks
    ((2, 19, 40, 60), (32, 19, 1, 1), 1, True),      # odd IC read in place, 6-column blocks, batch 2
    ((1, 16, 56, 58), (96, 16, 1, 1), 1, False),     # 8 columns with a predicated tail
    ((2, 24, 90, 90), (80, 24, 1, 1), 2, True),      # strided: gathered, then pointwise on 45x45
    ((1, 16, 48, 48), (40, 16, 1, 1), 1, False),     # 8-lane vectors: the default block
])
def test_pointwise_on_large_planes_takes_one_vector_of_channels(xs, ws, stride, residual):
    """1x1 convs on planes too large for the plane chunks, on channel vectors (pixel vectors off: the path
    a computed input takes): one vector of output channels x 8 columns on AVX-512 (the store transpose's
    tile), and the unscheduled kernel's numbers (odd channels, batch 2, strided, widths not a multiple of
    8, channels not a multiple of the vector), with the default rule too."""
    oh, ow = (xs[2] - 1) // stride + 1, (xs[3] - 1) // stride + 1

    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(xs[0], ws[0], oh, ow)] if residual else [])
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    script = Conv2dRule(pixel_vectors=False).apply(func, NPU, avx512).mod.script()
    owr = next(d for d in range(8, 0, -1) if ow % d == 0)
    owr = owr if 2 * owr > 8 else 8
    assert (f"vl=16, ocr=1, owr={owr}" in script) == (ws[0] % 16 == 0), ws
    check_rule(Conv2dRule(pixel_vectors=False), func, host=NATIVE)
    check_rule(Conv2dRule(), func, host=NATIVE)


@pytest.mark.parametrize("xs,ws,residual", [((1, 32, 14, 14), (64, 32, 1, 1), False),
                                            ((1, 16, 13, 13), (32, 16, 1, 1), True)])
def test_strided_pointwise_gathers_its_input_once(xs, ws, residual):
    """A 1x1 stride-2 conv (ResNet downsample) gathers the pixels it reads into an output-sized buffer and
    runs as a stride-1 pointwise conv on it: exact, also on odd sizes and with a residual epilogue."""
    oh = (xs[2] - 1) // 2 + 1

    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=2), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(1, ws[0], oh, oh)] if residual else [])
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])
    script = check_rule(Conv2dRule(), func, host=NATIVE).script()
    assert "conv_subsample" in script
    assert "conv_subsample" not in Conv2dRule(subsample_strided=False).apply(func, NPU, NATIVE).mod.script()


def test_row_blocks_sized_from_the_targets_l1():
    """W1's padded input (64ch, 58x58 fp32) in blocks of 28 output rows fits the 910B's 512 KiB L1: one
    block per core; 128 channels need twice the blocks."""
    for ic, blocks in ((64, 2), (128, 4)):
        func = fused_kernel(conv_bias_relu(1, 1), [(1, ic, 56, 56), (32, ic, 3, 3), (1, 32, 1, 1)])
        script = Conv2dRule().apply(func.with_attr("layout_free_buffers", [1]), NPU, HOST).mod.script()
        assert f"in T.parallel(T.int64({blocks}))" in script, [ln for ln in script.splitlines() if "parallel" in ln]


@pytest.mark.parametrize("xs,ws,stride,pad", [((2, 8, 16, 12), (32, 8, 3, 3), 1, 1),
                                              ((1, 3, 32, 32), (16, 3, 7, 7), 2, 3)])
def test_input_padded_inside_the_parallel_row_blocks(xs, ws, stride, pad):
    """3x3 / 7x7-s2 convs on small-channel inputs: each parallel task pads the input rows of its own block
    of output rows (one parallel region, halo rows padded by both neighbours), exact across block edges and
    batches; the task count is a multiple of the host's cores."""
    func = fused_kernel(conv_bias_relu(stride, pad), [xs, ws, (1, ws[0], 1, 1)]).with_attr(
        "layout_free_buffers", [1])
    script = check_rule(Conv2dRule(), func, host=NATIVE).script()
    parallel = [line for line in script.splitlines() if "T.parallel" in line]
    assert len(parallel) == 1 and "yy_0" in parallel[0], parallel          # no separate pad region
    assert script.index("T.parallel") < script.index('T.sblock("pad_temp")')
    extent = int(parallel[0].split("T.int64(")[1].split(")")[0])
    assert extent % (xs[0] * num_cores(NATIVE)) == 0
    old = Conv2dRule(pad_in_task=False).apply(func, NPU, NATIVE).mod.script()
    assert old.count("T.parallel") == 2                                    # the root-level pad region


@pytest.mark.parametrize("xs,ws,stride,residual,dtype", [
    ((1, 16, 14, 14), (24, 16, 1, 1), 1, True, "float32"),
    ((2, 24, 9, 11), (72, 24, 1, 1), 1, False, "float32"),
    ((1, 40, 13, 13), (24, 40, 1, 1), 2, False, "float32"),
    ((1, 8, 10, 10), (24, 8, 3, 3), 2, False, "float32"),
    ((1, 16, 10, 12), (24, 16, 1, 1), 1, True, "float16"),
])
def test_channels_a_multiple_of_8_not_16_are_exact(xs, ws, stride, residual, dtype):
    """24/72 output channels on an AVX-512 host: register blocks of three 8-lane vectors (packed weights,
    residual epilogue, strided, batch 2, odd planes, fp16) compute the unscheduled kernel's numbers."""
    pad = ws[2] // 2
    oh = (xs[2] + 2 * pad - ws[2]) // stride + 1
    ow = (xs[3] + 2 * pad - ws[3]) // stride + 1

    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad] * 4), b)
        return op.nn.relu(op.add(y, r[0]) if residual else y)

    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(xs[0], ws[0], oh, ow)] if residual else [])
    func = fused_kernel(build, shapes, dtype=dtype).with_attr("layout_free_buffers", [1])
    mod = check_rule(Conv2dRule(), func, host=NATIVE)
    if ws[2] == 1 and host_vector(NATIVE).lanes(dtype) >= 16:
        assert "vl=8, ocr=3" in mod.script()


def conv_bias_act(stride, pad, act, residual=False):
    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad] * 4), b)
        if residual:
            y = op.add(y, r[0])
        return {"silu": op.nn.silu, "relu": op.nn.relu, "none": lambda v: v}[act](y)
    return build


LANE_EPILOGUE = "epilogue on 16-lane channel vectors"


@pytest.mark.parametrize("xs,ws,stride,pad,act", [
    ((1, 48, 7, 7), (64, 48, 1, 1), 1, 0, "silu"),        # 7-column register block, no 8x16 store transpose
    ((2, 40, 14, 14), (32, 40, 1, 1), 1, 0, "silu"),      # small plane's channel chunks, batch 2: 7-column stores
    ((1, 19, 12, 12), (48, 19, 3, 3), 1, 1, "relu"),      # 3x3, odd input channels, 6-column stores
    ((1, 24, 28, 28), (32, 24, 3, 3), 2, 1, "silu"),      # strided 3x3 onto 14x14, rows padded per task
    ((1, 37, 5, 7), (48, 37, 1, 1), 1, 0, "silu"),        # odd input channels, 5x7 plane
])
def test_epilogue_on_channel_vectors_is_exact(xs, ws, stride, pad, act):
    """Where the NCHW-order epilogue would read the NCHW[16]c accumulator lane-strided in vectors of 1-2
    columns (7/14-wide planes, plane chunks), it runs on 16-lane channel vectors and reaches NCHW through the
    output register transpose (AVX-512 host): the unscheduled kernel's numbers (SiLU, batch 2, odd IC,
    strided 3x3); with the option off the epilogue keeps its NCHW order."""
    func = fused_kernel(conv_bias_act(stride, pad, act), [xs, ws, (1, ws[0], 1, 1)]).with_attr(
        "layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    assert LANE_EPILOGUE in Conv2dRule().apply(func, NPU, avx512).mod.script()
    assert LANE_EPILOGUE not in Conv2dRule(lane_epilogue=False).apply(func, NPU, avx512).mod.script()
    check_rule(Conv2dRule(), func, host=NATIVE)


def test_conv_without_epilogue_stores_through_the_transpose():
    """No epilogue (a 7x7 pointwise conv alone): the accumulator copy itself is the transposed store."""
    func = fused_kernel(lambda x, w: op.nn.conv2d(x, w), [(1, 32, 7, 7), (48, 32, 1, 1)]).with_attr(
        "layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    assert LANE_EPILOGUE in Conv2dRule().apply(func, NPU, avx512).mod.script()
    check_rule(Conv2dRule(), func, host=NATIVE)


@pytest.mark.parametrize("xs,ws,act,residual,option,lanes", [
    ((1, 16, 16, 16), (64, 16, 1, 1), "silu", True, True, False),    # residual read along the columns
    ((1, 16, 7, 7), (64, 16, 1, 1), "silu", True, True, True),       # ... unless the columns are odd (7)
    ((1, 16, 5, 9), (32, 16, 1, 1), "relu", True, True, True),       # ... 9 columns, 3-column store transposes
    ((1, 16, 16, 16), (96, 16, 1, 1), "relu", False, True, False),   # 8x16 block, cheap epilogue: its own
    ((2, 16, 16, 16), (96, 16, 1, 1), "silu", False, True, True),    # ... store transpose; SiLU on lanes
    ((2, 16, 16, 16), (96, 16, 1, 1), "relu", False, "always", True),  # ... or when asked for, batch 2
])
def test_epilogue_order_on_whole_columns(xs, ws, act, residual, option, lanes):
    """A residual epilogue (read contiguous along the columns, a gather on channel vectors) keeps the
    NCHW-order epilogue, except on an odd number of columns (7, 9), where that order would run on single
    columns (a gather and a scatter per vector of channels); so does a cheap one (bias + ReLU) on the 8 x 16
    register blocks the store transpose serves, while SiLU (~30 ops an element) runs on channel vectors there
    too. Numbers exact either way."""
    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(xs[0], ws[0], xs[2], xs[3])] if residual else [])
    func = fused_kernel(conv_bias_act(1, 0, act, residual), shapes).with_attr("layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    rule = Conv2dRule(lane_epilogue=option)
    assert (LANE_EPILOGUE in rule.apply(func, NPU, avx512).mod.script()) == lanes
    check_rule(rule, func, host=NATIVE)


def test_silu_epilogue_runs_per_tile():
    """SiLU's fast-math exp tests its let-bound argument for underflow (a Select on a value, not on an index):
    the epilogue still runs per conv tile, not as a second pass over the conv's output in GM."""
    func = fused_kernel(conv_bias_act(1, 0, "silu"), [(1, 16, 7, 7), (64, 16, 1, 1), (1, 64, 1, 1)]).with_attr(
        "layout_free_buffers", [1])
    script = check_rule(Conv2dRule(), func, host=NATIVE).script()
    assert script.count("T.parallel") == 1 and "conv2d_nchw_intermediate_local_UB" in script


@pytest.mark.parametrize("hw", [2, 3])
def test_strided_pointwise_conv_to_a_single_pixel(hw):
    """A 1x1 stride-2 conv whose output is one pixel (ResNet-style downsampling at the end of a small
    network): the kernel's data read keeps the unit window iterators, so the strided input is not gathered
    into a smaller plane; the conv rule schedules it (it raised inside the gather before)."""
    import numpy as np
    from tvm import relax

    from tests.helpers import assert_same_numbers

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, hw, hw), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((128, 64, 1, 1)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            o = bb.emit_output(op.nn.relu(op.nn.conv2d(x, w, strides=2)))
        bb.emit_func_output(o)
    result = assert_same_numbers(bb.get())
    assert list(result.report.sections["schedules"].values()) == ["conv2d"]
    assert not result.report.sections.get("rule_errors")


def _narrow_pointwise(act, residual, dtype="float32"):
    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w), b)
        if act == "relu6":
            y = op.clip(y, 0.0, 6.0)
        elif act == "silu":
            y = op.nn.silu(y)
        return op.add(y, r[0]) if residual else y
    return build


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n,ic,oc,h,w,act,residual", [
    (1, 19, 24, 32, 32, "none", True),      # MobileNetV2's projection + residual, odd input channels
    (2, 16, 40, 32, 48, "relu6", False),    # batch 2, 40 channels (EfficientNet), 12 blocks of 128 pixels
    (1, 7, 12, 64, 16, "silu", True),       # odd input channels, a plane 16 wide
    (1, 16, 96, 32, 32, "relu6", False),    # an expansion, channels a full vector divides
], ids=["proj_residual", "batch2_relu6", "odd_silu", "expansion"])
def test_pointwise_on_pixel_vectors(n, ic, oc, h, w, act, residual, dtype):
    """A stride-1 1x1 conv on a plane of enough whole pixel blocks runs on pixel vectors (the plane flattened
    on the lanes, one broadcast weight per FMA, no staging or store transpose) and computes what the
    unscheduled kernel computes, with its epilogue (bias, activation, residual add)."""
    shapes = [(n, ic, h, w), (oc, ic, 1, 1), (1, oc, 1, 1)] + ([(n, oc, h, w)] if residual else [])
    func = fused_kernel(_narrow_pointwise(act, residual, dtype), shapes, dtype).with_attr("layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    script = Conv2dRule().apply(func, NPU, avx512).mod.script()
    lanes = 16 if dtype == "float32" else 32
    assert f"x {lanes} pixels" in script and "packed" in script
    check_rule(Conv2dRule(), func, host=NATIVE)


@pytest.mark.parametrize("build,shapes", [
    (_narrow_pointwise("relu6", False), [(1, 16, 16, 16), (32, 16, 1, 1), (1, 32, 1, 1)]),   # 4 blocks
    (lambda x, w, b: op.add(op.nn.conv2d(x, w, strides=2), b),                              # strided
     [(1, 16, 64, 64), (24, 16, 1, 1), (1, 24, 1, 1)]),
    (_narrow_pointwise("none", False), [(1, 16, 28, 28), (24, 16, 1, 1), (1, 24, 1, 1)]),    # 49 vectors
    (_narrow_pointwise("none", False), [(1, 16, 32, 32), (10, 16, 1, 1), (1, 10, 1, 1)]),    # no block
], ids=["few_blocks", "strided", "ragged_plane", "ten_channels"])
def test_other_pointwise_convs_keep_channel_vectors(build, shapes):
    """A plane of fewer pixel blocks than 4 per core, a strided conv, a plane no block of pixel vectors
    divides (28x28: 49 vectors), and channels no register block of at most one load per two FMAs divides
    (10) keep the channel-vector register block; numbers exact. (An SE-gated input takes pixel vectors
    like an ungated one: ``test_gated_weight.py``.)"""
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    assert "pixel vectors" not in Conv2dRule().apply(func, NPU, avx512).mod.script()
    check_rule(Conv2dRule(), func, host=NATIVE)


@pytest.mark.parametrize("ic,oc,h,w,residual,block", [
    (16, 96, 32, 32, False, "4 channels x 2"),      # an expansion on a plane of 32x32
    (24, 58, 56, 56, True, "2 channels x 4"),       # 58 channels: 4 do not divide them
    (32, 24, 28, 28, False, None),                  # 28x28: under PIXEL_MIN_PLANE, channel vectors
], ids=["expansion", "58_channels", "28x28"])
def test_pointwise_on_pixel_vectors_with_sixteen_registers(ic, oc, h, w, residual, block):
    """On AVX2 (8 accumulators) no pixel-vector block reaches one load per two FMAs: the conv takes the fewest
    loads its accumulators allow (6 per 8 FMAs), 4 channels x 2 vectors, or 2 x 4 where 4 do not divide the
    channels; planes under PIXEL_MIN_PLANE pixels keep the channel vectors. Numbers of the AVX2 build equal
    the unscheduled kernel's (any AVX-512 host runs it too)."""
    shapes = [(1, ic, h, w), (oc, ic, 1, 1), (1, oc, 1, 1)] + ([(1, oc, h, w)] if residual else [])
    func = fused_kernel(_narrow_pointwise("relu6", residual), shapes).with_attr("layout_free_buffers", [1])
    script = Conv2dRule().apply(func, NPU, AVX2).mod.script()
    if block is None:
        assert "pixel vectors" not in script
    else:
        assert f"pixel vectors: {block} x 8 pixels" in script
    check_rule(Conv2dRule(), func, host=AVX2)


# MobileViT's unfold after a 1x1 conv: (1, C, H, W) -> (C * H/2, 2, W/2, 2) -> 2x2 patches as rows of pixels
# (1, C, H, W) -> (2, 2, H/2, W/2, C). A tile of 7 image rows is no box of (patch row, row in patch); a tile
# of channels is, but TVM's region analysis swept one patch column of it only.
UNFOLD_CASES = {"28x28_96": (64, 96, 28), "14x14_120": (80, 120, 14), "8x8_144": (96, 144, 8)}


@pytest.mark.parametrize("name", list(UNFOLD_CASES))
def test_patch_unfold_epilogue_writes_every_element(name):
    cin, cout, hw = UNFOLD_CASES[name]

    def build(x, w):
        y = op.nn.conv2d(x, w)
        y = op.reshape(y, (cout * hw // 2, 2, hw // 2, 2))
        y = op.permute_dims(y, [0, 2, 1, 3])
        y = op.reshape(y, (1, cout, hw * hw // 4, 4))
        y = op.permute_dims(y, [0, 3, 2, 1])
        return op.reshape(y, (2, 2, hw // 2, hw // 2, cout))

    # the schedule phase hands rules kernels with the reshapes' index arithmetic simplified
    func = simplify_indices(fused_kernel(build, [(1, cin, hw, hw), (cout, cin, 1, 1)]))
    func = func.with_attr("layout_free_buffers", [1])
    # check_rule starts every output from random values: an element the schedule leaves unwritten differs
    check_rule(Conv2dRule(), func, host=NATIVE)


@pytest.mark.parametrize("xs,ws,pad,cols", [
    ((1, 64, 13, 13), (256, 64, 1, 1), 0, 13),     # SqueezeNet's expand 1x1 on 13x13: the plane's channel chunks
    ((1, 16, 13, 13), (64, 16, 3, 3), 1, 13),      # its 3x3 sibling: one 13-column register block a row
    ((1, 16, 9, 55), (64, 16, 3, 3), 1, 11),       # 55 = 5 x 11 columns: 11-column register blocks
])
def test_prime_widths_store_through_two_transposes(xs, ws, pad, cols):
    """Rows of 11 or 13 columns (no store transpose of 8 or fewer columns divides them; the NCHW-order epilogue
    ran on single columns, scalar) run the epilogue on channel vectors and store through one transpose of two
    8-column halves; the unscheduled kernel's numbers on the AVX-512 (16 lanes) and AVX2 (8 lanes) hosts.
    (A pointwise conv whose rows no register block fits runs over the flattened plane by default; the row
    form is the one without it, ``flat_plane=False``.)"""
    func = fused_kernel(conv_bias_act(1, pad, "relu"), [xs, ws, (1, ws[0], 1, 1)]).with_attr(
        "layout_free_buffers", [1])
    rule = Conv2dRule(flat_plane=False)
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    assert f"{LANE_EPILOGUE}, {cols}-column store transposes" in rule.apply(func, NPU, avx512).mod.script()
    check_rule(rule, func, host=NATIVE)
    avx2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})
    check_rule(rule, func, host=avx2)


@pytest.mark.parametrize("xs,ws", [((1, 16, 15, 55), (64, 16, 1, 1)), ((1, 64, 15, 55), (16, 64, 1, 1))])
def test_pointwise_conv_on_55_wide_rows_takes_11_columns_and_reads_its_input_in_place(xs, ws):
    """SqueezeNet's 1x1 convs at 55x55: 1 x 11 register blocks (stored through the 11-column transpose)
    instead of 1 x 5, and the input read in place (no 8-column input transpose divides the row, so its
    NCHW[16]c staging was a lane-by-lane gather) on AVX-512; the unscheduled kernel's numbers there, on
    AVX2 (8 accumulators: no 11-column block) and on the portable host."""
    func = fused_kernel(conv_bias_act(1, 0, "relu"), [xs, ws, (1, ws[0], 1, 1)]).with_attr(
        "layout_free_buffers", [1])
    avx512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    text = Conv2dRule().apply(func, NPU, avx512).mod.script()
    assert "ConvTiles(vl=16, ocr=1, owr=11)" in text and "11-column store transposes" in text
    assert "pad_temp" not in text         # no staged copy of the input
    for host in (NATIVE, tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"}), HOST):
        check_rule(Conv2dRule(), func, host=host)
