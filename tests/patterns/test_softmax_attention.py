"""Scaled/masked softmax (TbeSoftmaxFusionPass) and attention (TbeAttentionFusionPass)."""

import pytest
import tvm
from tvm import relax

from tests.helpers import assert_same_numbers, compile_ours
from tests.patterns.util import assert_fused, assert_one_kernel, build, const, refusals, run_symbolic
from tvm_ascendfuse.target import make_target

S = ("s", (2, 4, 8, 8), "float32")
MASK = ("m", (2, 1, 1, 8), "float32")


def test_softmax_scale_mask():
    mod = build([S, MASK], lambda bb, s, m: relax.op.nn.softmax(bb.emit(relax.op.add(
        bb.emit(relax.op.multiply(s, relax.const(0.125))), m)), axis=-1))
    assert_fused(mod, "ascendfuse.softmax.scale_mask")


def test_softmax_divide_scale():
    mod = build([S], lambda bb, s: relax.op.nn.softmax(bb.emit(relax.op.divide(s, relax.const(8.0))), axis=-1))
    assert_fused(mod, "ascendfuse.softmax.scale")


def test_softmax_mask_fp16():
    mod = build([("s", (2, 8, 8), "float16"), ("m", (2, 1, 8), "float16")],
                lambda bb, s, m: relax.op.nn.softmax(bb.emit(relax.op.add(s, m)), axis=-1))
    assert_fused(mod, "ascendfuse.softmax.mask")


def test_softmax_row_too_long_for_ub():
    """One 200000-long fp32 row (x2 double buffering) cannot fit 184 KiB: refused, bytes recorded.

    Run at the pattern-fusion pass only: lowering a 200000-wide softmax through the whole pipeline takes
    minutes and says nothing more about the pattern (the unfused fallback is covered by the 6000 case)."""
    from tvm_ascendfuse.grouping import PatternFusionPass
    from tvm_ascendfuse.report import FusionReport

    mod = build([("s", (1, 200000), "float32")],
                lambda bb, s: relax.op.nn.softmax(bb.emit(relax.op.multiply(s, relax.const(0.5))), axis=-1))
    report = FusionReport()
    grouped = PatternFusionPass("ascend910b", report)(mod)
    recs = [r for r in report.get("TbeSoftmaxFusionPass").not_effective if r["reason"] == "ub_overflow"]
    assert recs, report.get("TbeSoftmaxFusionPass").to_dict()
    assert recs[0]["bytes_needed"] >= 2 * 200000 * 4 * 2 and recs[0]["bytes_available"] == 184 * 1024
    assert not any(f.attrs and "Composite" in f.attrs for _, f in grouped.functions.items()
                   if isinstance(f, relax.Function))


Q = ("q", (1, 2, 8, 16), "float32")
K = ("k", (1, 2, 8, 16), "float32")
V = ("v", (1, 2, 8, 16), "float32")
AMASK = ("m", (1, 1, 1, 8), "float32")


def attention(bb, q, k, v, m=None, scale="mul"):
    s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
    if scale == "mul":
        s = bb.emit(relax.op.multiply(s, relax.const(0.25)))
    elif scale == "div":
        s = bb.emit(relax.op.divide(s, relax.const(4.0)))
    if m is not None:
        s = bb.emit(relax.op.add(s, m))
    return relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v)


def test_attention_scale_mask():
    assert_fused(build([Q, K, V, AMASK], lambda bb, q, k, v, m: attention(bb, q, k, v, m)),
                 "ascendfuse.attention.scale_mask")


def test_attention_divide_scale():
    assert_fused(build([Q, K, V], lambda bb, q, k, v: attention(bb, q, k, v, scale="div")),
                 "ascendfuse.attention.scale")


def test_attention_mask_only():
    assert_fused(build([Q, K, V, AMASK], lambda bb, q, k, v, m: attention(bb, q, k, v, m, scale=None)),
                 "ascendfuse.attention.mask")


def test_attention_plain_fp16():
    mod = build([(n, s, "float16") for n, s, _ in (Q, K, V)],
                lambda bb, q, k, v: attention(bb, q, k, v, scale=None))
    assert_fused(mod, "ascendfuse.attention.plain")


