"""LayerNorm + matmul and add + LayerNorm/RMSNorm patterns."""

import tvm
from tvm import relax

from tests.helpers import assert_same_numbers, compile_ours
from tests.patterns.util import assert_fused, assert_one_kernel, build, const, refusals, run_symbolic

H = 32


def ln(bb, x, dtype="float32"):
    return bb.emit(relax.op.nn.layer_norm(x, const((H,), dtype, 2), const((H,), dtype, 3), axes=[-1]))


def linear(bb, y, n=48, dtype="float32"):
    return bb.emit(relax.op.matmul(y, const((H, n), dtype, 4)))


def test_layer_norm_matmul():
    assert_fused(build([("x", (8, H), "float32")], lambda bb, x: linear(bb, ln(bb, x))),
                 "ascendfuse.norm.layer_norm_matmul")


def test_layer_norm_matmul_bias():
    assert_fused(build([("x", (8, H), "float32")],
                       lambda bb, x: relax.op.add(linear(bb, ln(bb, x)), const((48,)))),
                 "ascendfuse.norm.layer_norm_matmul_bias")


def test_layer_norm_matmul_bias_relu_fp16():
    mod = build([("x", (2, 8, H), "float16")], lambda bb, x: relax.op.nn.relu(
        bb.emit(relax.op.add(linear(bb, ln(bb, x, "float16"), dtype="float16"), const((48,), "float16")))))
    assert_fused(mod, "ascendfuse.norm.layer_norm_matmul_bias_act")


