"""conv2d epilogue patterns (TbeConvElemwiseFusionPass)."""

import pytest
from tvm import relax

from tests.helpers import assert_same_numbers
from tests.patterns.util import assert_fused, build, const, refusals

X = ("x", (1, 4, 6, 6), "float32")
W = ("w", (8, 4, 3, 3), "float32")


def conv(bb, x, w):
    return bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))


def bias(bb, y, dtype="float32"):
    return bb.emit(relax.op.add(y, const((1, 8, 1, 1), dtype)))


ACTIVATIONS = {
    "relu": lambda bb, y: relax.op.nn.relu(y),
    "relu6_clip": lambda bb, y: relax.op.clip(y, 0, 6),
    "relu6_minmax": lambda bb, y: relax.op.minimum(bb.emit(relax.op.maximum(y, relax.const(0.0))),
                                                   relax.const(6.0)),
    "silu": lambda bb, y: relax.op.nn.silu(y),
    "silu_mul": lambda bb, y: relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))),
    "sigmoid": lambda bb, y: relax.op.sigmoid(y),
    "gelu": lambda bb, y: relax.op.nn.gelu(y),
    "leaky_relu": lambda bb, y: relax.op.nn.leakyrelu(y, 0.1),
    "hardswish": lambda bb, y: relax.op.multiply(y, bb.emit(relax.op.divide(
        bb.emit(relax.op.clip(bb.emit(relax.op.add(y, relax.const(3.0))), 0, 6)), relax.const(6.0)))),
}


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_conv_bias_activation(act):
    mod = build([X, W], lambda bb, x, w: ACTIVATIONS[act](bb, bias(bb, conv(bb, x, w))))
    assert_fused(mod, "ascendfuse.conv2d.bias_act")


def test_conv_bias():
    assert_fused(build([X, W], lambda bb, x, w: bias(bb, conv(bb, x, w))), "ascendfuse.conv2d.bias")


def test_conv_act():
    assert_fused(build([X, W], lambda bb, x, w: relax.op.nn.relu(conv(bb, x, w))), "ascendfuse.conv2d.act")


R = ("r", (1, 8, 6, 6), "float32")


def test_conv_residual_without_activation():
    mod = build([X, W, R], lambda bb, x, w, r: relax.op.add(conv(bb, x, w), r))
    assert_fused(mod, "ascendfuse.conv2d.bias")


def test_conv_bias_residual():
    mod = build([X, W, R], lambda bb, x, w, r: relax.op.add(bias(bb, conv(bb, x, w)), r))
    assert_fused(mod, "ascendfuse.conv2d.bias_residual")


def test_resnet_tail_is_not_cut():
    """conv + bias + add(residual) + relu is one group, not conv+bias+add leaving relu alone."""
    mod = build([X, W, R], lambda bb, x, w, r: relax.op.nn.relu(bb.emit(relax.op.add(bias(bb, conv(bb, x, w)), r))))
    assert_fused(mod, "ascendfuse.conv2d.bias_residual_act")


def test_conv_bias_relu_then_residual_is_not_cut():
    mod = build([X, W, R], lambda bb, x, w, r: relax.op.add(
        bb.emit(relax.op.nn.relu(bias(bb, conv(bb, x, w)))), r))
    assert_fused(mod, "ascendfuse.conv2d.bias_act_residual")


C = [("g", (8,), "float32"), ("be", (8,), "float32"), ("mu", (8,), "float32"), ("var", (8,), "float32")]


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_batchnorm_relu_unfolded(with_bias):
    """BN parameters are function inputs (not constants): the un-rewritten form still fuses."""
    def body(bb, x, w, g, be, mu, var):
        var = bb.emit(relax.op.abs(var))
        c = bias(bb, conv(bb, x, w)) if with_bias else conv(bb, x, w)
        bn = bb.emit(relax.op.nn.batch_norm(c, g, be, mu, var, axis=1, epsilon=1e-5, training=False))
        return relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0)))
    mod = build([X, W, *C], body)
    result = assert_same_numbers(mod)
    kernels = {k["pattern"]: k for k in result.report.kernels}
    assert "ascendfuse.conv2d.bias_act" in kernels, result.report.kernels
    assert "relax.nn.batch_norm" in kernels["ascendfuse.conv2d.bias_act"]["ops"] or \
        "batch_norm" in kernels["ascendfuse.conv2d.bias_act"]["ops"]