def test_attention_with_bert_style_head_split():
    """Q/K/V projections reshaped into heads around the attention core (as a BERT ONNX export imports):
    the core from Q·Kᵀ to P·V is one kernel (the projections are merged into one matmul, whose head split
    the attention kernel takes as its prologue)."""
    hid, heads, seq = 32, 2, 8

    def body(bb, x, m):
        def proj(seed, perm):
            y = bb.emit(relax.op.matmul(x, const((hid, hid), seed=seed)))
            y = bb.emit(relax.op.reshape(y, (1, seq, heads, hid // heads)))
            return bb.emit(relax.op.permute_dims(y, perm))
        q, kt, v = proj(5, [0, 2, 1, 3]), proj(6, [0, 2, 3, 1]), proj(7, [0, 2, 1, 3])
        s = bb.emit(relax.op.divide(bb.emit(relax.op.matmul(q, kt)), relax.const(4.0)))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, m)), axis=-1))
        o = bb.emit(relax.op.permute_dims(bb.emit(relax.op.matmul(p, v)), [0, 2, 1, 3]))
        return relax.op.reshape(o, (1, seq, hid))

    result = assert_same_numbers(build([("x", (1, seq, hid), "float32"), ("m", (1, 1, 1, seq), "float32")], body))
    att = [k for k in result.report.kernels if k["pattern"] == "ascendfuse.attention.scale_mask"]
    assert len(att) == 1 and att[0]["launches"] == 1, result.report.kernels
    assert result.report.get("TbeAttentionFusionPass").effect_times == 1


def test_attention_probabilities_used_outside_is_refused():
    def body(bb, q, k, v):
        s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.multiply(s, relax.const(0.25))), axis=-1))
        o = bb.emit(relax.op.matmul(p, v))
        return relax.op.add(o, bb.emit(relax.op.sum(p, axis=[-1], keepdims=True)))
    result = assert_same_numbers(build([Q, K, V], body))
    reasons = [r.get("failed", "") for r in refusals(result, "TbeAttentionFusionPass")]
    assert any("used outside the group" in r for r in reasons), reasons


def test_attention_long_keys_overflow():
    mod = build([("q", (1, 1, 16, 16), "float32"), ("k", (1, 1, 8192, 16), "float32"),
                 ("v", (1, 1, 8192, 16), "float32")], lambda bb, q, k, v: attention(bb, q, k, v))
    result = assert_same_numbers(mod)
    recs = [r for r in refusals(result, "TbeAttentionFusionPass") if r["reason"] == "ub_overflow"]
    assert recs and recs[0]["bytes_needed"] > recs[0]["bytes_available"]


def test_attention_symbolic_query_length_is_accepted():
    """Query rows may be symbolic (a tile holds cube_m of them); the key length is static."""
    n = tvm.tirx.Var("n", "int64")
    mod = build([("q", (1, 2, n, 16), "float32"), K, V], lambda bb, q, k, v: attention(bb, q, k, v))
    result = compile_ours(mod)
    assert_one_kernel(result, "ascendfuse.attention.scale")
    run_symbolic(mod, result, [(1, 2, 5, 16), (1, 2, 8, 16), (1, 2, 8, 16)])


def test_attention_symbolic_key_length_is_refused():
    """Without online softmax a tile needs whole score rows: an unbounded key length cannot be proven to fit."""
    s = tvm.tirx.Var("s", "int64")
    mod = build([Q, ("k", (1, 2, s, 16), "float32"), ("v", (1, 2, s, 16), "float32")],
                lambda bb, q, k, v: attention(bb, q, k, v))
    # (with a few query rows the graph pass makes it one flash-decoding kernel first: keys in chunks)
    result = compile_ours(mod, switches={"GraphFusion": {"IncreFlashAttentionFusionPass": "off"}})
    reasons = [r.get("failed", "") for r in refusals(result, "TbeAttentionFusionPass")]
    assert any("symbolic" in r for r in reasons), reasons
    run_symbolic(mod, result, [(1, 2, 8, 16), (1, 2, 11, 16), (1, 2, 11, 16)])
    result = compile_ours(mod)
    assert [k["rule"] for k in result.report.kernels] == ["flash-decode"], result.report.kernels
    run_symbolic(mod, result, [(1, 2, 8, 16), (1, 2, 11, 16), (1, 2, 11, 16)])


