"""Convs with one kernel column on rows no register block fits (Inception's 17-wide rows) computed over the
flattened output plane (``conv_schedule._flat_plane_plan``), checked against TVM's default build of the
unscheduled kernel (relative to the output's scale)."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.conv_schedule import ConvOptions, _flat_plane_plan
from tvm_ascendfuse.schedule.hostvec import HostVector, host_vector

AVX512, AVX2 = HostVector(512, 32, 2), HostVector(256, 16, 2)


def _conv(pad_h=0, pad_w=0, residual=False):
    def build(x, w, b, *res):
        y = op.add(op.nn.conv2d(x, w, padding=[pad_h, pad_w, pad_h, pad_w]), b)
        return op.nn.relu(op.add(y, res[0]) if residual else y)
    return build


def _note(mod) -> str:
    script = mod.script()
    start = script.index('"ascendfuse.schedule": "') + len('"ascendfuse.schedule": "')
    return script[start:script.index('"', start)]


CASES = {
    # name: (x, w, pad along H, pad along W, residual): every plane leaves pixels after its blocks (289 = 24 x 12 + 1)
    "1x1_17": ((1, 48, 17, 17), (64, 48, 1, 1), 0, 0, False),
    "7x1_17": ((1, 32, 17, 17), (64, 32, 7, 1), 3, 0, False),
    "3x1_17_residual": ((1, 32, 17, 17), (64, 32, 3, 1), 1, 0, True),
    # a kernel along W: the padded input staged column-major, the plane too
    "1x7_17": ((1, 32, 17, 17), (64, 32, 1, 7), 0, 3, False),
    "1x3_17x13_residual": ((1, 32, 17, 13), (64, 32, 1, 3), 0, 1, True),
    # 96 channels = 6 vectors: 3 x 16 channels x 8 pixels, two channel blocks for the two cores
    "7x1_96": ((1, 16, 17, 17), (96, 16, 7, 1), 3, 0, False),
    # a 13-wide plane (169 = 14 x 12 + 1), batch of 2
    "1x1_13_batch2": ((2, 32, 13, 13), (64, 32, 1, 1), 0, 0, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_flat_plane_is_exact(name):
    xs, ws, pad_h, pad_w, residual = CASES[name]
    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(xs[0], ws[0], xs[2], xs[3])] if residual else [])
    mod = check_rule(Conv2dRule(), fused_kernel(_conv(pad_h, pad_w, residual), shapes), host=NATIVE)
    if host_vector(NATIVE).bits == 512:            # the plans below are AVX-512's (the numbers hold anywhere)
        note = _note(mod)
        assert "flat plane" in note and "pixels + " in note and ("column-major" in note) == (pad_w > 0)


def test_flat_plane_with_concat_input_and_slice_epilogue():
    """Inception's merged sibling 1x1 convs: the input a concat staged flat, the outputs channel slices (an
    epilogue that cannot follow the tiles: it runs after the conv)."""
    def build(a, b, w, bias):
        y = op.nn.relu(op.add(op.nn.conv2d(op.concat([a, b], axis=1), w), bias))
        return relax.Tuple([op.strided_slice(y, [1], [0], [32]), op.strided_slice(y, [1], [32], [64])])

    func = fused_kernel(build, [(1, 16, 17, 17), (1, 32, 17, 17), (64, 48, 1, 1), (1, 64, 1, 1)])
    mod = check_rule(Conv2dRule(), func, host=NATIVE)
    if host_vector(NATIVE).bits == 512:
        assert "flat plane" in _note(mod)


def test_portable_host_is_exact():
    """SSE/AVX2 widths: the plan follows the host's lanes and registers."""
    xs, ws = (1, 16, 17, 17), (32, 16, 7, 1)
    check_rule(Conv2dRule(), fused_kernel(_conv(3), [xs, ws, (1, 32, 1, 1)]), host=HOST)


@pytest.mark.parametrize("xs,ws", [((1, 256, 7, 7), (32, 256, 1, 1)), ((1, 64, 14, 14), (48, 64, 1, 1))])
def test_sixteen_register_host_is_exact(xs, ws):
    """AVX2's flat planes: 2 x 6 over a 7x7 plane in 128-channel chunks of the reduction, 3 x 4 over 14x14
    (the leftover pixel loop and the chunks' accumulator reloads checked)."""
    func = fused_kernel(_conv(), [xs, ws, (1, ws[0], 1, 1)])
    avx2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})
    mod = check_rule(Conv2dRule(), func, host=avx2)
    assert ("flat plane: 2 x 8 channels x 6 pixels + 1, 128-channel chunks" if xs[1] == 256
            else "flat plane: 3 x 8 channels x 4 pixels") in _note(mod)


