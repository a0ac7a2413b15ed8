"""PoolRule: max/avg/global-mean pooling alone and as the tail of a conv kernel (ResNet's stem conv + max-pool,
last conv + residual + global mean) compute what the unscheduled kernel computes (odd sizes, fp32/fp16);
staged tiles fit UB on both presets; row reductions and instance-norm-like kernels are declined; in the
pipeline a conv + max-pool kernel gets this rule."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op

from tests.helpers import assert_same_numbers
from tests.schedule.kernels import HOST, NATIVE, check_rule, fused_kernel
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.analysis import match_pool
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.hostvec import host_vector
from tvm_ascendfuse.schedule.pool import PoolRule, choose_pool_tile
from tvm_ascendfuse.target import get_target

NPU = get_target("ascend910b")
AVX2_HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})
# scheduled only (this machine may lack its vectors): the structure asserted for both x86 widths
AVX512_HOST = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})


def _script_for(func, host) -> str:
    """The pool rule's schedule of ``func`` for ``host``, not run."""
    return PoolRule().apply(use_fast_math(func), NPU, host).mod.script()


def _flat(x):
    """Flatten a pooled NCHW [1, C, 1, 1] to [1, C] (reshape needs its input's type: normalise first)."""
    return op.reshape(relax.BlockBuilder.current().normalize(x), (1, -1))


def max_pool(x):
    return op.nn.max_pool2d(x, pool_size=3, strides=2, padding=[1] * 4)


def stem(x, w, b):
    """ResNet stem: conv 7x7/2 + bias + ReLU + max-pool 3x3/2 in one kernel."""
    return max_pool(op.nn.relu(op.add(op.nn.conv2d(x, w, strides=2, padding=[3] * 4), b)))


def head(x, w, b, r):
    """Last bottleneck conv 1x1 + bias + residual + ReLU + global average pool + flatten."""
    y = op.nn.relu(op.add(op.add(op.nn.conv2d(x, w), b), r))
    return _flat(op.mean(y, axis=[2, 3], keepdims=True))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(1, 16, 17, 17), (2, 5, 9, 14), (1, 3, 4, 5)])
def test_max_pool_alone(shape, dtype):
    mod = check_rule(PoolRule(), fused_kernel(max_pool, [shape], dtype), host=NATIVE)
    assert "local.UB" in mod.script()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_avg_pool_with_divide_epilogue(dtype):
    build = lambda x: op.nn.avg_pool2d(x, pool_size=2, strides=2)   # noqa: E731 - sum + divide
    check_rule(PoolRule(), fused_kernel(build, [(1, 7, 11, 10)], dtype), host=NATIVE)


def test_shape_changing_epilogue_runs_after_the_pool():
    """A concatenate after the pool writes more than a pool tile: it must not be placed per tile."""
    build = lambda x, other: op.concat([other, max_pool(x)], axis=1)   # noqa: E731
    check_rule(PoolRule(), fused_kernel(build, [(1, 6, 9, 9), (1, 3, 5, 5)]), host=NATIVE)


def test_global_mean_and_flatten():
    build = lambda x: _flat(op.mean(x, axis=[2, 3], keepdims=True))   # noqa: E731
    check_rule(PoolRule(), fused_kernel(build, [(1, 37, 7, 7)]), host=NATIVE)


# (fp16 only on short planes: the reference build sums 3136 squares serially in fp16 and is itself off by 7%)
@pytest.mark.parametrize("shape, dtype", [((1, 24, 56, 56), "float32"), ((2, 5, 13, 13), "float32"),
                                          ((1, 7, 9, 21), "float32"), ((2, 5, 13, 13), "float16")])
def test_global_pool_of_a_computed_plane_uses_partial_sums(shape, dtype):
    """ConvNeXt-V2's GRN: the sum of squares over each plane, no conv before it. Summed as vector partial
    sums over the plane (one scalar chain per channel ran at 3.6 GFLOP/s), on AVX2 too where no divisor of
    a 13 x 13 plane fits one vector."""
    build = lambda x: op.sum(op.multiply(x, x), axis=[2, 3], keepdims=True)   # noqa: E731
    func = fused_kernel(build, [shape], dtype)
    mod = check_rule(PoolRule(), func, host=NATIVE)
    for text in (mod.script(), _script_for(func, AVX2_HOST), _script_for(func, AVX512_HOST)):
        assert "global pool" in text and "partial sums" in text


