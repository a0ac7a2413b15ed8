"""AttentionMaskFusionPass: a where-applied mask in front of a softmax becomes an additive mask."""

import numpy as np
import pytest
from tvm import relax

from tests.graph_fusion.common import assert_refused, assert_switched_off, build, ops, run_pass
from tests.helpers import assert_close, run_reference
from tvm_ascendfuse.graph_fusion import AttentionMaskFusionPass as P

KEEP = (np.random.default_rng(3).random((5, 7)) > 0.4) | (np.arange(7)[None] == np.arange(5)[:, None])


def masked(orientation="keep", fill=float("-inf"), fill_like=False, consumer="softmax"):
    def body(bb, s):
        f = relax.const(fill, "float32")
        if fill_like:
            f = bb.emit(relax.op.full_like(s, f))
        if orientation == "keep":
            m = bb.emit(relax.op.where(relax.const(KEEP), s, f))
        else:
            m = bb.emit(relax.op.where(relax.const(~KEEP), f, s))
        if consumer == "softmax":
            return bb.emit(relax.op.nn.softmax(m, axis=-1))
        return bb.emit(relax.op.exp(m))
    return build(body, (2, 3, 5, 7))


@pytest.mark.parametrize("kw", [dict(), dict(orientation="masked"), dict(fill_like=True),
                                dict(orientation="masked", fill=float(np.finfo(np.float32).min))])
def test_where_mask_becomes_additive(kw):
    mod = masked(**kw)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    body = ops(out)
    assert body[-1] == "nn.softmax" and body[-2] == "add", body
    # numpy reference: TVM cannot legalize full_like (its fill's dtype), so not TVM on the original module
    s = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype("float32")
    m = np.where(KEEP, s, np.float32(kw.get("fill", -np.inf)))
    e = np.exp(m - m.max(-1, keepdims=True))
    assert_close(run_reference(out, [s]), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_fill_that_does_not_absorb_the_score_is_refused():
    assert_refused(P, masked(fill=-1e4), "neither -inf")


def test_select_not_feeding_softmax_is_left_and_switch():
    out, rec = run_pass(P, masked(consumer="exp"))
    assert rec.match_times == 0
    assert_switched_off(P, masked(), 1)


def nan_guarded(mask):
    """softmax(s + mask) followed by where(isnan(p), 0, p), as the dynamo export of SDPA writes it."""
    def body(bb, s):
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, mask)), axis=-1))
        g = bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)), relax.const(0.0, "float32"), p))
        return bb.emit(relax.op.multiply(g, relax.const(2.0, "float32")))
    return build(body, (2, 3, 5, 7))


def test_nan_guard_of_a_mask_keeping_every_row_is_dropped():
    mod = nan_guarded(relax.const(np.where(KEEP, 0.0, -np.inf).astype("float32")))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert "isnan" not in ops(out) and "where" not in ops(out)
    s = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype("float32")
    assert_close(run_reference(out, [s]), run_reference(mod, [s]), rtol=1e-5, atol=1e-6)


def test_nan_guard_kept_when_a_row_may_be_all_masked():
    empty_row = np.where(KEEP, 0.0, -np.inf).astype("float32")
    empty_row[2] = -np.inf
    assert_refused(P, nan_guarded(relax.const(empty_row)), "leaves a row with no key")
