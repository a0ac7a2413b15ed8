"""The transformer-export canonicalisations: GemmRowLayout, LayoutChain, AttentionScale, PackedQkv.

Each on the smallest graph that shows the export form, checked against the unrewritten graph (and the
canonical ops it must leave for the attention patterns)."""

import numpy as np
import pytest
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, build, ops, run_pass
from tests.helpers import assert_same_numbers
from tvm_ascendfuse.graph_fusion import (AttentionScaleFusionPass, GemmRowLayoutFusionPass,
                                         LayoutChainFusionPass, PackedQkvFusionPass)
from tvm_ascendfuse.graph_fusion._layout import express

RNG = np.random.default_rng(5)
C = lambda *s: relax.const(RNG.standard_normal(s).astype("float32") * 0.3)  # noqa: E731


# ---- the index-map canonical form -------------------------------------------------------------------------
@pytest.mark.parametrize("chain", [
    lambda a: a.reshape(2, 4, 6, 2).transpose(0, 2, 1, 3),                 # head split
    lambda a: a[:, 2:5, :],                                                 # one box
    lambda a: a[:, :, 6:12].reshape(2, 4, 3, 2).transpose(0, 2, 1, 3),      # part of a packed projection
    lambda a: a.transpose(1, 0, 2).reshape(8, 12),                          # seq-first, flattened
])
def test_express_reproduces_the_map(chain):
    src = np.arange(2 * 4 * 12).reshape(2, 4, 12)
    m = chain(src)
    layout = express(src.shape, m)
    assert layout is not None and np.array_equal(layout.apply_np(src), m)
    assert layout.ops <= 4


def test_express_refuses_repeats_and_strides():
    src = np.arange(24).reshape(2, 12)
    assert express(src.shape, np.broadcast_to(src[:, None], (2, 2, 12))) is None       # GQA repeat
    assert express(src.shape, src[:, ::2]) is None                                      # not one box
    assert express(src.shape, src[::-1]) is None                                        # rows reversed
    assert express(src.shape, np.stack([src[0, 0:6], src[1, 2:8]])) is None             # sheared rows
    assert express(src.shape, np.stack([src[0, 2:8], src[1, 0:6]])) is None             # corners outside


def test_express_keeps_a_head_cut_out_of_a_larger_projection():
    """The box of one head of one part (its corners give the box) and the part's rows in another order."""
    src = np.arange(3 * 10 * 24).reshape(3, 10, 24)
    m = src[1:, :, 8:16].reshape(2, 10, 2, 4).transpose(0, 2, 1, 3)
    layout = express(src.shape, m)
    assert layout is not None and layout.box == [(1, 3), (0, 10), (8, 16)]
    assert np.array_equal(layout.apply_np(src), m)


# ---- LayoutChainFusionPass --------------------------------------------------------------------------------
def gpt2_split(bb, x):
    """GPT-2's packed Q|K|V: split into three, each reshaped to heads and transposed."""
    parts = bb.emit(relax.op.split(x, 3, axis=-1))
    outs = []
    for i in range(3):
        p = bb.emit(relax.TupleGetItem(parts, i))
        r = bb.emit(relax.op.reshape(p, (1, 4, 2, 3)))
        outs.append(bb.emit(relax.op.permute_dims(r, [0, 2, 1, 3])))
    return [bb.emit(relax.op.nn.relu(o)) for o in outs]


def test_split_heads_become_slice_reshape_permute():
    mod = build(gpt2_split, (1, 4, 18))
    out, rec = run_pass(LayoutChainFusionPass, mod)
    assert rec.effect_times == 3
    body = ops(out)
    assert "split" not in body and body.count("strided_slice") == 3
    assert body.count("reshape") == 3 and body.count("permute_dims") == 3
    assert_same_after(mod, out)


def mha_dance(bb, x):
    """nn.MultiheadAttention's export after the packed in-projection (seq-first): unsqueeze, transpose,
    squeeze, take(part), reshape to heads, transpose."""
    u = bb.emit(relax.op.reshape(x, (4, 1, 3, 6)))                 # (seq, batch, 3, E)
    e = bb.emit(relax.op.expand_dims(u, 0))
    t = bb.emit(relax.op.permute_dims(e, [3, 1, 2, 0, 4]))
    s = bb.emit(relax.op.squeeze(t, [3]))
    q = bb.emit(relax.op.take(s, relax.const(np.array(1, "int64")), axis=0))
    r = bb.emit(relax.op.reshape(q, (4, 2, 3)))                    # (seq, batch*heads, head_dim)
    h = bb.emit(relax.op.permute_dims(r, [1, 0, 2]))
    return bb.emit(relax.op.nn.relu(h))


def test_mha_dance_becomes_one_canonical_chain():
    mod = build(mha_dance, (4, 1, 18))
    out, rec = run_pass(LayoutChainFusionPass, mod)
    assert rec.effect_times == 1
    body = ops(out)
    assert not {"take", "squeeze", "expand_dims"} & set(body), body
    assert len(body) <= 5
    assert_same_after(mod, out)


