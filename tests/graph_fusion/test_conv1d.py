"""Conv1dAsConv2dFusionPass: conv1d and its per-channel epilogue as a height-1 conv2d, exactly."""

import math

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, build, onnx_model, ops, run_ort, run_pass
from tests.helpers import assert_close, assert_same_numbers, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import Conv1dAsConv2dFusionPass as P
from tvm_ascendfuse.graph_fusion import GeluFusionPass

RNG = np.random.default_rng(3)


def whisper_stem(stride=1, cin=8, cout=16, width=20):
    """Conv (1-D, bias, pads 1) -> erf GELU, as an ONNX export of Whisper's encoder stem has it."""
    inits = {"W": RNG.standard_normal((cout, cin, 3)).astype("float32") * 0.3,
             "B": RNG.standard_normal(cout).astype("float32"), "s2": np.array(math.sqrt(2), "float32"),
             "one": np.array(1.0, "float32"), "half": np.array(0.5, "float32")}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["h"], pads=[1, 1], strides=[stride], kernel_shape=[3]),
             helper.make_node("Div", ["h", "s2"], ["a"]), helper.make_node("Erf", ["a"], ["er"]),
             helper.make_node("Add", ["er", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["hm"]),
             helper.make_node("Mul", ["hm", "half"], ["y"])]
    wout = (width + 2 - 3) // stride + 1
    return onnx_model(nodes, {"x": (1, cin, width)}, {"y": (1, cout, wout)}, inits)


@pytest.mark.parametrize("stride", [1, 2])
def test_onnx_stem_becomes_conv2d_with_epilogue(stride):
    model = whisper_stem(stride)
    mod = GeluFusionPass()(import_onnx(model))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    names = ops(out)
    assert "nn.conv1d" not in names and names.count("nn.conv2d") == 1
    # the bias and the GELU sit on the 4-D conv output, the one reshape back to 3-D is last
    assert names[-3:] == ["add", "nn.gelu", "reshape"], names
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def test_stem_reaches_the_conv_rule():
    result = assert_same_numbers(import_onnx(whisper_stem(2)))
    rules = set(result.report.to_dict()["schedules"].values())
    assert "fallback" not in rules and "conv" in " ".join(rules), rules
    assert len(result.report.kernels) == 1                       # conv + bias + GELU + reshape: one kernel


def test_epilogue_stops_at_a_non_channel_constant():
    w = RNG.standard_normal((6, 4, 3)).astype("float32")
    pos = RNG.standard_normal((1, 6, 10)).astype("float32")    # varies along the width: not an epilogue

    def body(bb, x):
        c = bb.emit(relax.op.nn.conv1d(x, relax.const(w), padding=1))
        r = bb.emit(relax.op.nn.relu(c))
        return bb.emit(relax.op.add(r, relax.const(pos)))

    mod = build(body, (1, 4, 10))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["reshape", "nn.conv2d", "nn.relu", "reshape", "add"]
    assert_same_after(mod, out)


def test_grouped_dilated_weight_parameter():
    def body(bb, x, w):
        return bb.emit(relax.op.nn.conv1d(x, w, strides=2, padding=(2, 1), dilation=2, groups=2))

    mod = build(body, (2, 4, 15), (6, 2, 3))
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and "nn.conv1d" not in ops(out)
    assert_same_after(mod, out)


def test_switched_off():
    assert_switched_off(P, GeluFusionPass()(import_onnx(whisper_stem())), matches=1)
