"""Squeeze-and-excitation patterns (TbeSqueezeExciteFusionPass): the squeeze and both FCs as one kernel on the
squeeze-excite rule, the channel-wise multiply left to the next conv's input; refused with a reason when the
mean is not over the spatial axes."""

import pytest
from tvm import relax
from tvm.relax import op

from tests.helpers import assert_same_numbers
from tests.patterns.util import assert_fused, build, const, refusals
from tvm_ascendfuse.switches import TBE_SQUEEZE_EXCITE


def hardsigmoid(y):
    return op.clip(op.add(op.multiply(y, relax.const(1 / 6)), relax.const(0.5)), 0, 1)


def se(bb, x, c, cs, act="relu", gate="sigmoid", axis=(2, 3), keepdims=True, dtype="float32"):
    s = bb.emit(op.mean(x, axis=list(axis), keepdims=keepdims))
    h = bb.emit(op.add(bb.emit(op.nn.conv2d(s, const((cs, c, 1, 1), dtype, 2))), const((1, cs, 1, 1), dtype, 3)))
    h = bb.emit(op.nn.relu(h) if act == "relu" else op.nn.silu(h))
    g = bb.emit(op.add(bb.emit(op.nn.conv2d(h, const((c, cs, 1, 1), dtype, 4))), const((1, c, 1, 1), dtype, 5)))
    return op.sigmoid(g) if gate == "sigmoid" else hardsigmoid(g)


def se_linear(bb, x, c, cs):
    s = bb.emit(op.reshape(bb.emit(op.mean(x, axis=[2, 3], keepdims=True)), (x.ty.shape[0], c)))
    h = bb.emit(op.nn.relu(bb.emit(op.add(bb.emit(op.matmul(s, const((c, cs), seed=2))), const((cs,), seed=3)))))
    g = bb.emit(op.sigmoid(bb.emit(op.add(bb.emit(op.matmul(h, const((cs, c), seed=4))), const((c,), seed=5)))))
    return op.reshape(g, (x.ty.shape[0], c, 1, 1))


@pytest.mark.parametrize("shape,cs,act,gate,dtype", [
    ((1, 16, 7, 7), 4, "relu", "sigmoid", "float32"),
    ((2, 13, 5, 5), 3, "silu", "sigmoid", "float32"),
    ((1, 24, 6, 6), 8, "relu", "hardsigmoid", "float32"),
    ((1, 16, 7, 7), 4, "silu", "sigmoid", "float16"),
], ids=["efficientnet", "odd_batch2", "mobilenetv3", "fp16"])
def test_se_conv_one_kernel(shape, cs, act, gate, dtype):
    mod = build([("x", shape, dtype)], lambda bb, x: se(bb, x, shape[1], cs, act, gate, dtype=dtype))
    result = assert_fused(mod, "ascendfuse.squeeze_excite.conv")
    assert result.report.kernels[0]["rule"] == "squeeze-excite"


def test_se_linear_one_kernel():
    mod = build([("x", (2, 12, 6, 6), "float32")], lambda bb, x: se_linear(bb, x, 12, 3))
    result = assert_fused(mod, "ascendfuse.squeeze_excite.linear")
    assert result.report.kernels[0]["rule"] == "squeeze-excite"


def test_channel_multiply_stays_out_of_the_se_kernel():
    """x * gate, then the projection conv: the gate kernel, and the multiply in the conv's input prologue."""
    def body(bb, x):
        g = bb.emit(se(bb, x, 16, 4))
        return op.nn.conv2d(bb.emit(op.multiply(x, g)), const((8, 16, 1, 1), seed=6))
    result = assert_same_numbers(build([("x", (1, 16, 7, 7), "float32")], body))
    rules = sorted(k["rule"] for k in result.report.kernels)
    assert rules == ["conv2d", "squeeze-excite"], result.report.kernels


@pytest.mark.parametrize("axis,k,why", [
    ((1,), 1, "not the spatial axes"),
    ((2, 3), 3, "not a plain 1x1 conv"),
])
def test_refused(axis, k, why):
    """A mean over the channels is not a squeeze; an FC that is a 3x3 conv is not an FC."""
    def body(bb, x):
        s = bb.emit(op.mean(x, axis=list(axis), keepdims=True))
        w1 = const((4, int(s.ty.shape[1]), k, k), seed=2)
        h = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(s, w1, padding=k // 2))))
        return op.sigmoid(bb.emit(op.nn.conv2d(h, const((16, 4, 1, 1), seed=4))))
    result = assert_same_numbers(build([("x", (1, 16, 7, 7), "float32")], body))
    fails = [r.get("failed", "") for r in refusals(result, TBE_SQUEEZE_EXCITE)]
    assert any(why in f for f in fails), fails
