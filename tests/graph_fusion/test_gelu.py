"""GeluFusionPass: erf and tanh GELU decompositions -> R.nn.gelu / R.nn.gelu_tanh."""

import math

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import (assert_refused, assert_same_after, assert_switched_off, build, onnx_model,
                                       ops, run_ort, run_pass)
from tests.helpers import assert_close, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import GeluFusionPass as P

N = helper.make_node


def onnx_gelu():
    """The common PyTorch export: Div(sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5."""
    nodes = [N("Div", ["x", "s2"], ["a"]), N("Erf", ["a"], ["e"]), N("Add", ["e", "one"], ["e1"]),
             N("Mul", ["x", "e1"], ["m"]), N("Mul", ["m", "half"], ["y"])]
    inits = {"s2": np.array(math.sqrt(2), "float32"), "one": np.array(1, "float32"), "half": np.array(.5, "float32")}
    return onnx_model(nodes, {"x": (4, 16)}, {"y": (4, 16)}, inits)


def test_onnx_gelu_erf():
    model = onnx_gelu()
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.gelu"]
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def c(v, dtype="float32"):
    return relax.const(v, dtype)


def erf_half_first(dtype="float32", half=0.5, extra=False):
    """0.5 * x first, erf argument as x * 0.70710678, 1 + erf with the constant first."""
    def body(bb, x):
        hx = bb.emit(relax.op.multiply(c(half, dtype), x))
        e = bb.emit(relax.op.erf(bb.emit(relax.op.multiply(x, c(0.70710678, dtype)))))
        y = relax.op.multiply(hx, bb.emit(relax.op.add(c(1.0, dtype), e)))
        return (y, e) if extra else y
    return body


def tanh_form(bb, x):
    cube = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, x)), x))
    inner = bb.emit(relax.op.add(x, bb.emit(relax.op.multiply(c(0.044715), cube))))
    t = bb.emit(relax.op.tanh(bb.emit(relax.op.multiply(inner, c(math.sqrt(2 / math.pi))))))
    return relax.op.multiply(bb.emit(relax.op.multiply(x, c(0.5))), bb.emit(relax.op.add(t, c(1.0))))


@pytest.mark.parametrize("body,dtype,expect", [
    (erf_half_first(), "float32", "nn.gelu"),
    (erf_half_first("float16"), "float16", "nn.gelu"),
    (tanh_form, "float32", "nn.gelu_tanh"),
], ids=["erf_reordered", "erf_fp16", "tanh"])
def test_gelu_forms(body, dtype, expect):
    mod = build(body, (4, 16), dtype=dtype)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == [expect]
    assert_same_after(mod, out)


def test_wrong_constant_left_alone():
    mod = build(erf_half_first(half=0.6), (4, 16))
    out, rec = run_pass(P, mod)
    assert rec.match_times == 0 and out.same_as(mod)


def test_erf_used_elsewhere_refused():
    assert_refused(P, build(erf_half_first(extra=True), (4, 16)), "consumers outside the pattern")


def test_gelu_switched_off():
    assert_switched_off(P, import_onnx(onnx_gelu()), 1)


def test_fp16_model_widened_to_float32():
    """A model stored in fp16 (constants rounded: 1/sqrt(2) is 0.70703 there) is computed in float32 by the
    precision phase; its constants are compared with fp16's tolerance, not float32's, so its GELU is found."""
    from tvm_ascendfuse.precision import Float32ComputePass, PrecisionPlan
    from tvm_ascendfuse.report import FusionReport

    mod = build(erf_half_first("float16"), (4, 16), dtype="float16")
    wide = Float32ComputePass(FusionReport(), PrecisionPlan())(mod)
    out, rec = run_pass(P, wide)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert "nn.gelu" in ops(out)
    assert_same_after(wide, out)


def test_float32_model_keeps_float32_tolerance():
    """The same constant rounded to fp16 in a float32 model is not GELU's (1.1e-4 off, float32's bound 1e-4)."""
    def body(bb, x):
        hx = bb.emit(relax.op.multiply(c(0.5), x))
        e = bb.emit(relax.op.erf(bb.emit(relax.op.multiply(x, c(float(np.float16(0.70710678)))))))
        return relax.op.multiply(hx, bb.emit(relax.op.add(c(1.0), e)))
    out, rec = run_pass(P, build(body, (4, 16)))
    assert rec.match_times == 0
