"""Rows padded to whole register blocks (``column_pad.py``): a conv whose row no good register block divides
computes padded columns, and stores only its own."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.relax import op

from tests.schedule.kernels import NATIVE, NPU, check_rule, fused_kernel
from tvm_ascendfuse.schedule.column_pad import pad_conv_columns, padded_columns
from tvm_ascendfuse.schedule.conv import Conv2dRule
from tvm_ascendfuse.schedule.conv_schedule import ConvChoice, choose_conv_tiles
from tvm_ascendfuse.schedule.hostvec import host_vector

AVX512 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
AVX2 = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "znver3"})


def _conv(xs, ws, pad, residual=False):
    def build(x, w, b, *r):
        y = op.add(op.nn.conv2d(x, w, padding=pad), b)
        return op.nn.relu(op.add(y, r[0]) if r else y)

    oh = xs[2] + pad[0] + pad[2] - ws[2] + 1
    ow = xs[3] + pad[1] + pad[3] - ws[3] + 1
    shapes = [xs, ws, (1, ws[0], 1, 1)] + ([(1, ws[0], oh, ow)] if residual else [])
    return fused_kernel(build, shapes)


def _padded(func, host) -> bool:
    return "columns padded to" in Conv2dRule().apply(func, NPU, host).mod.script()


def test_padded_columns():
    assert padded_columns(71, 4) == 72 and padded_columns(17, 4) == 20
    assert padded_columns(72, 4) is None          # whole blocks already
    assert padded_columns(3, 4) is None           # the block is wider than the row
    assert padded_columns(71, 1) is None


@pytest.mark.parametrize("residual", [False, True])
def test_prime_width_is_padded_at_both_widths_and_matches(residual):
    """71 columns (Inception's 80->192 3x3 on 73x73): on AVX2 the only tail-free block is 4 vectors x 1 column;
    on AVX-512 there is none. Both pad the row; the padded columns read the row's last input column and are
    never stored, the residual is read at the row's own columns."""
    func = _conv((1, 8, 4, 73), (32, 8, 3, 3), [0, 0, 0, 0], residual)
    assert _padded(func, AVX2) and _padded(func, AVX512)
    mod = check_rule(Conv2dRule(), func, host=NATIVE)
    assert "columns padded to" in mod.script()
    assert "columns padded to" not in Conv2dRule(column_pad=False).apply(func, NPU, AVX2).mod.script()


def test_one_by_seven_on_seventeen_columns():
    """Inception's 1x7 convs on 17x17: AVX2's row block pads 2 x 4 to 20 columns instead of 4 x 1 (where the
    conv does not run over its flat plane: 2 x 6 there, which measured faster than the padded row); AVX-512
    keeps its tail-free 1 x 17 block (one vector x 17 columns)."""
    func = _conv((1, 16, 3, 17), (32, 16, 1, 7), [0, 3, 0, 3])
    hv = host_vector(AVX2)
    t = choose_conv_tiles(32, 17, "float32", hv, NPU, columns_first=True, pad_columns=True)
    assert (t.ocr, t.owr) == (2, 4)
    assert (choose_conv_tiles(32, 17, "float32", hv, NPU, columns_first=True).owr) == 1    # 4 x 1 without
    assert "flat plane (column-major): 2 x 8 channels x 6 pixels" in Conv2dRule().apply(func, NPU, AVX2).mod.script()
    assert "columns padded to" in Conv2dRule(flat_plane=False).apply(func, NPU, AVX2).mod.script()
    assert not _padded(func, AVX512)
    check_rule(Conv2dRule(), func, host=NATIVE)


def test_divisible_rows_and_good_tail_free_blocks_are_not_padded():
    """A row a block divides, and one whose tail-free block is several columns wide (35 = 5 x 7: 2 x 5 on AVX2)
    keep the plain schedule."""
    for xs in ((1, 8, 4, 74), (1, 8, 4, 37)):
        func = _conv(xs, (32, 8, 3, 3), [0, 0, 0, 0])
        assert not _padded(func, AVX2), xs


def test_a_tuner_keeps_the_unpadded_space():
    """Under a tiles chooser the rule does not pad (the rewrite makes a new schedule, which a trace cannot
    record): the chooser sees the unpadded kernel's default."""
    func = _conv((1, 8, 4, 73), (32, 8, 3, 3), [0, 0, 0, 0])
    seen = []

    def keep(_sch, default, _candidates):
        seen.append(default)
        return default

    script = Conv2dRule(tiles=keep).apply(func, NPU, AVX2).mod.script()
    assert seen and isinstance(seen[0], ConvChoice) and "columns padded to" not in script


def test_rewrite_refuses_an_output_accumulator():
    """The conv writing the kernel's output itself (no epilogue): no kernel buffer to pad, so no rewrite."""
    func = fused_kernel(lambda x, w: op.nn.conv2d(x, w), [(1, 8, 4, 73), (32, 8, 3, 3)])
    conv = next(b for b in _blocks(func) if b.init is not None)
    assert pad_conv_columns(func, conv.name_hint, 72) is None
    check_rule(Conv2dRule(), func, host=NATIVE)


def _blocks(func):
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append))
    return found


def test_padded_accumulator_has_whole_blocks():
    func = _conv((1, 8, 4, 73), (32, 8, 3, 3), [0, 0, 0, 0])
    conv = next(b for b in _blocks(func) if b.init is not None)
    new = pad_conv_columns(func, conv.name_hint, 72)
    assert new is not None
    acc = [b for b in new.body.block.alloc_buffers if b.name.endswith("_padded")]
    assert len(acc) == 1 and [int(d) for d in acc[0].ty.shape] == [1, 32, 2, 72]
    assert isinstance(acc[0].ty.shape[3], tirx.IntImm)


def test_conv_in_front_of_a_pool_is_padded_and_matches():
    """Inception's stem: 3x3 conv + bias + ReLU + 3x3/2 max-pool over 71 columns, one kernel (the pool rule):
    the conv computes 72 columns, the epilogue and the pool read the 71 of the row."""
    from tvm_ascendfuse.schedule.pool import PoolRule

    def build(x, w, b):
        y = op.nn.relu(op.add(op.nn.conv2d(x, w), b))
        return op.nn.max_pool2d(y, pool_size=(3, 3), strides=(2, 2))

    func = fused_kernel(build, [(1, 8, 9, 73), (32, 8, 3, 3), (1, 32, 1, 1)])
    for host in (AVX2, AVX512):
        assert "column_pad" in PoolRule().apply(func, NPU, host).mod.script(), host
    mod = check_rule(PoolRule(), func, host=NATIVE)
    assert "column_pad" in mod.script()
