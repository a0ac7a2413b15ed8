"""BatchnormScaleFusionPass: a BN no conv absorbed becomes x * scale + shift (per-channel constants)."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import (assert_refused, assert_same_after, assert_switched_off, onnx_model, ops,
                                       run_ort, run_pass)
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import BatchnormScaleFusionPass as P

RNG = np.random.default_rng(5)


def bn_params(c, dtype="float32"):
    return {"g": (RNG.random(c) + 0.5).astype(dtype), "b": RNG.standard_normal(c).astype(dtype),
            "m": RNG.standard_normal(c).astype(dtype), "v": (RNG.random(c) + 0.5).astype(dtype)}


def preact_onnx(c=6, hw=5):
    """DenseNet's pre-activation: BN -> ReLU -> 1x1 conv (the BN cannot be folded into the conv)."""
    inits = {"W": RNG.standard_normal((4, c, 1, 1)).astype("float32"), **bn_params(c)}
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "W"], ["y"])]
    return onnx_model(nodes, {"x": (2, c, hw, hw)}, {"y": (2, 4, hw, hw)}, inits)


def bn_module(shape=(1, 5, 4, 3), axis=1, dtype="float32", param_mean=False, center=True, scale=True,
              training=False):
    c = shape[axis]
    p = bn_params(c, dtype)
    x = relax.Var("x", relax.TensorType(shape, dtype))
    m = relax.Var("m", relax.TensorType((c,), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, m] if param_mean else [x]):
        with bb.dataflow():
            consts = {k: relax.const(v) for k, v in p.items()}
            bn = bb.emit(relax.op.nn.batch_norm(x, consts["g"], consts["b"], m if param_mean else consts["m"],
                                                consts["v"], axis=axis, epsilon=1e-5, center=center,
                                                scale=scale, training=training))
            y = bb.emit(relax.TupleGetItem(bn, 0))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def test_preactivation_onnx():
    model = preact_onnx()
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert "nn.batch_norm" not in ops(out)
    assert ops(out)[:2] == ["multiply", "add"]
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


@pytest.mark.parametrize("shape,axis,dtype,center,scale", [
    ((1, 5, 4, 3), 1, "float32", True, True),
    ((2, 7, 3, 3), 1, "float16", True, True),
    ((3, 4, 6), -1, "float32", True, True),          # channels last (a BN over the last axis)
    ((1, 5, 4, 3), 1, "float32", False, False),      # no gamma / beta
], ids=["nchw", "fp16", "last_axis", "no_affine"])
def test_bn_becomes_affine(shape, axis, dtype, center, scale):
    mod = bn_module(shape, axis, dtype, center=center, scale=scale)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and "nn.batch_norm" not in ops(out)
    mul = next(b.value for b in out["main"].body.blocks[0].bindings if ops_of(b.value) == "relax.multiply")
    want = [1] * len(shape)
    want[axis] = shape[axis]
    assert list(mul.args[1].value.shape) == want
    assert_same_after(mod, out)


def ops_of(value):
    return getattr(getattr(value, "op", None), "name", None)


def test_non_constant_mean_refused():
    assert_refused(P, bn_module(param_mean=True), "not constant")


def test_switched_off():
    assert_switched_off(P, bn_module(), 1)


def test_training_bn_left_alone():
    """Training mode normalises by the batch's statistics: not a constant affine map."""
    out, rec = run_pass(P, bn_module(training=True))
    assert rec.match_times == 0 and "nn.batch_norm" in ops(out)
