"""ConcatSplitFusionPass: elementwise ops moved above a concat, onto each part's producer."""

import numpy as np
from tvm import relax

from tests.graph_fusion.common import assert_refused, assert_same_after, assert_switched_off, build, ops, run_pass
from tvm_ascendfuse.graph_fusion import ConcatSplitFusionPass as P

RNG = np.random.default_rng(6)


def parts(bb, x, y):
    a = bb.emit(relax.op.nn.conv2d(x, relax.const(RNG.standard_normal((4, 3, 3, 3)).astype("float32")), padding=1))
    b = bb.emit(relax.op.exp(y))
    return a, b


def chain(scale_shape=(1, 6, 1, 1), extra=False, param_part=False):
    def body(bb, x, y):
        a, b = parts(bb, x, y)
        cat = bb.emit(relax.op.concat([a, y if param_part else b], axis=1))
        m = bb.emit(relax.op.multiply(cat, relax.const(RNG.random(scale_shape).astype("float32"))))
        out = relax.op.nn.relu(m)
        return (out, cat) if extra else out
    return body


def test_split_chain():
    """relu(cat * s) with s varying along the concat axis: both ops move, s is sliced per part."""
    mod = build(chain(), (1, 3, 6, 6), (1, 2, 6, 6))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (2, 2)          # multiply (round 1), relu (round 2)
    names = ops(out)
    assert names[-1] == "concat" and names.count("multiply") == 2 and names.count("nn.relu") == 2
    assert_same_after(mod, out)


def test_split_scalar_const_first():
    def body(bb, x, y):
        a, b = parts(bb, x, y)
        return relax.op.subtract(relax.const(1.0, "float32"), bb.emit(relax.op.concat([a, b], axis=1)))
    mod = build(body, (1, 3, 6, 6), (1, 2, 6, 6))
    out, rec = run_pass(P, mod)
    assert rec.effect_times == 1 and ops(out).count("subtract") == 2
    assert_same_after(mod, out)


def test_split_switched_off():
    assert_switched_off(P, build(chain(), (1, 3, 6, 6), (1, 2, 6, 6)), 1)   # one round when off


def test_concat_used_elsewhere_refused():
    assert_refused(P, build(chain(extra=True), (1, 3, 6, 6), (1, 2, 6, 6)), "concat has other consumers")


def test_part_without_producer_refused():
    assert_refused(P, build(chain(param_part=True), (1, 3, 6, 6), (1, 2, 6, 6)), "no single producer")


def test_broadcasting_const_refused():
    mod = build(chain(scale_shape=(2, 6, 1, 1)), (1, 3, 6, 6), (1, 2, 6, 6))
    assert_refused(P, mod, "larger shape")


def bn_on_concat(bb, x, y, training=False):
    a, b = parts(bb, x, y)
    cat = bb.emit(relax.op.concat([a, b], axis=1))
    n = 6
    p = [relax.const(v) for v in (RNG.random(n, "float32") + .5, RNG.standard_normal(n).astype("float32"),
                                  RNG.standard_normal(n).astype("float32"), RNG.random(n, "float32") + .5)]
    bn = bb.emit(relax.op.nn.batch_norm(cat, *p, axis=1, training=training))
    return relax.op.nn.leakyrelu(bb.emit(relax.TupleGetItem(bn, 0)), 0.1)


def test_split_batch_norm_then_activation():
    """BN(concat) -> concat(BN(part)) with per-part parameter slices; then the activation moves too."""
    mod = build(bn_on_concat, (1, 3, 6, 6), (1, 2, 6, 6))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (2, 2)
    names = ops(out)
    assert names.count("nn.batch_norm") == 2 and names.count("nn.leakyrelu") == 2 and names[-1] == "concat"
    assert_same_after(mod, out)


def test_split_training_batch_norm_not_a_match():
    mod = build(lambda bb, x, y: bn_on_concat(bb, x, y, training=True), (1, 3, 6, 6), (1, 2, 6, 6))
    out, rec = run_pass(P, mod)
    assert rec.match_times == 0 and out.same_as(mod)