def _plan(xs, ws, pad_h=0, pad_w=0, hv=AVX512, stride=1):
    from tvm_ascendfuse.schedule.analysis import has_reduce, match_conv2d
    from tvm_ascendfuse.schedule.common import new_schedule, root_blocks

    def build(x, w, b):
        return op.nn.relu(op.add(op.nn.conv2d(x, w, strides=stride, padding=[pad_h, pad_w, pad_h, pad_w]), b))

    func = fused_kernel(build, [xs, ws, (1, ws[0], 1, 1)])
    sch = new_schedule(tvm.IRModule({"main": func}))
    blocks = list(root_blocks(sch))
    ci = next(i for i, b in enumerate(blocks) if has_reduce(sch, b))
    info = match_conv2d(sch, blocks[ci])
    loops = sch.get_loops(blocks[ci])
    dims = [int(sch.get(lp).extent) for lp in loops]
    return _flat_plane_plan(ConvOptions(), sch, blocks[ci], info, blocks[:ci], (dims[1], dims[2], dims[3]),
                            dims[4], hv, NPU)


def test_plan_only_where_the_row_block_is_poor():
    # 17-wide rows: one vector x 17 columns in the row, 2 x 12 over the plane (AVX-512)
    assert _plan((1, 192, 17, 17), (192, 192, 7, 1), 3) == (2, 12, False, None)
    assert _plan((1, 768, 17, 17), (192, 768, 1, 1)) == (2, 12, False, None)
    assert _plan((1, 192, 17, 17), (192, 192, 1, 7), 0, 3) == (2, 12, True, None)
    # 96 channels: 2 vectors would leave 3 channel blocks for 2 cores
    assert _plan((1, 96, 17, 17), (96, 96, 7, 1), 3) == (3, 8, False, None)
    # 160: 2 x 12 leaves 5 blocks, 5 x 4 is more vectors than pixels: the row block
    assert _plan((1, 160, 17, 17), (160, 160, 7, 1), 3) is None
    # AVX2 (8 lanes, 16 registers): the row block has a column tail at 17
    assert _plan((1, 192, 17, 17), (192, 192, 7, 1), 3, hv=AVX2) is not None
    # rows a block fits keep it: 8 wide (2 x 8), 35 wide (2 x 7)
    assert _plan((1, 384, 8, 8), (384, 384, 3, 1), 1) is None
    assert _plan((1, 288, 35, 35), (64, 288, 1, 1)) is None
    assert _plan((1, 64, 12, 12), (64, 64, 1, 1)) is None            # 2 x 6, its plane chunks
    assert _plan((1, 64, 56, 56), (64, 64, 1, 1)) is None            # 2 x 8 on large planes
    assert _plan((1, 16, 56, 58), (96, 16, 1, 1)) is None            # the pointwise 1 x 8 recipe, tail or not
    # AVX2's 14- and 7-wide rows: 1 x 7 in the row (8 loads per 7 FMAs); 3 x 4 does not divide 40 or 64
    # vectors, so 2 x 6 (12 of 16 registers); on 7x7 planes with many input channels, in chunks of them
    assert _plan((1, 320, 14, 14), (320, 320, 1, 1), hv=AVX2) == (2, 6, False, None)
    assert _plan((1, 1024, 14, 14), (256, 1024, 1, 1), hv=AVX2) == (2, 6, False, None)
    assert _plan((1, 2048, 7, 7), (512, 2048, 1, 1), hv=AVX2) == (2, 6, False, 128)
    assert _plan((1, 784, 7, 7), (784, 784, 1, 1), hv=AVX2) == (2, 6, False, 112)
    assert _plan((1, 72, 14, 14), (24 * 8, 72, 1, 1), hv=AVX2) == (3, 4, False, None)
    # AVX-512 keeps its 2 x 7 row on 7 wide
    assert _plan((1, 2048, 7, 7), (512, 2048, 1, 1)) is None
    # a kernel along both axes, a strided conv, 11 vectors of channels (one block only): rows
    assert _plan((1, 192, 17, 17), (192, 192, 3, 3), 1, 1) is None
    assert _plan((1, 192, 35, 35), (192, 192, 1, 1), stride=2) is None
    assert _plan((1, 192, 17, 17), (176, 192, 1, 1)) is None