def test_global_mean_over_a_short_plane_keeps_the_window_path():
    """A plane shorter than four vectors: the partial sums would be mostly reduction overhead."""
    mod = check_rule(PoolRule(), fused_kernel(lambda x: op.mean(x, axis=[2, 3], keepdims=True), [(1, 32, 5, 5)]),
                     host=NATIVE)
    assert "global pool" not in mod.script() and "pool tile" in mod.script()


def test_portable_host():
    check_rule(PoolRule(), fused_kernel(max_pool, [(1, 8, 13, 13)]), host=HOST)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv_then_max_pool(dtype):
    func = fused_kernel(stem, [(1, 3, 30, 26), (16, 3, 7, 7), (1, 16, 1, 1)], dtype)
    mod = check_rule(PoolRule(), func, host=NATIVE)
    text = mod.script()
    assert "ConvTiles" in text and "pool tile" in text     # the conv part got the conv rule's schedule


def downsample(x, w, b):
    """DLA's downsampling: a strided 3x3 conv + bias + ReLU and, beside it, a 2x2 max-pool of the same input
    (no padding block: the pool stages the kernel input the conv's padding also reads)."""
    y = op.nn.relu(op.add(op.nn.conv2d(x, w, strides=2, padding=[1] * 4), b))
    return relax.Tuple([y, op.nn.max_pool2d(x, pool_size=2, strides=2)])


@pytest.mark.parametrize("shape", [(1, 16, 28, 28), (1, 8, 14, 18)])
def test_conv_beside_a_pool_of_its_input(shape):
    c = shape[1]
    func = fused_kernel(downsample, [shape, (2 * c, c, 3, 3), (1, 2 * c, 1, 1)])
    text = check_rule(PoolRule(), func, host=NATIVE).script()
    assert "ConvTiles" in text and "pool tile" in text


def token_mixer(x, w, b, s):
    """PoolFormer/EfficientFormer: a conv's output y, then (avg_pool(y) - y) * scale + y in the same kernel:
    the epilogue reads y beside the pool's result."""
    y = op.add(op.nn.conv2d(x, w), b)
    pooled = op.nn.avg_pool2d(y, pool_size=3, strides=1, padding=[1] * 4, count_include_pad=False)
    return op.add(op.multiply(op.subtract(pooled, y), s), y)


@pytest.mark.parametrize("shape", [(1, 16, 14, 14), (1, 8, 9, 13)])
def test_conv_then_pool_minus_its_input(shape):
    c = shape[1]
    func = fused_kernel(token_mixer, [shape, (c, c, 1, 1), (1, c, 1, 1), (1, c, 1, 1)])
    text = check_rule(PoolRule(), func, host=NATIVE).script()
    assert "ConvTiles" in text and "pool tile" in text


def test_conv_straight_into_avg_pool():
    """No epilogue between the conv and the pool; the pool's divide follows it."""
    def build(x, w):
        return op.nn.avg_pool2d(op.nn.conv2d(x, w, padding=[1] * 4), pool_size=2, strides=2)

    mod = check_rule(PoolRule(), fused_kernel(build, [(1, 4, 10, 9), (16, 4, 3, 3)]), host=NATIVE)
    assert "ConvTiles" in mod.script()


# The conv rule's schedule of head()'s 48-channel 1x1 conv on a 7x7 plane, by host fp32 lanes: row blocks on
# AVX-512; on AVX2 a 7-wide row's own block takes a load per FMA, so the plane runs as one pixel axis
# (``conv_schedule._flat_plane_plan``)
HEAD_CONV = {16: "ConvTiles(vl=16,", 8: "flat plane: 3 x 8 channels x 4 pixels + 1"}


