"""ClampCallsAsOpsPass: an fp16 ONNX model with Clip (ReLU6) computes in float32, like one without.

TVM's importer emits Clip as call_tir of topi's maximum/minimum in the model's dtype; before this pass the
widening refused the whole function, so every conv of an fp16 MobileNet accumulated in fp16."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te, topi

from tests.helpers import compile_ours, run_vm
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.precision import ClampCallsAsOpsPass
from tvm_ascendfuse.precision.clamp_calls import clamp_of
from tvm_ascendfuse.report import FusionReport

IC, OC, HW = 64, 32, 12


def _conv_clip_model(opset: int, dtype=np.float16):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((OC, IC, 3, 3)) * 0.3).astype(dtype)
    b = rng.standard_normal(OC).astype(dtype)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if opset >= 11:
        inits += [numpy_helper.from_array(np.array(0, dtype), "lo"), numpy_helper.from_array(np.array(6, dtype), "hi")]
        clip = helper.make_node("Clip", ["y", "lo", "hi"], ["z"])
    else:
        clip = helper.make_node("Clip", ["y"], ["z"], min=0.0, max=6.0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]), clip], "conv_clip",
        [helper.make_tensor_value_info("x", elem, [1, IC, HW, HW])],
        [helper.make_tensor_value_info("z", elem, [1, OC, HW, HW])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, w, b


def _float32_reference(x, w, b):
    """The conv of the fp16 values computed in float32 (numpy), clipped, rounded once to fp16."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, OC, HW, HW))
    for kh in range(3):
        for kw in range(3):
            out += np.einsum("oc,nchw->nohw", w[:, :, kh, kw].astype(np.float64), xp[:, :, kh:kh + HW, kw:kw + HW])
    out += b.astype(np.float64)[None, :, None, None]
    return np.clip(out, 0, 6).astype(np.float16)


@pytest.mark.parametrize("opset", [13, 6])
def test_fp16_clip_model_computes_in_float32(opset):
    """Opset 6's attribute form on fp16 is typed float32 by the importer (topi widens x to the bound's
    type): it crashed TVM's FuseTIR before; its output is then float32."""
    model, w, b = _conv_clip_model(opset)
    mod = import_onnx(model)
    result = compile_ours(mod)
    other = result.report.to_dict()["other"]
    assert other["ClampCallsAsOps"]["effect_times"] == 1, other
    assert other["Float32Compute"]["effect_times"] == 1, other
    x = np.random.default_rng(1).uniform(0, 1, (1, IC, HW, HW)).astype(np.float16)
    got = run_vm(result.executable, [x])[0].astype(np.float32)
    want = _float32_reference(x, w, b).astype(np.float32)
    # float32 accumulation: one fp16 rounding from the reference (fp16 accumulation of 576 products was
    # several steps off)
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(got - want) <= ulp), np.max(np.abs(got - want) / np.maximum(ulp, 1e-6))


def test_float32_model_keeps_the_call():
    model, _, _ = _conv_clip_model(13, np.float32)
    mod = import_onnx(model)
    report = FusionReport()
    out = ClampCallsAsOpsPass(report)(mod)
    assert out.same_as(mod)
    assert report.get("ClampCallsAsOps").match_times == 0


def _prim(fn, *shapes):
    args = [te.placeholder(s, "float16", name=f"a{i}") for i, s in enumerate(shapes)]
    return te.create_prim_func([*args, fn(*args)])


def test_only_an_elementwise_max_or_min_is_a_clamp():
    assert clamp_of(_prim(topi.maximum, (4, 8), ())) == ("maximum", [0, 1])
    assert clamp_of(_prim(lambda a: topi.minimum(a, tvm.tirx.const(6.0, "float16")), (4, 8))) == ("minimum", [0, 6.0])
    # opset 6's attribute bounds on fp16: topi widens x to float32 (the importer types the call float32)
    assert clamp_of(_prim(lambda a: topi.minimum(a, 6.0), (4, 8))) == ("minimum", [0, 6.0])
    assert clamp_of(_prim(topi.add, (4, 8), ())) is None
    assert clamp_of(_prim(lambda a, c: topi.maximum(topi.add(a, c), c), (4, 8), ())) is None