def test_canonical_chain_left_alone_and_switch():
    def body(bb, x):
        r = bb.emit(relax.op.reshape(x, (1, 4, 3, 6)))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.permute_dims(r, [0, 2, 1, 3]))))

    mod = build(body, (1, 4, 18))
    out, rec = run_pass(LayoutChainFusionPass, mod)
    assert rec.match_times == 0
    assert_switched_off(LayoutChainFusionPass, build(gpt2_split, (1, 4, 18)), matches=3)


# ---- GemmRowLayoutFusionPass ------------------------------------------------------------------------------
def conv1d_gpt2(bb, x):
    """GPT-2's Conv1D: rows flattened to 2-D around ``addmm``, then restored."""
    f = bb.emit(relax.op.reshape(x, (8, 6)))
    mm = bb.emit(relax.op.matmul(f, C(6, 5)))
    a = bb.emit(relax.op.add(mm, C(5)))
    return bb.emit(relax.op.nn.relu(bb.emit(relax.op.reshape(a, (2, 4, 5)))))


def test_flattened_gemm_becomes_batched():
    mod = build(conv1d_gpt2, (2, 4, 6))
    out, rec = run_pass(GemmRowLayoutFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["matmul", "add", "nn.relu"]
    assert_same_after(mod, out)


def seq_first_in_proj(bb, x):
    """Seq-first transpose in front of an in-projection whose output is only split into heads."""
    t = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))               # (batch, seq, E) -> (seq, batch, E)
    mm = bb.emit(relax.op.add(bb.emit(relax.op.matmul(t, C(6, 6))), C(6)))
    r = bb.emit(relax.op.reshape(mm, (4, 2, 2, 3)))
    return bb.emit(relax.op.nn.relu(bb.emit(relax.op.permute_dims(r, [1, 2, 0, 3]))))


def test_seq_first_transpose_moves_behind_the_gemm():
    mod = build(seq_first_in_proj, (2, 4, 6))
    out, rec = run_pass(GemmRowLayoutFusionPass, mod)
    assert rec.effect_times == 1
    assert ops(out)[:2] == ["matmul", "add"]                       # the GEMM now reads x directly
    assert_same_after(mod, out)
    out2, _ = run_pass(LayoutChainFusionPass, out)
    assert ops(out2).count("permute_dims") == 1
    assert_same_after(mod, out2)


def test_row_layout_switched_off():
    assert_switched_off(GemmRowLayoutFusionPass, build(conv1d_gpt2, (2, 4, 6)), matches=1)


# ---- AttentionScaleFusionPass -----------------------------------------------------------------------------
def scaled_qk(bb, q, k, v):
    qs = bb.emit(relax.op.multiply(q, relax.const(0.5, "float32")))
    kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
    ks = bb.emit(relax.op.multiply(kt, relax.const(0.25, "float32")))
    s = bb.emit(relax.op.matmul(qs, ks))
    p = bb.emit(relax.op.nn.softmax(s, axis=-1))
    return bb.emit(relax.op.matmul(p, v))


def test_q_and_k_scales_move_onto_the_score():
    mod = build(scaled_qk, (1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4))
    out, rec = run_pass(AttentionScaleFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert ops(out) == ["permute_dims", "matmul", "multiply", "nn.softmax", "matmul"]
    scale = [b.value for b in out["main"].body.blocks[0].bindings if ops_name(b.value) == "multiply"][0]
    assert float(scale.args[1].value.numpy()) == pytest.approx(0.125)
    assert_same_after(mod, out)


def ops_name(call):
    return call.op.name.replace("relax.", "") if isinstance(call, relax.Call) and hasattr(call.op, "name") else None


def test_scale_of_a_matmul_not_softmaxed_is_left():
    def body(bb, a, b):
        return bb.emit(relax.op.matmul(bb.emit(relax.op.multiply(a, relax.const(0.5, "float32"))), b))

    out, rec = run_pass(AttentionScaleFusionPass, build(body, (4, 4), (4, 4)))
    assert rec.match_times == 0


# ---- PackedQkvFusionPass ----------------------------------------------------------------------------------
def packed(bb, x):
    qkv = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, C(6, 18))), C(18)))
    parts = [bb.emit(relax.op.strided_slice(qkv, axes=[2], begin=[6 * i], end=[6 * i + 6])) for i in range(3)]
    return [bb.emit(relax.op.nn.relu(p)) for p in parts]


