"""LayerNormFusionPass: decomposed LayerNorm (ONNX opset < 17) -> R.nn.layer_norm."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from tests.graph_fusion.common import (assert_refused, assert_same_after, assert_switched_off, build, onnx_model,
                                       ops, run_ort, run_pass)
from tests.helpers import assert_close, run_reference, tol
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import LayerNormFusionPass as P

RNG = np.random.default_rng(4)
N = helper.make_node


def onnx_ln(opset, shape=(2, 3, 8), axes=(-1,)):
    norm = tuple(shape[a] for a in axes)
    inits = {"eps": np.array(1e-5, "float32"), "g": RNG.random(norm, "float32") + 0.5,
             "b": RNG.standard_normal(norm).astype("float32")}
    if opset >= 18:                          # ReduceMean takes axes as an input; variance as d * d
        inits["ax"] = np.array(axes)
        means = [N("ReduceMean", ["x", "ax"], ["mu"]), N("ReduceMean", ["d2", "ax"], ["var"])]
        square = N("Mul", ["d", "d"], ["d2"])
    else:
        inits["two"] = np.array(2.0, "float32")
        means = [N("ReduceMean", ["x"], ["mu"], axes=list(axes)), N("ReduceMean", ["d2"], ["var"], axes=list(axes))]
        square = N("Pow", ["d", "two"], ["d2"])
    nodes = [means[0], N("Sub", ["x", "mu"], ["d"]), square, means[1], N("Add", ["var", "eps"], ["ve"]),
             N("Sqrt", ["ve"], ["sd"]), N("Div", ["d", "sd"], ["n"]), N("Mul", ["n", "g"], ["ng"]),
             N("Add", ["ng", "b"], ["y"])]
    return onnx_model(nodes, {"x": shape}, {"y": shape}, inits, opset=opset)


@pytest.mark.parametrize("opset,axes", [(13, (-1,)), (18, (-1,)), (13, (-2, -1))], ids=["op13", "op18", "2axes"])
def test_onnx_layer_norm(opset, axes):
    model = onnx_ln(opset, axes=axes)
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.layer_norm"]
    got, inputs = assert_same_after(mod, out)
    assert_close(got, run_ort(model, inputs), **tol("float32"))


def ln_body(dtype="float32", axis=-1, gamma=True, rsqrt=False, extra=False):
    def body(bb, x):
        mu = bb.emit(relax.op.mean(x, axis=[axis], keepdims=True))
        d = bb.emit(relax.op.subtract(x, mu))
        v = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(d, d)), axis=[axis], keepdims=True))
        ve = bb.emit(relax.op.add(relax.const(1e-5, dtype), v))
        if rsqrt:
            n = bb.emit(relax.op.multiply(bb.emit(relax.op.rsqrt(ve)), d))
        else:
            n = bb.emit(relax.op.divide(d, bb.emit(relax.op.sqrt(ve))))
        if not gamma:
            return n
        g = relax.const((RNG.random(8) + 0.5).astype(dtype))
        y = relax.op.add(bb.emit(relax.op.multiply(g, n)), relax.const(RNG.standard_normal(8).astype(dtype)))
        return (y, mu) if extra else y
    return body


@pytest.mark.parametrize("dtype,gamma,rsqrt", [("float32", False, True), ("float16", True, False)],
                         ids=["no_affine_rsqrt", "fp16"])
def test_layer_norm_variants(dtype, gamma, rsqrt):
    mod = build(ln_body(dtype, gamma=gamma, rsqrt=rsqrt), (4, 8), dtype=dtype)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and ops(out) == ["nn.layer_norm"]
    assert_same_after(mod, out)


def test_layer_norm_switched_off():
    assert_switched_off(P, import_onnx(onnx_ln(13)), 1)


def test_non_trailing_axis_refused():
    assert_refused(P, build(ln_body(axis=0), (4, 8)), "trailing axes")


def test_mean_used_elsewhere_refused():
    assert_refused(P, build(ln_body(extra=True), (4, 8)), "consumers outside the pattern")


def test_dynamic_batch_layer_norm():
    model = onnx_ln(13)
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    mod = import_onnx(model)
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and ops(out) == ["nn.layer_norm"]
    x = RNG.standard_normal((5, 3, 8)).astype("float32")
    assert_close(run_reference(out, [x]), run_ort(model, [x]), **tol("float32"))


def test_gamma_varying_on_batch_axis():
    """The affine part does not fit (per row, not per feature): that match is refused, and the plain
    LayerNorm inside it is still recognised, leaving the multiply after it."""
    def body(bb, x):
        n = ln_body(gamma=False)(bb, x)
        return relax.op.multiply(n, relax.const(RNG.random((4, 1), "float32")))
    mod = build(body, (4, 8))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (2, 1)
    assert "normalised shape" in rec.not_effective[0]["failed"]
    assert ops(out) == ["nn.layer_norm", "multiply"]
    assert_same_after(mod, out)