def test_conv_residual_then_global_mean():
    """The conv part gets the conv rule's schedule for the host's vectors, the pool its channel lanes."""
    func = fused_kernel(head, [(1, 16, 7, 7), (48, 16, 1, 1), (1, 48, 1, 1), (1, 48, 7, 7)])
    texts = {NATIVE: check_rule(PoolRule(), func, host=NATIVE).script()}
    texts.update({h: _script_for(func, h) for h in (AVX2_HOST, AVX512_HOST)})
    for host, text in texts.items():
        lanes = host_vector(host).lanes("float32")
        assert HEAD_CONV[lanes] in text and f"{lanes} channel lanes" in text, (host, text[-3000:])


def test_declines_what_is_not_pooling():
    row_mean = fused_kernel(lambda x: op.mean(x, axis=[-1], keepdims=True), [(4, 6, 5, 33)])
    channel_sum = fused_kernel(lambda x: op.sum(x, axis=[1], keepdims=True), [(1, 8, 5, 5)])
    inst_norm = fused_kernel(lambda x: op.variance(x, axis=[2, 3], keepdims=True), [(1, 8, 5, 5)])
    mm = fused_kernel(lambda a, b: op.matmul(a, b), [(8, 8), (8, 8)])
    for func in (row_mean, channel_sum, inst_norm, mm):
        assert PoolRule().apply(func, NPU, NATIVE) is None


