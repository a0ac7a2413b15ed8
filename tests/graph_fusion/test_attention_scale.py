"""AttentionScaleFusionPass with the scale in front of the query's head split (Whisper: ``q_proj(x) * s``,
then reshape to heads and transpose): the scale moves through the layout ops onto the score, so the
attention patterns (scale between Q·Kᵀ and the softmax) see the whole attention."""

import numpy as np
from tvm import relax

from tests.graph_fusion.common import assert_same_after, build, ops, run_pass
from tests.helpers import assert_same_numbers
from tvm_ascendfuse.graph_fusion import AttentionScaleFusionPass

RNG = np.random.default_rng(11)
C = lambda *s: relax.const(RNG.standard_normal(s).astype("float32") * 0.3)  # noqa: E731
OFF = {"AttentionScaleFusionPass": "off"}


def heads(bb, t, seq, h, d):
    return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, (1, seq, h, d))), [0, 2, 1, 3]))


def whisper_attention(seq=16, h=2, d=8, norm=True):
    """Whisper's encoder self-attention: (LayerNorm ->) Q (with bias, scaled by d^-0.5 before the head split),
    K (no bias), V; softmax(Q·Kᵀ)·V; head merge; output projection; residual."""
    e = h * d

    def body(bb, x):
        n = bb.emit(relax.op.nn.layer_norm(x, C(e), C(e), [-1])) if norm else x
        q = bb.emit(relax.op.add(bb.emit(relax.op.matmul(n, C(e, e))), C(e)))
        q = bb.emit(relax.op.multiply(q, relax.const(d ** -0.5, "float32")))
        q = heads(bb, q, seq, h, d)
        k = heads(bb, bb.emit(relax.op.matmul(n, C(e, e))), seq, h, d)
        v = heads(bb, bb.emit(relax.op.add(bb.emit(relax.op.matmul(n, C(e, e))), C(e))), seq, h, d)
        s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
        o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (1, seq, e)))
        return bb.emit(relax.op.add(bb.emit(relax.op.add(bb.emit(relax.op.matmul(o, C(e, e))), C(e))), x))
    return build(body, (1, seq, e))


def test_scale_behind_the_head_split_moves_onto_the_score():
    mod = whisper_attention(norm=False)
    out, rec = run_pass(AttentionScaleFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    body = ops(out)
    assert body.index("multiply") == body.index("nn.softmax") - 1     # the scale sits on the score
    assert body.count("multiply") == 1
    assert_same_after(mod, out)


def test_scale_behind_a_layout_op_read_twice_is_left():
    """The scaled query also read elsewhere: moving the scale would change that reader."""
    def body(bb, x):
        q = bb.emit(relax.op.multiply(x, relax.const(0.5, "float32")))
        qh = heads(bb, q, 4, 2, 3)
        s = bb.emit(relax.op.matmul(qh, bb.emit(relax.op.permute_dims(qh, [0, 1, 3, 2]))))
        return bb.emit(relax.op.nn.softmax(s, axis=-1))
    out, rec = run_pass(AttentionScaleFusionPass, build(body, (1, 4, 6)))
    assert rec.effect_times == 0


def test_scale_stays_in_the_projection_when_the_score_rows_do_not_fit_ub():
    """1500 keys (Whisper's encoder): cube_m score rows and their copies need more than UB, the attention
    cannot be one kernel, so the scale stays where the projection's epilogue applies it (refusal recorded)."""
    mod = whisper_attention(seq=1500, norm=False)
    out, rec = run_pass(AttentionScaleFusionPass, mod)
    assert rec.effect_times == 0
    [r] = rec.not_effective
    assert r["bytes_needed"] == 3 * 16 * 1500 * 4 > r["bytes_available"] == 188416, r


def test_whisper_attention_block_pipeline():
    """Through the pipeline: with the scale on the score the attention kernel also takes the query and
    output projections (Q is never written), no fallback kernel, same numbers as the unrewritten graph."""
    mod = whisper_attention()
    on = assert_same_numbers(mod)
    off = assert_same_numbers(mod, switches=OFF)
    rules_on = list(on.report.to_dict()["schedules"].values())
    assert "fallback" not in rules_on and "attention-projection" in rules_on, rules_on
    assert len(on.report.kernels) <= len(off.report.kernels)

    def query_inside(result):
        return [g["chain"].get("query_projection") for g in result.report.sections["grouping"]["groups"]
                if g.get("chain", {}).get("kind") == "attention + output projection"]

    assert query_inside(on) == ["matmul"]       # with its LayerNorm: Q never goes to GM
    assert query_inside(off) == [None]          # the scaled Q written by the Q|K|V kernel, read back
