"""PoolConvCommuteFusionPass: an average pool next to a 1x1 conv moves to the side where it costs less."""

import numpy as np
import pytest
from onnx import helper

from tests.graph_fusion.common import assert_refused, assert_same_after, assert_switched_off, onnx_model, ops, \
    run_ort, run_pass
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import PoolConvCommuteFusionPass as P

RNG = np.random.default_rng(5)


def transition_onnx(cin=16, cout=8, hw=8, bias=False, pool=2, stride=2, pads=0, count_include_pad=1,
                    act_between=False, second_user=False):
    """DenseNet's transition: ReLU -> 1x1 conv (+ bias) -> AveragePool."""
    inits = {"W": RNG.standard_normal((cout, cin, 1, 1)).astype("float32")}
    conv_in = ["r", "W"]
    if bias:
        inits["B"] = RNG.standard_normal(cout).astype("float32")
        conv_in.append("B")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", conv_in, ["c"])]
    pooled_from = "c"
    if act_between:
        nodes.append(helper.make_node("Relu", ["c"], ["c2"]))
        pooled_from = "c2"
    nodes.append(helper.make_node("AveragePool", [pooled_from], ["p"], kernel_shape=[pool, pool],
                                  strides=[stride, stride], pads=[pads] * 4, count_include_pad=count_include_pad))
    out_hw = (hw + 2 * pads - pool) // stride + 1
    outputs = {"p": (1, cout, out_hw, out_hw)}
    if second_user:
        outputs["c"] = (1, cout, hw, hw)
    return onnx_model(nodes, {"x": (1, cin, hw, hw)}, outputs, inits)


def pool_branch_onnx(cin=24, cout=6, hw=9, count_include_pad=1, pool=3, stride=1, pads=1, second_user=False):
    """Inception's pool branch: AveragePool 3x3 / 1 (padded) -> 1x1 conv + bias -> ReLU."""
    inits = {"W": RNG.standard_normal((cout, cin, 1, 1)).astype("float32"),
             "B": RNG.standard_normal(cout).astype("float32")}
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[pool, pool], strides=[stride, stride],
                              pads=[pads] * 4, count_include_pad=count_include_pad),
             helper.make_node("Conv", ["p", "W", "B"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    out_hw = (hw + 2 * pads - pool) // stride + 1
    outputs = {"y": (1, cout, out_hw, out_hw)}
    if second_user:
        outputs["p"] = (1, cin, out_hw, out_hw)
    return onnx_model(nodes, {"x": (1, cin, hw, hw)}, outputs, inits)


def _check(model, before_ops):
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1, rec.to_dict()
    order = [o for o in ops(out) if o in ("nn.conv2d", "nn.avg_pool2d")]
    assert order == before_ops[::-1], ops(out)
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))
    return out


def _calls(mod, op):
    return [b.var for block in mod["main"].body.blocks for b in block.bindings
            if getattr(getattr(b.value, "op", None), "name", None) == op]


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_transition_pools_first(bias):
    """The 1x1 conv runs on the pooled plane (a quarter of the pixels); a bias crosses an unpadded pool."""
    out = _check(transition_onnx(bias=bias), ["nn.conv2d", "nn.avg_pool2d"])
    assert [tuple(int(d) for d in c.ty.shape) for c in _calls(out, "relax.nn.conv2d")] == [(1, 8, 4, 4)]


@pytest.mark.parametrize("count_include_pad", [1, 0], ids=["pad_counted", "pad_not_counted"])
def test_pool_branch_convolves_first(count_include_pad):
    """The pool averages the conv's 6 channels instead of the 24 input channels; the bias stays behind it,
    exact whatever the divisor at the padded border."""
    _check(pool_branch_onnx(count_include_pad=count_include_pad), ["nn.avg_pool2d", "nn.conv2d"])


def test_bias_across_counted_padding_refused():
    """A padded pool whose divisor counts the padding averages a bias down at the border: it cannot cross."""
    assert_refused(P, import_onnx(transition_onnx(bias=True, pool=3, stride=2, pads=1)), "bias cannot cross")


def test_bias_across_uncounted_padding_moves():
    _check(transition_onnx(bias=True, pool=3, stride=2, pads=1, count_include_pad=0),
           ["nn.conv2d", "nn.avg_pool2d"])


def test_widening_conv_keeps_its_order():
    """A conv from 4 to 32 channels behind a stride-1 pool: convolving first would pool 8x the channels."""
    assert_refused(P, import_onnx(pool_branch_onnx(cin=4, cout=32)), "convolving first counts")


def test_relu_between_is_left_alone():
    mod = import_onnx(transition_onnx(act_between=True))
    out, rec = run_pass(P, mod)
    assert rec.match_times == 0, rec.to_dict()


@pytest.mark.parametrize("model", [lambda: transition_onnx(second_user=True),
                                   lambda: pool_branch_onnx(second_user=True)], ids=["conv_used", "pool_used"])
def test_shared_intermediate_refused(model):
    assert_refused(P, import_onnx(model()), "other consumers")


def test_switched_off():
    assert_switched_off(P, import_onnx(transition_onnx()), matches=1)
