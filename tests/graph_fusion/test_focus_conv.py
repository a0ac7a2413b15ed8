"""FocusConvFusionPass: four parity slices + concat + conv == one stride-2 conv."""

import numpy as np
import pytest
from onnx import helper

from tests.graph_fusion.common import (assert_refused, assert_same_after, assert_switched_off, onnx_model, ops,
                                       run_ort, run_pass)
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import FocusConvFusionPass as P

RNG = np.random.default_rng(3)
YOLO_ORDER = [(0, 0), (1, 0), (0, 1), (1, 1)]     # x[::2, ::2], x[1::2, ::2], x[::2, 1::2], x[1::2, 1::2]


def focus_model(order=YOLO_ORDER, k=3, pads=(1, 1, 1, 1), steps=(2, 2), bias=False, size=8):
    """ONNX Focus: Slice(starts=(a, b), axes=(2, 3), steps) x4 -> Concat(axis=1) -> Conv(k x k, pads)."""
    inits = {"W": RNG.standard_normal((6, 12, k, k)).astype("float32"), "ax": np.array([2, 3]),
             "st": np.array(steps), "e": np.array([1 << 30, 1 << 30])}
    nodes = []
    for i, (a, b) in enumerate(order):
        inits[f"s{i}"] = np.array([a, b])
        nodes.append(helper.make_node("Slice", ["x", f"s{i}", "e", "ax", "st"], [f"p{i}"]))
    nodes.append(helper.make_node("Concat", [f"p{i}" for i in range(4)], ["cat"], axis=1))
    if bias:
        inits["B"] = RNG.standard_normal(6).astype("float32")
    nodes.append(helper.make_node("Conv", ["cat", "W"] + (["B"] if bias else []), ["y"], pads=list(pads)))
    half = size // 2
    oh, ow = half + pads[0] + pads[2] - k + 1, half + pads[1] + pads[3] - k + 1
    return onnx_model(nodes, {"x": (1, 3, size, size)}, {"y": (1, 6, oh, ow)}, inits)


@pytest.mark.parametrize("order,k,pads,bias", [
    (YOLO_ORDER, 3, (1, 1, 1, 1), False),
    (YOLO_ORDER, 1, (0, 0, 0, 0), True),                       # YOLOv5's Focus conv is 3x3 or 1x1
    ([(1, 1), (0, 1), (0, 0), (1, 0)], 3, (1, 0, 2, 1), False),   # shuffled phases, asymmetric padding
], ids=["3x3", "1x1_bias", "shuffled_asym"])
def test_focus_onnx(order, k, pads, bias):
    model = focus_model(order, k, pads, bias=bias)
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert "strided_slice" not in ops(out) and "concat" not in ops(out)
    conv = next(b.value for b in out["main"].body.blocks[0].bindings if ops_name(b.value) == "relax.nn.conv2d")
    assert [int(s) for s in conv.attrs.strides] == [2, 2]
    assert tuple(conv.args[1].value.shape) == (6, 3, 2 * k, 2 * k)
    assert [int(p) for p in conv.attrs.padding] == [2 * p for p in pads]
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def ops_name(value):
    return getattr(getattr(value, "op", None), "name", None)


def test_focus_switched_off():
    assert_switched_off(P, import_onnx(focus_model()), 1)


def test_not_parity_phases_refused():
    """Two slices with the same phase: not a space-to-depth, left alone."""
    mod = import_onnx(focus_model(order=[(0, 0), (0, 0), (1, 1), (1, 1)]))
    assert_refused(P, mod, "parity phases")


def test_stride_3_refused():
    assert_refused(P, _stride3_model(), "parity phases")


def test_focus_non_constant_weights_refused():
    model = focus_model()
    weight = next(t for t in model.graph.initializer if t.name == "W")
    model.graph.input.append(helper.make_tensor_value_info("W", weight.data_type, list(weight.dims)))
    model.graph.initializer.remove(weight)
    assert_refused(P, import_onnx(model), "weights not constant")


def _stride3_model():
    inits = {"W": RNG.standard_normal((6, 12, 1, 1)).astype("float32"), "ax": np.array([2, 3]),
             "st": np.array([3, 3]), "e": np.array([1 << 30, 1 << 30])}
    nodes = []
    for i, (a, b) in enumerate(YOLO_ORDER):
        inits[f"s{i}"] = np.array([a, b])
        nodes.append(helper.make_node("Slice", ["x", f"s{i}", "e", "ax", "st"], [f"p{i}"]))
    nodes += [helper.make_node("Concat", [f"p{i}" for i in range(4)], ["cat"], axis=1),
              helper.make_node("Conv", ["cat", "W"], ["y"])]
    return import_onnx(onnx_model(nodes, {"x": (1, 3, 12, 12)}, {"y": (1, 6, 4, 4)}, inits))


def test_focus_fp16_relax():
    """The same rewrite on hand-built fp16 Relax (slice order (1,1), (0,0), (1,0), (0,1))."""
    from tvm import relax

    from tests.graph_fusion.common import build

    def body(bb, x):
        sl = [bb.emit(relax.op.strided_slice(x, [2, 3], [a, b], [8, 8], [2, 2]))
              for a, b in [(1, 1), (0, 0), (1, 0), (0, 1)]]
        cat = bb.emit(relax.op.concat(sl, axis=1))
        w = relax.const(RNG.standard_normal((6, 12, 3, 3)).astype("float16"))
        return relax.op.nn.conv2d(cat, w, padding=1)
    mod = build(body, (1, 3, 8, 8), dtype="float16")
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1) and ops(out) == ["nn.conv2d"]
    assert_same_after(mod, out)