@pytest.mark.parametrize("preset", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("case", ["pool", "stem", "head"])
def test_ub_bytes_within_capacity(preset, case):
    target = get_target(preset)
    funcs = {"pool": fused_kernel(max_pool, [(1, 64, 112, 112)]),     # ResNet's pool size: tiles must shrink
             "stem": fused_kernel(stem, [(1, 3, 30, 30), (16, 3, 7, 7), (1, 16, 1, 1)]),
             "head": fused_kernel(head, [(1, 16, 7, 7), (48, 16, 1, 1), (1, 48, 1, 1), (1, 48, 7, 7)])}
    usage = kernel_usage("k", PoolRule().apply(funcs[case], target, NATIVE).mod["main"], target)
    assert 0 < usage.bytes("local.UB") <= target.capacity("local.UB")


def test_tile_sizes_from_ub_and_cores():
    import tvm

    func = fused_kernel(max_pool, [(1, 64, 112, 112)])
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    pool = next(p for p in (match_pool(sch, b) for b in sch.get_child_blocks(sch.get_sblock("root"))) if p)
    cb, rb = choose_pool_tile(64, 56, 56, pool, 4, NPU, cores=2)
    assert 64 % cb == 0 and 56 % rb == 0 and (64 // cb) * (56 // rb) >= 8
    small = get_target("ascend910b", ub_bytes=24 * 1024, ub_reserved_bytes=0)
    cb2, rb2 = choose_pool_tile(64, 56, 56, pool, 4, small, cores=2)
    assert cb2 * rb2 < cb * rb                       # a smaller UB gives a smaller tile


def test_pipeline_uses_pool_rule_for_conv_max_pool():
    """Conv + BN + ReLU + MaxPool through the whole pipeline: one kernel, scheduled by this rule, same numbers."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 20, 20), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((8, 3, 3, 3)).astype("float32"))
            y = bb.emit(op.nn.conv2d(x, w, strides=2, padding=[1] * 4))
            y = bb.emit(op.add(y, relax.const(rng.standard_normal((1, 8, 1, 1)).astype("float32"))))
            y = bb.emit(op.nn.relu(y))
            out = bb.emit_output(max_pool(y))
        bb.emit_func_output(out)
    res = assert_same_numbers(bb.get())
    rules = {row["rule"] for row in res.report.kernels if "max_pool" in row["name"]}
    assert rules == {"pool"}, res.report.kernels


def classifier(x, w, b):
    """SqueezeNet's classifier: conv 1x1 + bias + ReLU + global mean + flatten, in one kernel."""
    y = op.nn.relu(op.add(op.nn.conv2d(x, w), b))
    return _flat(op.mean(y, axis=[2, 3], keepdims=True))


def fire_classifier(a, c, w, b):
    """The same reading the concat of a fire module's two expand branches."""
    return classifier(op.concat([a, c], axis=1), w, b)


def _padded_weight(mod):
    return [bf for bf in mod["main"].body.block.alloc_buffers if bf.name.endswith("_chpad")
            and len(bf.ty.shape) == 5]


@pytest.mark.parametrize("host", [NATIVE, AVX2_HOST])
@pytest.mark.parametrize("case", [
    ("plain", [(1, 32, 13, 13), (36, 32, 1, 1), (1, 36, 1, 1)]),         # 9 vectors of 4 lanes: 3 of 16, 5 of 8
    ("concat", [(1, 16, 13, 13), (1, 16, 13, 13), (52, 32, 1, 1), (1, 52, 1, 1)]),       # 13 of 4: 4 / 7
    ("plain", [(2, 8, 9, 11), (20, 8, 3, 3), (1, 20, 1, 1)]),           # 3x3, batch 2, odd plane: 5 of 4 lanes
])
def test_conv_channels_padded_in_front_of_a_pool(host, case):
    """Output channels no full vector divides are computed on full vectors (zero weight rows, the padded
    lanes never stored) in the conv in front of a pool too; the numbers are the unscheduled kernel's."""
    kind, shapes = case
    build = fire_classifier if kind == "concat" else classifier
    func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [len(shapes) - 2])
    mod = check_rule(PoolRule(), func, host=host)
    text = mod.script()
    assert "channels padded" in text and "pool tile" in text
    lanes = host_vector(host).lanes("float32")
    weight = _padded_weight(mod)
    oc = shapes[-1][1]
    assert len(weight) == 1
    shape = [int(d) for d in weight[0].ty.shape]
    assert shape[0] * shape[4] == -(-oc // lanes) * lanes and shape[4] % lanes == 0


def test_squeezenet_classifier_padded_to_full_vectors():
    """1000 channels (125 vectors of 8 lanes on AVX-512) -> 1008 (63 of 16), reading a fire module's concat."""
    shapes = [(1, 16, 13, 13), (1, 16, 13, 13), (1000, 32, 1, 1), (1, 1000, 1, 1)]
    func = fused_kernel(fire_classifier, shapes).with_attr("layout_free_buffers", [2])
    mod = check_rule(PoolRule(), func, host=NATIVE)
    lanes = host_vector(NATIVE).lanes("float32")
    assert ("channels padded" in mod.script()) == (1000 % lanes != 0)


def test_conv_in_front_of_a_pool_not_padded_where_it_saves_nothing():
    """48 channels are three full vectors on AVX-512 (no padding); on AVX2 six of 8 lanes: none either."""
    for host in (NATIVE, AVX2_HOST):
        func = fused_kernel(classifier, [(1, 16, 7, 7), (48, 16, 1, 1), (1, 48, 1, 1)])
        mod = check_rule(PoolRule(), func.with_attr("layout_free_buffers", [1]), host=host)
        assert "channels padded" not in mod.script() and not _padded_weight(mod)


def test_pipeline_pads_a_classifier_conv_in_front_of_its_global_mean():
    """Fire-module concat + conv (18 channels: 9 vectors of 2 lanes, on any x86 vector width) + ReLU + global mean
    through the whole pipeline (the weight a constant, packed padded at compile time): one pool-rule kernel
    with its channels padded, the numbers of TVM's default build."""
    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1, 16, 13, 13), "float32"))
    c = relax.Var("c", relax.TensorType((1, 16, 13, 13), "float32"))
    with bb.function("main", [a, c]):
        with bb.dataflow():
            x = bb.emit(op.concat([op.nn.relu(a), op.nn.relu(c)], axis=1))
            w = relax.const(rng.standard_normal((18, 32, 1, 1)).astype("float32") * 0.2)
            y = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w), relax.const(
                rng.standard_normal((1, 18, 1, 1)).astype("float32")))))
            out = bb.emit_output(op.reshape(op.mean(y, axis=[2, 3], keepdims=True), (1, 18)))
        bb.emit_func_output(out)
    res = assert_same_numbers(bb.get())
    pooled = [row for row in res.report.kernels if "mean" in row["name"]]
    assert [row["rule"] for row in pooled] == ["pool"], res.report.kernels
    assert "channels padded" in res.scheduled_module[pooled[0]["name"]].script()


