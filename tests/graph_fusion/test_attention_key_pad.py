"""AttentionKeyPadFusionPass: an attention over a key count no 4-lane vector divides (ViT's 197) gets K, V and
its score rows padded to whole 16-lane vectors with the padded keys masked out: same numbers (the pass alone
and through the pipeline, where the attention kernel takes the pads), odd counts, batch 2, a mask, cross
attention; left alone for counts a vector divides (Whisper's 1500 analogue) and short rows."""

import numpy as np
import pytest
from tvm import relax

from tests.graph_fusion.common import assert_same_after, assert_switched_off, build, ops, run_pass
from tests.helpers import assert_same_numbers
from tvm_ascendfuse.graph_fusion import AttentionKeyPadFusionPass
from tvm_ascendfuse.graph_fusion.attention_key_pad import query_row_pad

RNG = np.random.default_rng(5)
C = lambda *s: relax.const(RNG.standard_normal(s).astype("float32") * 0.3)  # noqa: E731
ON = {"AttentionKeyPadFusionPass": "on"}


def vit_attention(seq=37, h=2, d=8, batch=1, mask=None, sk=None, project=True):
    """Pre-LN encoder attention (ViT): LayerNorm -> Q, K, V -> softmax(Q·Kᵀ * d^-0.5 [+ mask])·V -> heads
    merged (-> · Wo + x). ``sk``: a second input of ``sk`` rows gives K and V (cross attention)."""
    e = h * d
    sk = sk or seq

    def heads(bb, t, s):
        return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, (batch, s, h, d))), [0, 2, 1, 3]))

    def body(bb, x, *kv):
        n = bb.emit(relax.op.nn.layer_norm(x, C(e), C(e), [-1]))
        src = kv[0] if kv else n
        q = heads(bb, bb.emit(relax.op.add(bb.emit(relax.op.matmul(n, C(e, e))), C(e))), seq)
        k = heads(bb, bb.emit(relax.op.add(bb.emit(relax.op.matmul(src, C(e, e))), C(e))), sk)
        v = heads(bb, bb.emit(relax.op.add(bb.emit(relax.op.matmul(src, C(e, e))), C(e))), sk)
        s = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2])))),
                                      relax.const(d ** -0.5, "float32")))
        if mask is not None:
            s = bb.emit(relax.op.add(s, relax.const(mask)))
        o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (batch, seq, e)))
        if not project:
            return o
        return bb.emit(relax.op.add(bb.emit(relax.op.add(bb.emit(relax.op.matmul(o, C(e, e))), C(e))), x))

    shapes = [(batch, seq, e)] + ([(batch, sk, e)] if sk != seq else [])
    return build(body, *shapes)


def _softmax_width(mod) -> int:
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.softmax":
                return int(b.value.args[0].ty.shape[-1])
    raise AssertionError("no softmax")


