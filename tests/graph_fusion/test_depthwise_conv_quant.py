"""DepthwiseConv2DQuantFusionPass: QDQ depthwise convs computed on the integers, checked against onnxruntime
in output quantization steps."""

import numpy as np
import pytest
from onnx import numpy_helper

from tests.graph_fusion.common import ops, run_pass
from tests.graph_fusion.quant_models import qdq_model
from tests.graph_fusion.test_conv_quant import _check, _kept
from tvm_ascendfuse.graph_fusion import DepthwiseConv2DQuantFusionPass as P

CASES = [dict(), dict(act="uint8"), dict(per_channel=False), dict(bias=False, requant=False),
         dict(relu=True, stride=2, size=15), dict(residual=True), dict(kernel=5, pad=2, size=11),
         dict(zero_point=-128)]


def _model(zero_point=None, **case):
    model = qdq_model("depthwise", **{"cout": 32, "size": 10, **case})
    if zero_point is not None:    # the input's zero point as a ReLU output has it (uint8 zero point 0)
        init = {i.name: i for i in model.graph.initializer}
        init["zx"].CopyFrom(numpy_helper.from_array(np.array(zero_point, "int8"), "zx"))
    return model


def _convs(mod):
    return [b.value for blk in mod["main"].body.blocks for b in blk.bindings
            if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "base")
def test_int8_depthwise_conv_matches_onnxruntime(case):
    model = _model(**case)
    out, rec = run_pass(P, _kept(model))
    assert (rec.match_times, rec.effect_times) == (1, 1)
    conv = _convs(out)
    assert [str(c.args[0].ty.dtype) for c in conv] == ["uint8"] and str(conv[0].ty.dtype) == "int32"
    assert int(conv[0].attrs.groups) == 32
    # a zero point of 0 pads inside the conv; any other is written out as the padding value
    assert ("nn.pad" in ops(out)) == (case.get("zero_point") is None and case.get("pad", 1) > 0)
    result = _check(model)
    assert [k["rule"] for k in result.report.kernels if "conv2d" in k["ops"]] == ["depthwise-conv2d"]


def test_switched_off_computes_the_dequantized_conv():
    model = _model(relu=True)
    out, rec = run_pass(P, _kept(model), enabled=False)
    assert rec.match_times == 1 and rec.effect_times == 0
    assert [str(c.args[0].ty.dtype) for c in _convs(out)] == ["float32"]
    result = _check(model, switches={"GraphFusion": {P.switch_name: "off"}})
    assert result.report.get(P.switch_name).effect_times == 0


def test_grouped_conv_with_several_channels_per_group_is_refused_with_its_reason():
    model = qdq_model("conv", cin=16, cout=16, size=8)
    conv = [n for n in model.graph.node if n.op_type == "Conv"][0]
    next(a for a in conv.attribute if a.name == "group").i = 8
    init = {i.name: i for i in model.graph.initializer}
    w = numpy_helper.to_array(init["wq"])[:, :2]
    init["wq"].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w), "wq"))
    out, rec = run_pass(P, _kept(model))
    assert rec.effect_times == 0 and "several channels per group" in rec.not_effective[0]["failed"]
    _check(model)


def test_nonzero_weight_zero_point_is_refused():
    model = _model()
    init = {i.name: i for i in model.graph.initializer}
    init["wz"].CopyFrom(numpy_helper.from_array(np.full(32, 3, "int8"), "wz"))
    out, rec = run_pass(P, _kept(model))
    assert rec.effect_times == 0 and "zero point" in rec.not_effective[0]["failed"]