def fire_pool(a, c):
    """SqueezeNet's max-pool behind a fire module: the concat of the two expand branches, 3x3/2, ceil mode."""
    return op.nn.max_pool2d(op.concat([a, c], axis=1), pool_size=3, strides=2, ceil_mode=True)


def transition_pool(x):
    """DenseNet's transition: a 2x2/2 average pool (sum + divide epilogue)."""
    return op.nn.avg_pool2d(x, pool_size=2, strides=2)


@pytest.mark.parametrize("case", [
    # (build, shapes, {host lanes: channel lanes expected}): output rows shorter than a host vector
    (fire_pool, [(1, 32, 27, 27), (1, 32, 27, 27)], {16: True, 8: False, 4: False}),    # 13 columns
    (fire_pool, [(1, 16, 13, 13), (1, 48, 13, 13)], {16: True, 8: True, 4: False}),     # 6
    (transition_pool, [(1, 64, 14, 14)], {16: True, 8: True, 4: False}),                 # 7
    (max_pool, [(2, 32, 5, 5)], {16: True, 8: True, 4: True}),                           # 3
])
def test_pool_over_narrow_rows_vectorises_channels(case):
    """Output rows shorter than a host vector (the plain path's window then runs scalar) are pooled with a
    channel vector innermost; same numbers as the unscheduled kernel on the AVX-512, AVX2 and portable hosts."""
    build, shapes, expect = case
    for host in (NATIVE, AVX2_HOST, HOST):
        text = check_rule(PoolRule(), fused_kernel(build, shapes), host=host).script()
        lanes = host_vector(host).lanes("float32")
        assert ("channel lanes" in text) == expect[lanes], (host, text[-2000:])


def test_pool_over_rows_a_vector_divides_keeps_the_window_path():
    """Output rows of a vector or more (SqueezeNet's first two pools: 55 and 27 columns) and channels no 4-lane
    vector divides stay on the plain window path."""
    ceil_pool = lambda x: op.nn.max_pool2d(x, pool_size=3, strides=2, ceil_mode=True)   # noqa: E731
    for build, shapes in ((ceil_pool, [(1, 32, 111, 111)]), (ceil_pool, [(1, 32, 55, 55)]), (max_pool, [(1, 6, 13, 13)])):
        text = check_rule(PoolRule(), fused_kernel(build, shapes), host=NATIVE).script()
        assert "channel lanes" not in text and "pool tile" in text


def test_channel_lane_tiles_hold_whole_vectors():
    """A channel-lane tile is whole channel vectors, however the tile shrinks to give the cores work."""
    from tvm import s_tir

    func = fused_kernel(fire_pool, [(1, 128, 27, 27), (1, 128, 27, 27)])
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    pool = next(p for p in (match_pool(sch, b) for b in sch.get_child_blocks(sch.get_sblock("root"))) if p)
    for channels in (256, 48):          # 48: a tile of 12 channels would give every core four tiles
        for step in (4, 8, 16):
            cb, rb = choose_pool_tile(channels, 13, 13, pool, 4, NPU, cores=2, step=step)
            assert cb % step == 0 and channels % cb == 0 and 13 % rb == 0, (channels, step, cb)


def squeezenet_stem(x, w, b):
    """SqueezeNet's stem: conv 3x3/2 + bias + ReLU + max-pool 3x3/2 in ceil mode, one kernel."""
    y = op.nn.relu(op.add(op.nn.conv2d(x, w, strides=2), b))
    return op.nn.max_pool2d(y, pool_size=3, strides=2, ceil_mode=True)


