"""SwishFusionPass (x * sigmoid(x) -> silu) and SoftmaxFusionPass (exp(x - max) / sum -> softmax)."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import (assert_refused, assert_same_after, assert_switched_off, build, onnx_model,
                                       ops, run_ort, run_pass)
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import SoftmaxFusionPass, SwishFusionPass

N = helper.make_node


@pytest.mark.parametrize("sigmoid_first,dtype", [(False, "float32"), (True, "float16")])
def test_swish(sigmoid_first, dtype):
    def body(bb, x):
        s = bb.emit(relax.op.sigmoid(x))
        return relax.op.multiply(s, x) if sigmoid_first else relax.op.multiply(x, s)
    mod = build(body, (4, 8), dtype=dtype)
    out, rec = run_pass(SwishFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.silu"]
    assert_same_after(mod, out)
    assert_switched_off(SwishFusionPass, mod, 1)


def test_swish_other_tensor_left_alone():
    mod = build(lambda bb, x, y: relax.op.multiply(x, bb.emit(relax.op.sigmoid(y))), (4, 8), (4, 8))
    out, rec = run_pass(SwishFusionPass, mod)
    assert rec.match_times == 0 and out.same_as(mod)


def test_swish_shared_sigmoid_refused():
    def body(bb, x):
        s = bb.emit(relax.op.sigmoid(x))
        return relax.op.multiply(x, s), s
    assert_refused(SwishFusionPass, build(body, (4, 8)), "consumers outside the pattern")


def onnx_softmax(opset):
    if opset >= 18:
        nodes = [N("ReduceMax", ["x", "ax"], ["mx"])]
    else:
        nodes = [N("ReduceMax", ["x"], ["mx"], axes=[-1])]
    nodes += [N("Sub", ["x", "mx"], ["d"]), N("Exp", ["d"], ["e"]), N("ReduceSum", ["e", "ax"], ["s"]),
              N("Div", ["e", "s"], ["y"])]
    return onnx_model(nodes, {"x": (3, 10)}, {"y": (3, 10)}, {"ax": np.array([-1])}, opset=opset)


@pytest.mark.parametrize("opset", [13, 18])
def test_onnx_softmax(opset):
    model = onnx_softmax(opset)
    mod = import_onnx(model)
    out, rec = run_pass(SoftmaxFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.softmax"]
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def softmax_body(axis=1, sum_axes=(1,), with_max=True):
    def body(bb, x):
        t = x
        if with_max:
            t = bb.emit(relax.op.subtract(x, bb.emit(relax.op.max(x, axis=[axis], keepdims=True))))
        e = bb.emit(relax.op.exp(t))
        s = bb.emit(relax.op.sum(e, axis=list(sum_axes), keepdims=True))
        return relax.op.multiply(e, bb.emit(relax.op.divide(relax.const(1.0, "float32"), s)))
    return body


@pytest.mark.parametrize("with_max", [True, False])
def test_softmax_middle_axis(with_max):
    mod = build(softmax_body(with_max=with_max), (2, 5, 3))
    out, rec = run_pass(SoftmaxFusionPass, mod)
    assert rec.effect_times == 1 and ops(out) == ["nn.softmax"]
    assert int(out["main"].body.blocks[0].bindings[0].value.attrs.axis) == 1
    assert_same_after(mod, out)


def test_softmax_two_axes_refused():
    assert_refused(SoftmaxFusionPass, build(softmax_body(sum_axes=(1, 2), with_max=False), (2, 5, 3)), "one axis")


def test_softmax_switched_off():
    assert_switched_off(SoftmaxFusionPass, import_onnx(onnx_softmax(13)), 1)