def test_packed_projection_cut_per_part():
    mod = build(packed, (1, 4, 6))
    out, rec = run_pass(PackedQkvFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (3, 3)
    body = ops(out)
    assert "strided_slice" not in body and body.count("matmul") == 3
    assert_same_after(mod, out)


def test_packed_projection_with_other_reader_is_left():
    def body(bb, x):
        qkv = bb.emit(relax.op.matmul(x, C(6, 12)))
        a = bb.emit(relax.op.strided_slice(qkv, axes=[2], begin=[0], end=[6]))
        return [bb.emit(relax.op.nn.relu(a)), bb.emit(relax.op.nn.relu(qkv))]

    out, rec = run_pass(PackedQkvFusionPass, build(body, (1, 4, 6)))
    assert rec.match_times == 0


def test_packed_switched_off():
    assert_switched_off(PackedQkvFusionPass, build(packed, (1, 4, 6)), matches=3)


# ---- whole pipeline: a GPT-2 style block reaches the attention kernels ------------------------------------
def gpt2_attention(bb, x):
    """Conv1D c_attn (flattened addmm), split into Q|K|V heads, scaled scores, softmax, P.V, head merge,
    Conv1D c_proj."""
    f = bb.emit(relax.op.reshape(x, (16, 8)))
    qkv = bb.emit(relax.op.add(bb.emit(relax.op.matmul(f, C(8, 24))), C(24)))
    qkv = bb.emit(relax.op.reshape(qkv, (1, 16, 24)))
    parts = bb.emit(relax.op.split(qkv, 3, axis=-1))
    q, k, v = (bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(bb.emit(relax.TupleGetItem(parts, i)),
                                                                      (1, 16, 2, 4))), [0, 2, 1, 3]))
               for i in range(3))
    s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
    s = bb.emit(relax.op.divide(s, relax.const(2.0, "float32")))
    o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
    m = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (16, 8)))
    p = bb.emit(relax.op.add(bb.emit(relax.op.matmul(m, C(8, 8))), C(8)))
    return bb.emit(relax.op.reshape(p, (1, 16, 8)))


def test_gpt2_attention_block_leaves_no_fallback_kernel():
    mod = build(gpt2_attention, (1, 16, 8))
    on = assert_same_numbers(mod)
    rules_on = list(on.report.to_dict()["schedules"].values())
    assert "fallback" not in rules_on, rules_on
    off = assert_same_numbers(mod, switches={n: False for n in (
        "GemmRowLayoutFusionPass", "LayoutChainFusionPass", "PackedQkvFusionPass", "AttentionScaleFusionPass")})
    assert len(on.report.kernels) < len(off.report.kernels)


# ---- whole pipeline: a LLaMA-style block (RoPE, GQA) reaches real rules ------------------------------------
def llama_block(kv_heads, heads=4, seq=16, d=8):
    """RMSNorm -> Q, K, V projections -> rotate-half RoPE on Q and K (cos/sin tables as constants, sin split
    in halves as transformers exports it) -> K/V heads repeated by expand_dims/broadcast_to/reshape (GQA)
    -> causal-masked attention -> output projection, residual."""
    e, rep = heads * d, heads // kv_heads

    def rope(bb, x, cos, sin_a, sin_b):
        a = bb.emit(relax.op.strided_slice(x, axes=[3], begin=[d // 2], end=[d]))
        b = bb.emit(relax.op.strided_slice(x, axes=[3], begin=[0], end=[d // 2]))
        r = bb.emit(relax.op.concat([bb.emit(relax.op.multiply(bb.emit(relax.op.negative(a)), sin_a)),
                                     bb.emit(relax.op.multiply(b, sin_b))], axis=3))
        return bb.emit(relax.op.add(bb.emit(relax.op.multiply(x, cos)), r))

    def heads_of(bb, y, n):
        return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(y, (1, seq, n, d))), [0, 2, 1, 3]))

    def repeat(bb, y):
        y = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(y, [2])), (1, kv_heads, rep, seq, d)))
        return bb.emit(relax.op.reshape(y, (1, heads, seq, d)))

    mask = np.triu(np.full((seq, seq), -1e9, "float32"), 1).reshape(1, 1, seq, seq)

    def body(bb, x):
        cos, sa, sb = C(1, 1, seq, d), C(1, 1, seq, d // 2), C(1, 1, seq, d // 2)
        h = bb.emit(relax.op.nn.rms_norm(x, C(e), axes=[2]))
        q = rope(bb, heads_of(bb, bb.emit(relax.op.matmul(h, C(e, e))), heads), cos, sa, sb)
        k = repeat(bb, rope(bb, heads_of(bb, bb.emit(relax.op.matmul(h, C(e, kv_heads * d))), kv_heads), cos, sa, sb))
        v = repeat(bb, heads_of(bb, bb.emit(relax.op.matmul(h, C(e, kv_heads * d))), kv_heads))
        s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
        s = bb.emit(relax.op.add(bb.emit(relax.op.multiply(s, relax.const(d ** -0.5, "float32"))),
                                 relax.const(mask)))
        o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (1, seq, e)))
        return bb.emit(relax.op.add(x, bb.emit(relax.op.matmul(o, C(e, e)))))

    return build(body, (1, seq, e))


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
def test_llama_block_rope_gqa_leaves_no_fallback_kernel(kv_heads):
    result = assert_same_numbers(llama_block(kv_heads))
    rules = result.report.to_dict()["schedules"]
    assert "fallback" not in rules.values(), rules
    assert not result.report.to_dict().get("rule_errors")