def test_layer_norm_feeding_two_matmuls_is_refused():
    def body(bb, x):
        y = ln(bb, x)
        return relax.op.add(linear(bb, y), linear(bb, y))
    result = assert_same_numbers(build([("x", (8, H), "float32")], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeLayerNormMatmulFusionPass")]
    assert any("used outside the group" in r for r in reasons), reasons


def test_layer_norm_matmul_ub_overflow():
    """One 8192-wide fp32 row (input, normalised, gamma, beta), double-buffered, does not fit 184 KiB
    (16 such rows still fit the 512 KiB L1)."""
    k = 8192
    mod = build([("x", (16, k), "float32")], lambda bb, x: bb.emit(relax.op.matmul(
        bb.emit(relax.op.nn.layer_norm(x, const((k,)), const((k,)), axes=[-1])), const((k, 16)))))
    result = assert_same_numbers(mod)
    recs = [r for r in refusals(result, "TbeLayerNormMatmulFusionPass") if r["reason"] == "ub_overflow"]
    assert recs, result.report.get("TbeLayerNormMatmulFusionPass").to_dict()
    assert recs[0]["bytes_needed"] >= 2 * 4 * k * 4 and recs[0]["bytes_available"] == 184 * 1024


def test_layer_norm_matmul_l1_refusal():
    """16 normalised fp32 rows of 6144 (384 KiB) exceed a 256 KiB L1: refused before the UB count."""
    from tvm_ascendfuse.target import make_target
    k = 6144
    mod = build([("x", (16, k), "float32")], lambda bb, x: bb.emit(relax.op.matmul(
        bb.emit(relax.op.nn.layer_norm(x, const((k,)), const((k,)), axes=[-1])), const((k, 16)))))
    result = compile_ours(mod, target=make_target("ascend910b", l1_bytes=256 * 1024))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeLayerNormMatmulFusionPass")]
    assert any("of L1" in r for r in reasons), reasons


def test_layer_norm_matmul_symbolic_batch_and_seq():
    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    mod = build([("x", (b, s, H), "float32")], lambda bb, x: relax.op.nn.relu(
        bb.emit(relax.op.add(linear(bb, ln(bb, x)), const((48,))))))
    result = compile_ours(mod)
    assert_one_kernel(result, "ascendfuse.norm.layer_norm_matmul_bias_act")
    run_symbolic(mod, result, [(2, 5, H)])


def test_layer_norm_over_symbolic_axis_is_refused():
    h = tvm.tirx.Var("h", "int64")
    mod = build([("x", (4, h), "float32"), ("g", (h,), "float32"), ("be", (h,), "float32"),
                 ("w", (h, 8), "float32")],
                lambda bb, x, g, be, w: relax.op.matmul(bb.emit(relax.op.nn.layer_norm(x, g, be, axes=[-1])), w))
    result = compile_ours(mod)
    reasons = [r.get("failed", "") for r in refusals(result, "TbeLayerNormMatmulFusionPass")]
    assert any("symbolic" in r for r in reasons), reasons
    run_symbolic(mod, result, [(4, 6), (6,), (6,), (6, 8)])


def test_add_layer_norm():
    mod = build([("x", (8, H), "float32"), ("r", (8, H), "float32")],
                lambda bb, x, r: relax.op.nn.layer_norm(bb.emit(relax.op.add(x, r)), const((H,)), const((H,)),
                                                        axes=[-1]))
    assert_fused(mod, "ascendfuse.norm.add_layer_norm")


def test_add_rms_norm_fp16():
    mod = build([("x", (2, 4, H), "float16"), ("r", (2, 4, H), "float16")],
                lambda bb, x, r: relax.op.nn.rms_norm(bb.emit(relax.op.add(x, r)), const((H,), "float16"),
                                                      axes=[-1]))
    assert_fused(mod, "ascendfuse.norm.add_rms_norm")


def test_add_rms_norm_with_reused_sum_is_one_two_output_kernel():
    """Pre-norm residual stream: the sum is normalised AND reused; the kernel returns both."""
    def body(bb, x, r):
        h = bb.emit(relax.op.add(x, r))
        y = bb.emit(relax.op.nn.rms_norm(h, const((H,)), axes=[-1]))
        return relax.op.multiply(h, y)
    result = assert_same_numbers(build([("x", (8, H), "float32"), ("r", (8, H), "float32")], body))
    pats = [k["pattern"] for k in result.report.kernels]
    assert "ascendfuse.norm.add_rms_norm" in pats, result.report.kernels
    assert result.report.get("TbeAddRmsNormFusionPass").effect_times == 1


def test_softmax_like_row_overflow_for_add_layer_norm():
    k = 100000
    mod = build([("x", (2, k), "float32"), ("r", (2, k), "float32")],
                lambda bb, x, r: relax.op.nn.layer_norm(bb.emit(relax.op.add(x, r)), const((k,)), const((k,)),
                                                        axes=[-1]))
    result = assert_same_numbers(mod)
    recs = [r for r in refusals(result, "TbeAddLayerNormFusionPass") if r["reason"] == "ub_overflow"]
    assert recs and recs[0]["bytes_needed"] > recs[0]["bytes_available"], \
        result.report.get("TbeAddLayerNormFusionPass").to_dict()


def test_add_layer_norm_symbolic_batch():
    n = tvm.tirx.Var("n", "int64")
    mod = build([("x", (n, H), "float32"), ("r", (n, H), "float32")],
                lambda bb, x, r: relax.op.nn.layer_norm(bb.emit(relax.op.add(x, r)), const((H,)), const((H,)),
                                                        axes=[-1]))
    result = compile_ours(mod)
    assert_one_kernel(result, "ascendfuse.norm.add_layer_norm")
    run_symbolic(mod, result, [(3, H), (3, H)])


def rms(bb, x, dtype="float32"):
    return bb.emit(relax.op.nn.rms_norm(x, const((H,), dtype, 2), axes=[-1]))


def test_rms_norm_matmul():
    """LLaMA's attention norm feeding the merged Q/K/V projection: one kernel, the norm is its prologue."""
    result = assert_fused(build([("x", (2, 8, H), "float32")], lambda bb, x: linear(bb, rms(bb, x), n=96)),
                          "ascendfuse.norm.rms_norm_matmul")
    assert result.report.kernels[0]["rule"] == "matmul"


def test_rms_norm_matmul_bias():
    assert_fused(build([("x", (8, H), "float32")], lambda bb, x: relax.op.add(linear(bb, rms(bb, x)), const((48,)))),
                 "ascendfuse.norm.rms_norm_matmul_bias")


def test_rms_norm_matmul_bias_act():
    assert_fused(build([("x", (8, H), "float32")], lambda bb, x: relax.op.nn.relu(
        bb.emit(relax.op.add(linear(bb, rms(bb, x)), const((48,)))))), "ascendfuse.norm.rms_norm_matmul_bias_act")


def test_rms_norm_feeding_two_matmuls_is_refused():
    def body(bb, x):
        y = rms(bb, x)
        return relax.op.add(linear(bb, y), linear(bb, y))
    result = assert_same_numbers(build([("x", (8, H), "float32")], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeRmsNormMatmulFusionPass")]
    assert any("used outside the group" in r for r in reasons), reasons
