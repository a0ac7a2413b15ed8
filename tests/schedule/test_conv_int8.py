"""Int8Conv2dRule: QDQ convs (after Conv2DQuantFusionPass) on the int8 dot product, against onnxruntime in
output quantization steps; on a host without VNNI the generic conv rule takes them."""

import numpy as np
import pytest

from tests.graph_fusion.common import run_ort
from tests.graph_fusion.quant_models import agreement, output_step, qdq_model
from tests.graph_fusion.test_conv_quant import _inputs
from tests.helpers import compile_ours, run_vm
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.hostvec import has_int8_dot
from tvm_ascendfuse.target import get_target

CASES = [dict(cin=32, cout=32, size=12, relu=True), dict(cin=16, cout=48, size=7, residual=True),
         dict(cin=32, cout=32, size=14, stride=2), dict(cin=64, cout=32, size=8, kernel=1, pad=0),
         dict(cin=32, cout=64, size=16, kernel=1, pad=0, stride=2, act="uint8"),
         dict(cin=16, cout=16, size=6, bias=False, requant=False, per_channel=False)]


def _conv_rules(result):
    return [k["rule"] for k in result.report.kernels if "conv2d" in k["ops"]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_int8_conv_rule_matches_onnxruntime(case):
    _int8_rule_agrees_with_onnxruntime(case)


def _int8_rule_agrees_with_onnxruntime(case):
    """One QDQ conv: the int8 rule takes it (where the host has VNNI) and it agrees with onnxruntime within a
    quantization step of the output (or 1e-4 of its scale for a float output) and by cosine."""
    model = qdq_model("conv", **case)
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), portable=False)
    vnni = has_int8_dot(get_target("ascend910b").host_target())
    assert _conv_rules(result) == (["conv2d_int8"] if vnni else ["conv2d"])
    ours, ref = run_vm(result.executable, inputs), run_ort(model, inputs)
    cos, diff = agreement(ours, ref)
    step = output_step(model) or 1e-4 * float(np.abs(ref).max())
    assert cos >= 0.999 and diff <= step * 1.001, (cos, diff / step)