@pytest.mark.parametrize("seq,batch", [(37, 1), (77, 1), (37, 2), (33, 2)])
def test_odd_key_counts_padded_to_whole_vectors_same_numbers(seq, batch):
    mod = vit_attention(seq, batch=batch)
    out, rec = run_pass(AttentionKeyPadFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert _softmax_width(out) == -(-seq // 16) * 16
    # K and V, and Q when its rows grow to whole 8-row blocks (77 -> 80; 33 and 37 are short rows)
    assert ops(out).count("nn.pad") == 2 + (query_row_pad(seq) > 0)
    assert_same_after(mod, out)


@pytest.mark.parametrize("seq,masked", [(77, False), (197, False), (77, True)])
def test_query_rows_padded_to_whole_row_blocks_same_numbers(seq, masked):
    """ViT's 197 query rows (77 here too) grow to a multiple of 8 with zero rows, so the attention kernel's
    blocks of rows divide them (no predicated row tail in its products and softmax); the output is sliced
    back to the real rows. A causal mask, which has a row per query, is padded along its rows too."""
    mask = None
    if masked:
        mask = np.triu(np.full((seq, seq), np.finfo("float32").min, "float32"), 1).reshape(1, 1, seq, seq)
    mod = vit_attention(seq, mask=mask)
    out, rec = run_pass(AttentionKeyPadFusionPass, mod)
    assert rec.effect_times == 1
    body = ops(out)
    assert body.count("strided_slice") == ops(mod).count("strided_slice") + 1
    q_rows = [int(b.value.args[0].ty.shape[-2]) for blk in out["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.softmax"]
    assert q_rows == [seq + query_row_pad(seq)] and q_rows[0] % 8 == 0
    assert_same_after(mod, out)


def test_a_mask_is_padded_and_takes_the_key_mask():
    """With an additive mask (here causal, the dtype's lowest value above the diagonal): it is padded along the
    keys and the key mask folded into it, one add in front of the softmax as the attention patterns take."""
    seq = 37
    mask = np.triu(np.full((seq, seq), np.finfo("float32").min, "float32"), 1).reshape(1, 1, seq, seq)
    mod = vit_attention(seq, mask=mask)
    out, rec = run_pass(AttentionKeyPadFusionPass, mod)
    assert rec.effect_times == 1
    body = ops(out)
    assert body[body.index("nn.softmax") - 1] == "add"          # one add (score + mask) feeds the softmax
    assert body.count("add") == ops(mod).count("add") + 1       # the key mask added to the mask, not the score
    assert body.count("nn.pad") == 3                            # K, V and the mask
    assert_same_after(mod, out)


def test_cross_attention_pads_the_keys_not_the_queries():
    mod = vit_attention(seq=16, sk=50, project=False)
    out, rec = run_pass(AttentionKeyPadFusionPass, mod)
    assert rec.effect_times == 1 and _softmax_width(out) == 64
    assert_same_after(mod, out)


@pytest.mark.parametrize("seq", [60, 64, 20])
def test_counts_a_vector_divides_and_short_rows_are_left(seq):
    """60 (as Whisper's 1500: 4-lane vectors divide it), 64, and 20 keys (short rows)."""
    mod = vit_attention(seq)
    out, rec = run_pass(AttentionKeyPadFusionPass, mod)
    assert rec.effect_times == 0
    assert "nn.pad" not in ops(out)


def test_switched_off_records_the_match():
    assert_switched_off(AttentionKeyPadFusionPass, vit_attention(37), 1)


@pytest.mark.parametrize("seq,batch", [(37, 1), (37, 2)])
def test_pipeline_attention_kernel_takes_the_pads(seq, batch):
    """Through the pipeline: same numbers as TVM's default build of the unpadded graph; the pads are part of
    the attention kernel's operand copies (no kernel of their own), which runs on the attention rule. The
    odd query rows keep the attention apart from its output projection (reported)."""
    mod = vit_attention(seq, batch=batch)
    on = assert_same_numbers(mod, switches=ON)
    assert on.report.get("AttentionKeyPadFusionPass").effect_times == 1
    assert assert_same_numbers(mod).report.get("AttentionKeyPadFusionPass").effect_times == 1   # on by default
    off = assert_same_numbers(mod, switches={"AttentionKeyPadFusionPass": "off"})
    kernels = lambda r: sum(k["launches"] for k in r.report.kernels)  # noqa: E731
    assert kernels(on) == kernels(off)
    assert "attention" in on.report.sections["schedules"].values()
    why = [r.get("why", "") for r in on.report.get("CostBasedFusionPass").not_effective]
    assert any("query rows are no whole number" in w for w in why), why


def test_window_attention_with_its_window_reverse_through_the_pipeline():
    """Swin-style: 49 window rows against 49 keys, padded to 64; the window reverse after P·V follows the
    attention kernel's blocks of query rows (whole image rows of the window), same numbers."""
    h, d = 3, 16

    def body(bb, q, k, v):
        s = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2])))),
                                      relax.const(d ** -0.5, "float32")))
        o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        o = bb.emit(relax.op.reshape(o, (1, 2, 2, h, 7, 7, d)))
        return bb.emit(relax.op.permute_dims(o, [0, 1, 4, 2, 5, 3, 6]))

    result = assert_same_numbers(build(body, (4, h, 49, d), (4, h, 49, d), (4, h, 49, d)))
    assert result.report.get("AttentionKeyPadFusionPass").effect_times == 1
    assert "attention" in result.report.sections["schedules"].values()
