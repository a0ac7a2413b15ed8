"""RMSNormFusionPass: x * rsqrt(mean(x^2) + eps) * g (and the x / sqrt form) -> R.nn.rms_norm."""

import numpy as np
import pytest
from tvm import relax

from tests.graph_fusion.common import assert_refused, assert_same_after, assert_switched_off, build, ops, run_pass
from tvm_ascendfuse.graph_fusion import RMSNormFusionPass as P

RNG = np.random.default_rng(5)


def rms_body(form="rsqrt", axis=-1, dtype="float32"):
    def body(bb, x):
        ms = bb.emit(relax.op.mean(bb.emit(relax.op.power(x, relax.const(2.0, dtype))), axis=[axis], keepdims=True))
        ve = bb.emit(relax.op.add(ms, relax.const(1e-6, dtype)))
        if form == "rsqrt":
            n = bb.emit(relax.op.multiply(x, bb.emit(relax.op.rsqrt(ve))))
        elif form == "div":
            n = bb.emit(relax.op.divide(x, bb.emit(relax.op.sqrt(ve))))
        else:   # ONNX Reciprocal imports as 1 / sqrt
            n = bb.emit(relax.op.multiply(x, bb.emit(relax.op.divide(relax.const(1.0, dtype),
                                                                      bb.emit(relax.op.sqrt(ve))))))
        return relax.op.multiply(relax.const((RNG.random(8) + 0.5).astype(dtype)), n)
    return body


@pytest.mark.parametrize("form,dtype", [("rsqrt", "float32"), ("div", "float32"), ("recip", "float32"),
                                        ("rsqrt", "float16")])
def test_rms_norm_forms(form, dtype):
    mod = build(rms_body(form, dtype=dtype), (3, 8), dtype=dtype)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["nn.rms_norm"]
    assert_same_after(mod, out)


def test_rms_norm_switched_off():
    assert_switched_off(P, build(rms_body(), (3, 8)), 1)


def test_non_trailing_axis_refused():
    assert_refused(P, build(rms_body(axis=0), (8, 8)), "not trailing")


def test_rms_norm_without_gamma():
    def body(bb, x):
        ms = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(x, x)), axis=[-1], keepdims=True))
        return relax.op.divide(x, bb.emit(relax.op.sqrt(bb.emit(relax.op.add(relax.const(1e-6), ms)))))
    mod = build(body, (3, 8))
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and ops(out) == ["nn.rms_norm"]
    assert_same_after(mod, out)