@pytest.mark.parametrize("case", [dict(cin=16, cout=24, size=6), dict(cin=96, cout=24, size=14, kernel=1, pad=0),
                                  dict(cin=3, cout=32, size=16, stride=2), dict(cin=3, cout=40, size=9, relu=True),
                                  dict(cin=32, cout=24, size=7, kernel=1, pad=0, residual=True),
                                  dict(cin=16, cout=72, size=6, kernel=1, pad=0)],   # 5 vectors, the last partial
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_channels_off_the_vector_width_are_padded_into_the_int8_rule(case):
    """24 output channels (MobileNetV2's projections) and an image's 3 input channels: the weight gets zero
    channels up to whole vectors / dot-product steps (Conv2DQuantFusionPass), the rule stores only the real
    channels, and the result agrees with onnxruntime."""
    _int8_rule_agrees_with_onnxruntime(case)


def test_no_vnni_no_int8_conv_rule():
    result = compile_ours(import_onnx(qdq_model("conv", cin=16, cout=32, size=6)), portable=True)
    assert _conv_rules(result) == ["conv2d"]


def test_epilogue_writing_the_next_convs_padding_runs_after_the_conv():
    """conv -> requant -> (pad of the next 3x3 conv) fused into one kernel: the padded border is no output
    tile's, so that epilogue runs over the whole result after the conv; the chain agrees with onnxruntime."""
    from onnx import helper, numpy_helper
    model = qdq_model("conv", cin=64, cout=64, size=56, kernel=1, pad=0, relu=True)   # a bottleneck's 1x1
    rng = np.random.default_rng(5)
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(rng.integers(-127, 128, (64, 64, 3, 3)).astype("int8"), "w2q"),
                          numpy_helper.from_array((rng.uniform(0.5, 1.5, 64) * 0.002).astype("float32"), "w2s"),
                          numpy_helper.from_array(np.zeros(64, "int8"), "w2z")])
    g.node.extend([helper.make_node("DequantizeLinear", ["w2q", "w2s", "w2z"], ["w2d"], axis=0),
                   helper.make_node("Conv", ["y", "w2d"], ["y2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])])
    g.output[0].name = "y2"
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), portable=False)
    ours, ref = run_vm(result.executable, inputs), run_ort(model, inputs)
    cos, _ = agreement(ours, ref)
    assert cos >= 0.999
    padded = [k for k in result.report.kernels if k["ops"][-1].startswith("pad")]
    vnni = has_int8_dot(get_target("ascend910b").host_target())
    assert padded and all(k["rule"] == ("conv2d_int8" if vnni else "conv2d") for k in padded)


def _conv_node(model, src, dst, cout, cin, seed, kernel=1):
    """Append DQ(W_q) -> Conv(src) -> Q -> DQ writing ``dst`` (a QDQ conv as ORT's quantizer leaves it)."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    g, w = model.graph, f"w{seed}"
    g.initializer.extend([
        numpy_helper.from_array(rng.integers(-127, 128, (cout, cin, kernel, kernel)).astype("int8"), w + "q"),
        numpy_helper.from_array((rng.uniform(0.5, 1.5, cout) * 0.01 / np.sqrt(cin)).astype("float32"), w + "s"),
        numpy_helper.from_array(np.zeros(cout, "int8"), w + "z"),
        numpy_helper.from_array(np.array(0.03, "float32"), w + "os"), numpy_helper.from_array(np.array(3, "int8"), w + "oz")])
    g.node.extend([helper.make_node("DequantizeLinear", [w + "q", w + "s", w + "z"], [w + "d"], axis=0),
                   helper.make_node("Conv", [src, w + "d"], [w + "y"], kernel_shape=[kernel, kernel],
                                    pads=[kernel // 2] * 4),
                   helper.make_node("QuantizeLinear", [w + "y", w + "os", w + "oz"], [w + "yq"]),
                   helper.make_node("DequantizeLinear", [w + "yq", w + "os", w + "oz"], [dst])])


@pytest.mark.parametrize("form", ["siblings", "residual"])
def test_sibling_convs_and_a_residual_chain(form):
    """Sibling int8 convs of one input (merged by the sibling merge, the parts sliced in the epilogue) and a
    conv whose requantized output feeds both the next conv (uint8) and a residual add (int8)."""
    from onnx import helper
    model = qdq_model("conv", cin=32, cout=32, size=14, kernel=1, pad=0)
    g = model.graph
    if form == "siblings":
        _conv_node(model, "y", "ca", 32, 32, 11)
        _conv_node(model, "y", "cb", 48, 32, 12)
        g.node.append(helper.make_node("Concat", ["ca", "cb"], ["out"], axis=1))
        shape = [1, 80, 14, 14]
    else:
        _conv_node(model, "y", "ca", 32, 32, 11)
        g.node.append(helper.make_node("Add", ["ca", "y"], ["out"]))
        shape = [1, 32, 14, 14]
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("out", 1, shape))
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), portable=False)
    vnni = has_int8_dot(get_target("ascend910b").host_target())
    assert set(_conv_rules(result)) == ({"conv2d_int8"} if vnni else {"conv2d"})
    assert not result.report.to_dict().get("rule_errors")
    cos, _ = agreement(run_vm(result.executable, inputs), run_ort(model, inputs))
    assert cos >= 0.999


def _vectorized_blocks(func):
    """Names of the blocks under a vectorized loop of ``func``."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx

    names = []

    def on_for(loop):
        if loop.kind == tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(loop.body, [(s_tir.SBlock, lambda b: names.append(b.name_hint))])

    tvm_ffi.structural_walk(func.body, [(tvm.tirx.For, on_for)])
    return names


@pytest.mark.parametrize("outputs", [1, 2])
def test_requantize_epilogue_runs_on_channel_vectors(outputs):
    """The epilogue (zero-point correction, scale, bias, ReLU, requantize) runs 16 channels to a vector per
    tile, not element by element (measured 0.59 -> 0.29 ms on a 16 -> 96 1x1 conv at 112x112, Zen 5); with
    one output it is stored through register transposes (a shuffle network); a kernel with two outputs keeps
    the int8 rule (its epilogue stored lane by lane)."""
    if not has_int8_dot(get_target("ascend910b").host_target()):
        pytest.skip("no int8 dot product on this host: the generic conv rule takes the conv")
    from onnx import helper
    model = qdq_model("conv", cin=16, cout=32, size=8, kernel=1, pad=0, relu=True)
    if outputs == 2:     # the requantized output read by a 1x1 conv (uint8) and a residual add (int8)
        _conv_node(model, "y", "ca", 32, 32, 11)
        model.graph.node.append(helper.make_node("Add", ["ca", "y"], ["out"]))
        model.graph.output[0].name = "out"
    result = compile_ours(import_onnx(model), portable=False)
    assert not result.report.to_dict().get("rule_errors")
    assert set(_conv_rules(result)) == {"conv2d_int8"}
    first = [k for k in result.report.kernels if k["rule"] == "conv2d_int8"][0]
    func = result.scheduled_module[first["name"]]
    blocks = _vectorized_blocks(func)
    assert [b for b in blocks if not b.startswith(("conv2d", "pad"))], blocks   # the epilogue's block
    if outputs == 1:
        assert "T.Shuffle" in func.script()
    ours, ref = run_vm(result.executable, _inputs(model)), run_ort(model, _inputs(model))
    assert agreement(ours, ref)[0] >= 0.999
