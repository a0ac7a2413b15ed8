"""ConvBatchnormFusionPass: BN folded into conv/matmul weights and bias, exactly."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import (assert_refused, assert_same_after, assert_switched_off, onnx_model, ops,
                                       run_ort, run_pass)
from tests.helpers import assert_close, run_reference, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import ConvBatchnormFusionPass as P

RNG = np.random.default_rng(1)


def bn_params(c):
    return {"g": RNG.random(c, "float32") + 0.5, "b": RNG.standard_normal(c).astype("float32"),
            "m": RNG.standard_normal(c).astype("float32"), "v": RNG.random(c, "float32") + 0.5}


def onnx_conv_bn(bias: bool, group: int = 1):
    cin, cout = 4, 8 if group == 1 else 4
    inits = {"W": RNG.standard_normal((cout, cin // group, 3, 3)).astype("float32"), **bn_params(cout)}
    if bias:
        inits["B"] = RNG.standard_normal(cout).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], epsilon=1e-3)]
    return onnx_model(nodes, {"x": (1, cin, 6, 6)}, {"y": (1, cout, 6, 6)}, inits)


@pytest.mark.parametrize("bias,group", [(True, 1), (False, 1), (True, 4)], ids=["bias", "nobias", "depthwise"])
def test_onnx_conv_bn_folds(bias, group):
    model = onnx_conv_bn(bias, group)
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.conv2d", "add"]                       # no batch_norm left, one bias add
    bias_const = out["main"].body.blocks[0].bindings[1].value.args[1]
    assert tuple(bias_const.value.shape) == (1, 8 if group == 1 else 4, 1, 1)
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def conv_bn_module(dtype="float32", groups=1, weight_param=False, extra_output=False, training=False):
    c = 4
    wv = RNG.standard_normal((c, c // groups, 3, 3)).astype(dtype)
    x = relax.Var("x", relax.TensorType((1, c, 6, 6), dtype))
    w = relax.Var("w", relax.TensorType(wv.shape, dtype)) if weight_param else relax.const(wv)
    p = {k: relax.const(v.astype(dtype)) for k, v in bn_params(c).items()}
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w] if weight_param else [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=groups))
            bn = bb.emit(relax.op.nn.batch_norm(conv, p["g"], p["b"], p["m"], p["v"], axis=1, training=training))
            y = bb.emit(relax.TupleGetItem(bn, 0))
            out = bb.emit_output(relax.Tuple([y, conv]) if extra_output else y)
        bb.emit_func_output(out)
    return bb.get()


def test_fp16_conv_bn():
    mod = conv_bn_module("float16")
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and "nn.batch_norm" not in ops(out)
    assert_same_after(mod, out)


def test_switched_off_leaves_module():
    assert_switched_off(P, conv_bn_module(), 1)


def test_refuses_non_constant_weights():
    assert_refused(P, conv_bn_module(weight_param=True), "weights not constant")


def test_refuses_conv_output_used_elsewhere():
    assert_refused(P, conv_bn_module(extra_output=True), "consumers outside the pattern")


def test_training_bn_is_not_a_match():
    mod = conv_bn_module(training=True)
    out, rec = run_pass(P, mod)
    assert rec.match_times == 0 and out.same_as(mod)


def test_matmul_bn_folds():
    x = relax.Var("x", relax.TensorType((3, 5), "float32"))
    p = {k: relax.const(v) for k, v in bn_params(6).items()}
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mm = bb.emit(relax.op.matmul(x, relax.const(RNG.standard_normal((5, 6)).astype("float32"))))
            biased = bb.emit(relax.op.add(mm, relax.const(RNG.standard_normal(6).astype("float32"))))
            bn = bb.emit(relax.op.nn.batch_norm(biased, p["g"], p["b"], p["m"], p["v"], axis=1, training=False))
            y = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(y)
    mod = bb.get()
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["matmul", "add"]
    assert_same_after(mod, out)


def test_dynamic_batch_folds():
    """A symbolic batch axis does not stop the fold (only the channel count matters)."""
    model = onnx_conv_bn(True)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and "nn.batch_norm" not in ops(out)
    x = RNG.standard_normal((2, 4, 6, 6)).astype("float32")
    assert_close(run_reference(out, [x]), run_ort(model, [x]), **tol("float32"))