def test_working_set_depends_on_the_target():
    """A 6000-long fp32 row: in, scaled, out and exp rows (~96 KiB) double-buffered overflow the 184 KiB of
    an ascend910b core but fit ascend310p's 248 KiB, and fit a 910b that does not double-buffer."""
    mod = build([("s", (1, 6000), "float32")],
                lambda bb, s: relax.op.nn.softmax(bb.emit(relax.op.multiply(s, relax.const(0.5))), axis=-1))
    refused = compile_ours(mod, target="ascend910b")
    recs = [r for r in refusals(refused, "TbeSoftmaxFusionPass") if r["reason"] == "ub_overflow"]
    assert recs and 184 * 1024 < recs[0]["bytes_needed"] < 248 * 1024, recs
    assert_one_kernel(compile_ours(mod, target="ascend310p"), "ascendfuse.softmax.scale")
    assert_one_kernel(compile_ours(mod, target=make_target("ascend910b", double_buffer=False)),
                      "ascendfuse.softmax.scale")


def test_attention_takes_head_split_of_a_merged_projection():
    """Q, K, V cut out of one merged projection (slice -> reshape -> permute): the cut is the kernel's
    injective prologue, so the whole graph is one attention kernel reading the projection once."""
    hid, heads, seq = 32, 2, 8

    def body(bb, qkv, m):
        def part(i, perm):
            y = bb.emit(relax.op.strided_slice(qkv, axes=[2], begin=[i * hid], end=[(i + 1) * hid]))
            return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(y, (1, seq, heads, hid // heads))), perm))
        q, kt, v = part(0, [0, 2, 1, 3]), part(1, [0, 2, 3, 1]), part(2, [0, 2, 1, 3])
        s = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)), relax.const(0.25)))
        return relax.op.matmul(bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, m)), axis=-1)), v)

    mod = build([("qkv", (1, seq, 3 * hid), "float32"), ("m", (1, 1, 1, seq), "float32")], body)
    result = assert_fused(mod, "ascendfuse.attention.scale_mask")
    assert result.report.kernels[0]["rule"] == "attention"


def _gqa_attention(seq, past, scale=True, mask=False, heads=4, kv=2, d=16):
    """K and V of ``kv`` KV heads repeated to ``heads`` query heads (expand_dims -> broadcast_to -> reshape,
    LLaMA's repeat_kv), then attention with an optional scale and additive mask."""
    keys = past + seq

    def repeat(bb, x):
        x = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(x, [2])), (1, kv, heads // kv, keys, d)))
        return bb.emit(relax.op.reshape(x, (1, heads, keys, d)))

    def body(bb, q, k, v, *m):
        kt = bb.emit(relax.op.permute_dims(repeat(bb, k), [0, 1, 3, 2]))
        s = bb.emit(relax.op.matmul(q, kt))
        if scale:
            s = bb.emit(relax.op.multiply(s, relax.const(d ** -0.5, "float32")))
        if mask:
            s = bb.emit(relax.op.add(s, m[0]))
        return relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), repeat(bb, v))

    params = [("q", (1, heads, seq, d), "float32"), ("k", (1, kv, keys, d), "float32"),
              ("v", (1, kv, keys, d), "float32")] + ([("m", (1, 1, seq, keys), "float32")] if mask else [])
    return build(params, body)


@pytest.mark.parametrize("pattern,scale,mask", [
    ("ascendfuse.attention.scale_mask_gqa", True, True), ("ascendfuse.attention.scale_gqa", True, False),
    ("ascendfuse.attention.mask_gqa", False, True), ("ascendfuse.attention.plain_gqa", False, False)])
def test_decode_attention_takes_the_repeat_of_grouped_kv_heads(pattern, scale, mask):
    """One query row (decode): both repeats are read in place by the attention kernel. The repeat of V was a
    kernel of its own, writing heads / kv_heads copies of the cache for the attention to read."""
    result = assert_same_numbers(_gqa_attention(1, 31, scale, mask))
    [kernel] = result.report.kernels
    assert kernel["pattern"] == pattern, kernel
    assert kernel["rule"] == "decode-attention" and kernel["ops"].count("broadcast_to") == 2, kernel


def test_prefill_leaves_the_repeat_of_v_apart():
    """16 query rows: the GQA variants refuse (few_query_rows); V's repeat stays a kernel of its own, which
    the attention rule stages per head (faster on a LLaMA-style prefill than reading through the repeat)."""
    result = assert_same_numbers(_gqa_attention(16, 0))
    [kernel] = [k for k in result.report.kernels if "softmax" in k["ops"]]
    assert kernel["pattern"] == "ascendfuse.attention.scale" and kernel["rule"] == "attention", kernel
    assert kernel["ops"].count("broadcast_to") == 1, result.report.kernels
