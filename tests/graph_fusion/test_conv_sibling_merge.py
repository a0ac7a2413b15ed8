"""ConvSiblingMergeFusionPass: convs of one input with the same window become one conv and channel slices."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, onnx_model, ops, run_ort, run_pass
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import ConvSiblingMergeFusionPass as P

RNG = np.random.default_rng(11)


def branches_onnx(cin=5, hw=6, widths=(3, 4, 2), kernels=(1, 1, 3), biases=(True, False, True), act="Relu",
                  combine=False):
    """Convs of ``x`` (Inception's branches), each + ReLU, joined by a concat (or, ``combine``, the first two
    added: siblings combined elementwise)."""
    inits, nodes, outs = {}, [], []
    for i, (c, k, b) in enumerate(zip(widths, kernels, biases)):
        inits[f"W{i}"] = RNG.standard_normal((c, cin, k, k)).astype("float32")
        ins = ["x", f"W{i}"]
        if b:
            inits[f"B{i}"] = RNG.standard_normal(c).astype("float32")
            ins.append(f"B{i}")
        nodes.append(helper.make_node("Conv", ins, [f"c{i}"], pads=[k // 2] * 4))
        nodes.append(helper.make_node(act, [f"c{i}"], [f"r{i}"]) if act else
                     helper.make_node("Identity", [f"c{i}"], [f"r{i}"]))
        outs.append(f"r{i}")
    if combine:
        nodes.append(helper.make_node("Add", outs[:2], ["s"]))
        outs = ["s"] + outs[2:]
        width = widths[0] + sum(widths[2:])
    else:
        width = sum(widths)
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    return onnx_model(nodes, {"x": (2, cin, hw, hw)}, {"y": (2, width, hw, hw)}, inits)


def dce(mod):
    return relax.transform.DeadCodeElimination()(mod)


@pytest.mark.parametrize("widths,kernels,biases,act,convs", [
    ((3, 4, 2), (1, 1, 3), (True, False, True), "Relu", 2),     # two 1x1 merge, the 3x3 stays
    ((3, 4, 5), (3, 3, 3), (True, True, True), "Sigmoid", 1),   # three 3x3 merge
    ((3, 4), (1, 1), (False, False), None, 1),                  # no bias, no activation
], ids=["1x1_pair", "3x3_triple", "bare"])
def test_siblings_merge(widths, kernels, biases, act, convs):
    model = branches_onnx(widths=widths, kernels=kernels, biases=biases, act=act)
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1, rec.to_dict()
    out = dce(out)
    assert ops(out).count("nn.conv2d") == convs
    assert ops(out).count("strided_slice") >= 2
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def test_different_kernel_sizes_refused():
    """SqueezeNet's expand 1x1 / 3x3 pair: padding the 1x1 to 3x3 would cost 9x its FLOPs."""
    mod = import_onnx(branches_onnx(widths=(3, 4), kernels=(1, 3), biases=(True, True)))
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 0
    assert "kernel sizes differ" in rec.not_effective[0]["failed"], rec.to_dict()
    assert ops(dce(out)).count("nn.conv2d") == 2


def test_combined_siblings_refused():
    """The first two siblings are added: better fused into one consumer as they are; the third has no
    partner left."""
    model = branches_onnx(widths=(3, 3, 2), kernels=(1, 1, 1), combine=True)
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 0
    assert "combined elementwise" in rec.not_effective[0]["failed"], rec.to_dict()
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def test_vector_bias_along_width_not_taken_as_channel_bias():
    """``conv + b`` with b of shape (C,) broadcasts along W (here W == C): not a per-channel bias."""
    c, hw = 4, 4
    x = relax.Var("x", relax.TensorType((1, 3, hw, hw), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = []
            for _ in range(2):
                w = relax.const(RNG.standard_normal((c, 3, 1, 1)).astype("float32"))
                conv = bb.emit(relax.op.nn.conv2d(x, w))
                parts.append(bb.emit(relax.op.add(conv, relax.const(RNG.standard_normal(c).astype("float32")))))
            out = bb.emit_output(relax.op.concat(parts, axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1
    assert_same_after(mod, out)


def test_switched_off():
    assert_switched_off(P, import_onnx(branches_onnx(widths=(3, 4), kernels=(1, 1), biases=(True, False))), 1)
