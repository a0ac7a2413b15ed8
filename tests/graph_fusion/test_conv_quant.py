"""Conv2DQuantFusionPass: QDQ convs computed in int8, checked against onnxruntime in quantization steps."""

import numpy as np
import pytest

from tests.graph_fusion.common import ops, run_ort, run_pass
from tests.graph_fusion.quant_models import agreement, output_step, qdq_model
from tests.helpers import compile_ours, run_vm
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import Conv2DQuantFusionPass as P
from tvm_ascendfuse.graph_fusion.safe_fold import SafeFoldConstant


def _inputs(model, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
            for i in model.graph.input]


def _check(model, switches=None):
    """Compile with our pipeline, compare with ORT: cosine >= 0.999 and at most one output step apart."""
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), switches=switches)
    ours, ref = run_vm(result.executable, inputs), run_ort(model, inputs)
    cos, diff = agreement(ours, ref)
    step = output_step(model) or 1e-4 * float(np.abs(ref).max())
    assert cos >= 0.999 and diff <= step * 1.001, (cos, diff / step)
    return result


def _kept(model):
    """The module as the int8 passes see it (quantized weights still under their dequantize)."""
    return SafeFoldConstant(keep=("relax.dequantize",))(import_onnx(model))


CASES = [dict(), dict(act="uint8"), dict(per_channel=False), dict(bias=False, requant=False),
         dict(relu=True), dict(residual=True), dict(kernel=1, pad=0), dict(stride=2, size=9)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "base")
def test_int8_conv_matches_onnxruntime(case):
    model = qdq_model("conv", **case)
    out, rec = run_pass(P, _kept(model))
    assert (rec.match_times, rec.effect_times) == (1, 1)
    names = ops(out)
    assert "dequantize" not in names[names.index("nn.conv2d") - 1:names.index("nn.conv2d")]
    conv = [b.value for blk in out["main"].body.blocks for b in blk.bindings
            if getattr(b.value, "op", None) is not None and getattr(b.value.op, "name", "") == "relax.nn.conv2d"]
    assert [str(c.args[0].ty.dtype) for c in conv] == ["uint8"] and str(conv[0].ty.dtype) == "int32"
    result = _check(model)
    assert any("conv2d" in k["ops"] for k in result.report.kernels)


def test_switched_off_computes_the_dequantized_conv():
    model = qdq_model("conv", residual=True)
    out, rec = run_pass(P, _kept(model), enabled=False)
    assert rec.match_times == 1 and rec.effect_times == 0
    result = _check(model, switches={"GraphFusion": {"Conv2DQuantFusionPass": "off"}})
    assert result.report.get(P.switch_name).effect_times == 0


def test_depthwise_conv_is_left_to_its_own_pass():
    model = qdq_model("depthwise", cout=8)
    out, rec = run_pass(P, _kept(model))
    assert rec.match_times == 0 and rec.not_effective == []


def test_zero_point_zero_pads_inside_the_conv():
    """An activation whose uint8 zero point is 0 (int8 zero point -128, a ReLU output) keeps its padding in
    the conv (no separate pad, which the grouping would put into the producer); the border still agrees."""
    from onnx import numpy_helper
    model = qdq_model("conv", cin=16, cout=32, size=9)
    init = {i.name: i for i in model.graph.initializer}
    init["zx"].CopyFrom(numpy_helper.from_array(np.array(-128, "int8"), "zx"))
    out, rec = run_pass(P, _kept(model))
    assert rec.effect_times == 1 and "nn.pad" not in ops(out)
    conv = [b.value for blk in out["main"].body.blocks for b in blk.bindings
            if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d"]
    assert [int(p) for p in conv[0].attrs.padding] == [1, 1, 1, 1]
    _check(model)


@pytest.mark.parametrize("cin,cout", [(16, 24), (3, 32), (3, 24)])
def test_channels_padded_to_the_int8_steps(cin, cout):
    """Output channels up to a multiple of 16 (zero weights, the result sliced back), input channels up to a
    multiple of 4 (zero weights, the input padded in the same pad as its border)."""
    model = qdq_model("conv", cin=cin, cout=cout, size=7)
    out, rec = run_pass(P, _kept(model))
    conv = [b.value for blk in out["main"].body.blocks for b in blk.bindings
            if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d"][0]
    w_shape = [int(d) for d in conv.args[1].ty.shape]
    assert w_shape[:2] == [-(-cout // 16) * 16, -(-cin // 4) * 4]
    assert ("strided_slice" in ops(out)) == (cout % 16 != 0)
    _check(model)


def test_nonzero_weight_zero_point_is_refused():
    model = qdq_model("conv")
    from onnx import numpy_helper
    init = {i.name: i for i in model.graph.initializer}
    init["wz"].CopyFrom(numpy_helper.from_array(np.full(24, 3, "int8"), "wz"))
    out, rec = run_pass(P, _kept(model))
    assert rec.effect_times == 0 and "zero point" in rec.not_effective[0]["failed"]


def test_dequantize_with_other_parameters_than_its_quantize():
    """Q(x, s, z1) -> DQ(., s, z2): the uint8 form adds 128 to the int8 values instead of re-quantizing."""
    from onnx import numpy_helper
    model = qdq_model("conv", cin=16, cout=32, size=6)
    model.graph.initializer.append(numpy_helper.from_array(np.array(7, "int8"), "zx2"))
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "xq"][0]
    dq.input[2] = "zx2"
    out, rec = run_pass(P, _kept(model))
    assert rec.effect_times == 1 and "quantize" in ops(out) and ops(out).count("quantize") >= 1
    _check(model)
