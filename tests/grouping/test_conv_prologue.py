"""A conv's input prologue in the grouping (``grouping/conv_prologue.py``): per-channel elementwise ops and
injective ops in front of a plain conv's data operand join its kernel; a residual add, an H/W-varying operand
and a concat behind a conv do not; a pool of a pool is two kernels. Numbers vs the unfused module."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op

from tests.grouping.util import build, check_equivalent, legalize
from tvm_ascendfuse.grouping import conv_prologue
from tvm_ascendfuse.grouping.conv_prologue import conv_data_position, is_concat

PASS = "CostBasedFusionPass"
RNG = np.random.default_rng(2)


def const(*shape):
    return relax.const(RNG.standard_normal(shape).astype("float32"))


def whys(report):
    return [r.get("why", "") for r in report.get(PASS).not_effective]


def kernel_names(fused):
    return sorted(g.name_hint for g, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc))


def prims(mod):
    return [f for _, f in legalize(mod).functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


@pytest.mark.parametrize("pad", [0, 1])
def test_conv_data_position(pad):
    mod = build([(1, 4, 6, 6)], lambda bb, x: bb.emit(op.nn.conv2d(x, const(8, 4, 3, 3), padding=pad)))
    [prim] = prims(mod)
    assert conv_data_position(prim) == 0


def test_conv_data_position_not_a_plain_conv():
    grouped = build([(1, 4, 6, 6)], lambda bb, x: bb.emit(op.nn.conv2d(x, const(4, 2, 3, 3), groups=2)))
    matmul = build([(4, 8), (8, 3)], lambda bb, a, b: bb.emit(op.matmul(a, b)))
    for mod in (grouped, matmul):
        assert all(conv_data_position(p) is None for p in prims(mod))


def test_is_concat():
    cat = build([(1, 2, 3, 3), (1, 4, 3, 3)], lambda bb, a, b: bb.emit(op.concat([a, b], axis=1)))
    add = build([(1, 2, 3, 3), (1, 2, 3, 3)], lambda bb, a, b: bb.emit(op.add(a, b)))
    assert [is_concat(p) for p in prims(cat)] == [True]
    assert [is_concat(p) for p in prims(add)] == [False]


def test_preactivation_bn_relu_fused_into_conv():
    """DenseNet: concat -> x * s + t -> ReLU -> 1x1 conv is one kernel."""
    def body(bb, a, b):
        x = op.concat([a, b], axis=1)
        y = op.nn.relu(op.add(op.multiply(x, const(1, 12, 1, 1)), const(1, 12, 1, 1)))
        return bb.emit(op.nn.conv2d(y, const(16, 12, 1, 1)))
    fused, report, before, after = check_equivalent(build([(1, 4, 8, 8), (1, 8, 8, 8)], body))
    assert (before, after) == (5, 1)


def test_dense_layer_over_many_parts_is_one_kernel():
    """DenseNet-121's late dense layers: BN + ReLU of a concat of 24 parts (28 kernel inputs with the BN's
    scale and shift and the conv's weight and bias) in front of a 1x1 conv is still one kernel."""
    n = 24

    def body(bb, *parts):
        x = op.concat(list(parts), axis=1)
        y = op.nn.relu(op.add(op.multiply(x, const(1, 2 * n, 1, 1)), const(1, 2 * n, 1, 1)))
        return bb.emit(op.add(op.nn.conv2d(y, const(8, 2 * n, 1, 1)), const(1, 8, 1, 1)))
    fused, report, before, after = check_equivalent(build([(1, 2, 5, 5)] * n, body))
    assert after == 1, whys(report)


def test_channel_scale_fused_into_conv():
    """SE's x * gate (an (N, C, 1, 1) tensor computed elsewhere) in front of the projection conv."""
    def body(bb, x, gate):
        return bb.emit(op.nn.conv2d(op.multiply(x, op.sigmoid(gate)), const(6, 8, 1, 1)))
    fused, report, before, after = check_equivalent(build([(2, 8, 5, 5), (2, 8, 1, 1)], body))
    assert after == 1


def test_residual_add_is_not_a_prologue():
    """Two full-size operands: the add is its producers' epilogue, not the conv's prologue."""
    def body(bb, x, r):
        return bb.emit(op.nn.conv2d(op.nn.relu(op.add(x, r)), const(6, 8, 3, 3), padding=1))
    fused, report, before, after = check_equivalent(build([(1, 8, 6, 6), (1, 8, 6, 6)], body))
    assert after == 2
    assert any("two full-size operands" in w for w in whys(report)), whys(report)


def test_spatially_varying_operand_is_not_a_prologue():
    def body(bb, x, m):
        return bb.emit(op.nn.conv2d(op.multiply(x, m), const(6, 8, 1, 1)))
    fused, report, before, after = check_equivalent(build([(1, 8, 6, 6), (1, 1, 6, 6)], body))
    assert after == 2
    assert any("varies along H or W" in w for w in whys(report)), whys(report)


def test_no_concat_behind_a_conv():
    """A conv's output concatenated with another tensor: the concat is not copied inside the conv's kernel."""
    def body(bb, x, other):
        y = op.nn.relu(op.nn.conv2d(x, const(6, 4, 1, 1)))
        return bb.emit(op.concat([y, other], axis=1))
    fused, report, before, after = check_equivalent(build([(1, 4, 6, 6), (1, 3, 6, 6)], body))
    assert after == 2
    assert any("concat behind a cube op" in w for w in whys(report)), whys(report)


def test_pool_of_pool_is_two_kernels():
    """GoogLeNet: conv + ReLU -> max-pool 3x3/2 -> max-pool 3x3/1 (the next block's pool branch)."""
    def body(bb, x):
        y = op.nn.relu(op.nn.conv2d(x, const(8, 4, 3, 3), padding=1))
        y = op.nn.max_pool2d(y, pool_size=3, strides=2, padding=[1] * 4)
        return bb.emit(op.nn.max_pool2d(y, pool_size=3, strides=1, padding=[1] * 4))
    fused, report, before, after = check_equivalent(build([(1, 4, 12, 12)], body))
    assert after == 2
    assert any("feeds another" in w for w in whys(report)), whys(report)


def test_prologue_op_reasons():
    """The reasons ``prologue_op`` gives, on nodes built by hand."""
    class N:
        def __init__(self, pattern, out, args):
            self.pattern, self.var, self.args = pattern, tensor(out), [tensor(a) for a in args]

    def tensor(shape):
        return relax.Var("t", relax.TensorType(shape, "float32"))

    e = conv_prologue.ELEMWISE
    assert conv_prologue.prologue_op(N(conv_prologue.INJECTIVE, (1, 4, 3, 3), [(1, 2, 3, 3)])) is None
    assert conv_prologue.prologue_op(N(e, (2, 4, 3, 3), [(2, 4, 3, 3), (2, 4, 1, 1)])) is None
    assert conv_prologue.prologue_op(N(e, (2, 4, 3, 3), [(2, 4, 3, 3), (4, 1, 1)])) is None
    assert "two full-size" in conv_prologue.prologue_op(N(e, (2, 4, 3, 3), [(2, 4, 3, 3), (2, 4, 3, 3)]))
    assert "varies along H or W" in conv_prologue.prologue_op(N(e, (2, 4, 3, 3), [(2, 4, 3, 3), (3,)]))
    assert "not elementwise" in conv_prologue.prologue_op(N(4, (2, 4, 3, 3), [(2, 4, 3, 3)]))
    assert "NCHW" in conv_prologue.prologue_op(N(e, (4, 3), [(4, 3)]))
