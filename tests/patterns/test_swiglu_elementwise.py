"""SwiGLU (TbeSwiGluFusionPass) and elementwise chains (TbeEltwiseFusionPass)."""

from tvm import relax

from tests.helpers import assert_same_numbers
from tests.patterns.util import assert_fused, build, const, refusals

X = ("x", (8, 16), "float32")


def swiglu_mlp(bb, x, silu_form="op", dtype="float32"):
    g = bb.emit(relax.op.matmul(x, const((16, 32), dtype, 2)))
    u = bb.emit(relax.op.matmul(x, const((16, 32), dtype, 3)))
    if silu_form == "op":
        s = bb.emit(relax.op.nn.silu(g))
    else:
        s = bb.emit(relax.op.multiply(g, bb.emit(relax.op.sigmoid(g))))
    return relax.op.multiply(s, u)


def test_swiglu_with_both_matmuls():
    assert_fused(build([X], lambda bb, x: swiglu_mlp(bb, x)), "ascendfuse.swiglu.matmul")


def test_swiglu_with_both_matmuls_sigmoid_form_fp16():
    assert_fused(build([("x", (2, 8, 16), "float16")], lambda bb, x: swiglu_mlp(bb, x, "mul", "float16")),
                 "ascendfuse.swiglu.matmul")


def test_swiglu_elementwise():
    mod = build([("g", (8, 32), "float32"), ("u", (8, 32), "float32")],
                lambda bb, g, u: relax.op.multiply(bb.emit(relax.op.nn.silu(g)), u))
    assert_fused(mod, "ascendfuse.swiglu.elementwise")


def test_swiglu_gate_used_outside_falls_back_to_elementwise_part():
    def body(bb, x):
        g = bb.emit(relax.op.matmul(x, const((16, 32), seed=2)))
        u = bb.emit(relax.op.matmul(x, const((16, 32), seed=3)))
        h = bb.emit(relax.op.multiply(bb.emit(relax.op.nn.silu(g)), u))
        return relax.op.add(h, g)
    result = assert_same_numbers(build([X], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeSwiGluFusionPass")]
    assert any("used outside the group" in r for r in reasons), reasons
    pats = [k["pattern"] for k in result.report.kernels]
    assert "ascendfuse.swiglu.matmul" not in pats and "ascendfuse.swiglu.elementwise" in pats, pats


def test_elementwise_chain3():
    mod = build([("a", (4, 8), "float32"), ("b", (4, 8), "float32"), ("c", (8,), "float32")],
                lambda bb, a, b, c: relax.op.nn.relu(bb.emit(relax.op.multiply(bb.emit(relax.op.add(a, b)), c))))
    assert_fused(mod, "ascendfuse.elementwise.chain3")


def test_elementwise_chain2_noncommutative_fp16():
    mod = build([("a", (4, 8), "float16"), ("b", (4, 8), "float16")],
                lambda bb, a, b: relax.op.divide(b, bb.emit(relax.op.exp(a))))
    assert_fused(mod, "ascendfuse.elementwise.chain2")


def test_elementwise_chain4():
    mod = build([("a", (4, 8), "float32"), ("b", (4, 8), "float32")],
                lambda bb, a, b: relax.op.tanh(bb.emit(relax.op.subtract(
                    bb.emit(relax.op.sigmoid(bb.emit(relax.op.add(a, b)))), b))))
    assert_fused(mod, "ascendfuse.elementwise.chain4")


def test_elementwise_int_chain_is_refused():
    mod = build([("a", (4, 8), "int32"), ("b", (4, 8), "int32")],
                lambda bb, a, b: relax.op.multiply(bb.emit(relax.op.add(a, b)), b))
    result = assert_same_numbers(mod)
    reasons = [r.get("failed", "") for r in refusals(result, "TbeEltwiseFusionPass")]
    assert any("int32" in r for r in reasons), reasons