def _kernel_buffers(mod) -> list[tuple]:
    """(shape, scope) of the buffers the scheduled kernel allocates."""
    import tvm_ffi
    from tvm import s_tir

    found = []
    tvm_ffi.structural_walk(mod["main"].body, [(s_tir.SBlock, lambda block: found.extend(
        (tuple(int(d) for d in b.shape), b.scope()) for b in block.alloc_buffers))], order="pre")
    return found


@pytest.mark.parametrize("case", [
    (squeezenet_stem, [(1, 3, 31, 29), (32, 3, 3, 3), (1, 32, 1, 1)]),        # 15 x 14 -> 7 x 7 (ceil)
    (stem, [(1, 3, 30, 26), (16, 3, 7, 7), (1, 16, 1, 1)]),                    # padded pool (ResNet's stem)
    (lambda x, w, b: op.nn.max_pool2d(op.nn.relu(op.add(op.nn.conv2d(x, w), b)), pool_size=3, strides=2),
     [(1, 8, 13, 11), (32, 8, 3, 3), (1, 32, 1, 1)]),                           # no padding block (Inception's
                                                                                # conv 3x3 + max-pool)
    (lambda x, w, b: op.nn.avg_pool2d(op.add(op.nn.conv2d(x, w), b), pool_size=3, strides=1, padding=[1] * 4,
                                      count_include_pad=True),                  # Inception's pool branch,
     [(1, 24, 9, 11), (16, 24, 1, 1), (1, 16, 1, 1)]),                          # convolved first
])
def test_pool_behind_a_conv_reads_its_channel_vectors(case):
    """The conv part's result stays in the accumulator's NCHW[vl]c layout (a 5-d kernel buffer, written on
    channel vectors) and the pool reads whole channel vectors of it; same numbers as the unscheduled kernel on
    the AVX-512, AVX2 and portable hosts (whose vectors give 16, 8 and 4 lanes)."""
    build, shapes = case
    oc = shapes[1][0]
    for host in (NATIVE, AVX2_HOST, HOST):
        lanes = host_vector(host).lanes("float32")
        mod = check_rule(PoolRule(), fused_kernel(build, shapes), host=host)
        assert f"{lanes} channel lanes" in mod.script(), host
        kernel = [shape for shape, scope in _kernel_buffers(mod) if scope == "global"]     # (and the padded input)
        assert [s for s in kernel if len(s) == 5 and s[1] * s[4] == oc and s[4] == lanes], (host, kernel)
        assert not [s for s in kernel if len(s) == 4 and s[1] == oc], (host, kernel)


def silu_head(x, w, b):
    """EfficientNet's head: conv 1x1 + bias + SiLU + global mean + flatten."""
    y = op.add(op.nn.conv2d(x, w), b)
    return _flat(op.mean(op.multiply(y, op.sigmoid(y)), axis=[2, 3], keepdims=True))


@pytest.mark.parametrize("case", [
    (fire_classifier, [(1, 16, 13, 13), (1, 16, 13, 13), (200, 32, 1, 1), (1, 200, 1, 1)]),  # padded on AVX-512
    (classifier, [(1, 48, 13, 13), (256, 48, 1, 1), (1, 256, 1, 1)]),
    (classifier, [(2, 96, 7, 7), (128, 96, 1, 1), (1, 128, 1, 1)]),                      # batch 2, 2 vectors
    (silu_head, [(1, 64, 7, 7), (256, 64, 1, 1), (1, 256, 1, 1)]),
])
def test_global_mean_summed_from_the_conv_accumulator(case):
    """A global mean behind a conv whose epilogue reads only per-channel tensors is summed in the conv's
    own task from its accumulator tile: the conv's result (padded or not) is never stored as a plane (no
    4-d or 5-d buffer of its channels outside UB); same numbers as the unscheduled kernel on the AVX-512, AVX2
    and portable hosts."""
    build, shapes = case
    oc, plane = shapes[-1][1], shapes[0][2:]
    for host in (NATIVE, AVX2_HOST, HOST):
        func = fused_kernel(build, shapes).with_attr("layout_free_buffers", [len(shapes) - 2])
        mod = check_rule(PoolRule(), func, host=host)
        lanes = host_vector(host).lanes("float32")
        assert f"plane pool from the conv's accumulator tile, {lanes} channel lanes" in mod.script(), host
        # (the conv's input, staged, has fewer channels than its output in these cases)
        planes = [s for s, scope in _kernel_buffers(mod) if scope == "global" and len(s) in (4, 5)
                  and s[2:4] == plane and s[1] * (s[4] if len(s) == 5 else 1) >= oc]
        assert not planes, (host, planes)