def test_conv_fp16():
    mod = build([("x", (1, 4, 6, 6), "float16"), ("w", (8, 4, 3, 3), "float16")],
                lambda bb, x, w: relax.op.nn.relu(bias(bb, conv(bb, x, w), "float16")))
    assert_fused(mod, "ascendfuse.conv2d.bias_act")


def test_switched_off_keeps_numbers():
    mod = build([X, W], lambda bb, x, w: relax.op.nn.relu(bias(bb, conv(bb, x, w))))
    result = assert_same_numbers(mod, switches={"TbeConvElemwiseFusionPass": "off"})
    rec = result.report.get("TbeConvElemwiseFusionPass")
    assert rec.effect_times == 0
    assert rec.not_effective and all(r["reason"] == "switched_off" for r in rec.not_effective)
    assert not any((k["pattern"] or "").startswith("ascendfuse.conv2d") for k in result.report.kernels)


def test_intermediate_used_outside_is_refused():
    def body(bb, x, w):
        c = conv(bb, x, w)
        y = bb.emit(relax.op.nn.relu(bias(bb, c)))
        return relax.op.add(y, bb.emit(relax.op.sigmoid(c)))   # c has a second user
    result = assert_same_numbers(build([X, W], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeConvElemwiseFusionPass")]
    assert any("used outside the group" in r for r in reasons), reasons
    assert not any(k["pattern"] == "ascendfuse.conv2d.bias_act" for k in result.report.kernels)


def test_int_dtype_is_refused():
    mod = build([("x", (1, 4, 6, 6), "int32"), ("w", (8, 4, 3, 3), "int32")],
                lambda bb, x, w: relax.op.nn.relu(conv(bb, x, w)))
    result = assert_same_numbers(mod)
    reasons = [r.get("failed", "") for r in refusals(result, "TbeConvElemwiseFusionPass")]
    assert any("int32" in r for r in reasons), reasons


def test_nhwc_is_refused():
    mod = build([("x", (1, 6, 6, 4), "float32"), ("w", (8, 4, 3, 3), "float32")],
                lambda bb, x, w: relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1],
                                                                           data_layout="NHWC"))))
    result = assert_same_numbers(mod)
    reasons = [r.get("failed", "") for r in refusals(result, "TbeConvElemwiseFusionPass")]
    assert any("NHWC" in r for r in reasons), reasons


def onnx_conv(act_nodes, inits=()):
    """Conv(+bias) followed by ``act_nodes`` (input 'c', output 'y'), imported by our ONNX frontend."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from tvm_ascendfuse.frontend import import_onnx

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype("float32"), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype("float32"), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1])] + act_nodes
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [w, b, *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return import_onnx(model)


def test_onnx_clip_relu6_is_one_kernel():
    """ONNX Clip(0, 6) imports as call_tir(minimum, (call_tir(maximum, (x, 0)), 6))."""
    import numpy as np
    from onnx import helper, numpy_helper
    lo, hi = (numpy_helper.from_array(np.array(v, "float32"), n) for n, v in (("lo", 0), ("hi", 6)))
    mod = onnx_conv([helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], [lo, hi])
    assert_fused(mod, "ascendfuse.conv2d.bias_act")


@pytest.mark.parametrize("op", ["HardSwish", "HardSigmoid", "LeakyRelu"])
def test_onnx_activation_forms_are_one_kernel(op):
    from onnx import helper
    assert_fused(onnx_conv([helper.make_node(op, ["c"], ["y"])]), "ascendfuse.conv2d.bias_act")


def test_other_te_call_is_not_taken_for_a_clamp():
    """A call_tir(PrimFunc, (x, const)) that is not maximum/minimum must not pass as relu6."""
    from tvm import topi

    def body(bb, x, w):
        y = bias(bb, conv(bb, x, w))
        return bb.emit_te(topi.subtract, bb.emit_te(topi.multiply, y, relax.const(2.0)), relax.const(1.0))
    result = assert_same_numbers(build([X, W], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeConvElemwiseFusionPass")]
    assert any("not an elementwise maximum/minimum" in r for r in reasons), reasons


def test_training_batchnorm_is_refused():
    def body(bb, x, w, g, be, mu, var):
        bn = bb.emit(relax.op.nn.batch_norm(conv(bb, x, w), g, be, mu, bb.emit(relax.op.abs(var)), axis=1,
                                            training=True))
        return relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0)))
    result = assert_same_numbers(build([X, W, *C], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeConvElemwiseFusionPass")]
    assert any("training=True" in r for r in reasons), reasons