def test_global_mean_behind_a_conv_of_few_channel_blocks_keeps_the_blocked_path():
    """A conv of few output channel blocks on a large plane (a task a block of rows there) would leave
    cores idle with whole planes per task, and its plane does not fit UB: the pool keeps the blocked
    hand-off, with the same numbers."""
    def build(x, w, b):
        y = op.nn.relu(op.add(op.nn.conv2d(x, w, padding=[1] * 4), b))
        return _flat(op.mean(y, axis=[2, 3], keepdims=True))

    for host in (NATIVE, HOST):
        mod = check_rule(PoolRule(), fused_kernel(build, [(1, 8, 40, 40), (32, 8, 3, 3), (1, 32, 1, 1)]), host=host)
        assert "accumulator tile" not in mod.script()


def test_global_mean_behind_a_residual_keeps_the_blocked_path():
    """A residual read along the plane is not inlined into the channel-vector sums (a gather a pixel)."""
    func = fused_kernel(head, [(1, 16, 7, 7), (48, 16, 1, 1), (1, 48, 1, 1), (1, 48, 7, 7)])
    assert "accumulator tile" not in check_rule(PoolRule(), func, host=NATIVE).script()


@pytest.mark.parametrize("case", [
    # (conv input, weight) -> pooled width: SqueezeNet's stem (55 = 5 x 11 columns), 13, 8 and 16 columns
    ([(1, 3, 223, 223), (32, 3, 3, 3)], 55),
    ([(1, 8, 55, 55), (16, 8, 3, 3)], 13),
    ([(1, 8, 35, 35), (32, 8, 3, 3)], 8),
    ([(1, 8, 67, 67), (16, 8, 3, 3)], 16),
])
def test_pooled_tile_stored_through_register_transposes(case):
    """The pooled channel-vector tile reaches the NCHW result through register transposes of a column block
    dividing the row (whole-vector loads and row stores, not one lane extract and scalar store per element);
    same numbers as the unscheduled kernel on the AVX-512 and AVX2 hosts."""
    shapes, width = case
    shapes = shapes + [(1, shapes[1][0], 1, 1)]
    for host in (NATIVE, AVX2_HOST):
        mod = check_rule(PoolRule(), fused_kernel(squeezenet_stem, shapes), host=host)
        text = mod.script()
        out = [p for p in mod["main"].params if isinstance(p.ty, tvm.tirx.BufferType)][-1]
        assert int(out.ty.shape[-1]) == width, out.ty.shape
        assert "channel lanes, NCHW store through register transposes" in text, (host, text[-3000:])


def test_pooled_rows_no_column_block_divides_keep_the_lane_store():
    """A pooled row of 17 columns (no block of 4..16 divides it) keeps the element-wise write-back; same numbers
    on the AVX2 host and this machine's, the same structure on the AVX-512 host too."""
    shapes = [(1, 8, 71, 71), (16, 8, 3, 3), (1, 16, 1, 1)]          # conv 35 x 35 -> pool 17 x 17
    func = fused_kernel(squeezenet_stem, shapes)
    texts = {h: check_rule(PoolRule(), func, host=h).script() for h in (NATIVE, AVX2_HOST)}
    texts[AVX512_HOST] = _script_for(func, AVX512_HOST)
    for host, text in texts.items():
        lanes = host_vector(host).lanes("float32")
        assert f"{lanes} channel lanes" in text and "register transposes" not in text, (host, text[-3000:])
