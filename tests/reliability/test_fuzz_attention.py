"""Property test: random attention blocks around the attention + projection fusion give TVM default's numbers.

Each drawn block: x [-> RMSNorm / LayerNorm] -> Q, K, V projections (with or without biases) -> heads ->
Q·Kᵀ (scaled, optionally causal-masked) -> softmax -> ·V -> heads merged -> · Wo (+ bias) [+ x] [-> LayerNorm]
[-> an activation], sometimes with the attention output or the residual sum also returned (a second output),
under random switch settings (attention + projection, chained GEMMs). Sizes are small and odd on purpose.
Whatever the grouping makes of it (query inside or not, projection inside or not, refused for two outputs),
the compiled model must match TVM's default pipeline within fp32 tolerance.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax import op

from tests.helpers import assert_close, compile_ours, run_reference, run_vm, tol

EXAMPLES = int(os.environ.get("ASCENDFUSE_FUZZ_ATTENTION_EXAMPLES", "24"))


def _block(b, s, h, d, norm, bias, mask, residual, post_ln, act, extra, seed):
    rng = np.random.default_rng(seed)
    n = h * d
    c = lambda *shape: relax.const((rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((b, s, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            xin = x
            if norm == "rms":
                xin = bb.emit(op.nn.rms_norm(x, relax.const((1 + 0.1 * rng.random(n)).astype("float32"))))
            elif norm == "layer":
                xin = bb.emit(op.nn.layer_norm(x, c(n), c(n), [-1]))

            def proj():
                y = op.matmul(xin, c(n, n))
                return op.add(y, c(n)) if bias else y

            q, k, v = (bb.emit(op.permute_dims(op.reshape(bb.emit(proj()), (b, s, h, d)), [0, 2, 1, 3]))
                       for _ in range(3))
            sc = op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), relax.const(np.float32(d ** -0.5)))
            if mask:
                sc = op.add(sc, relax.const(np.triu(np.full((s, s), -1e9, "float32"), 1).reshape(1, 1, s, s)))
            o = bb.emit(op.reshape(op.permute_dims(op.matmul(op.nn.softmax(sc, -1), v), [0, 2, 1, 3]), (b, s, n)))
            y = op.matmul(o, c(n, n))
            y = bb.emit(op.add(y, c(n)) if bias else y)
            if residual:
                y = bb.emit(op.add(y, x))
            z = bb.emit(op.nn.layer_norm(y, c(n), c(n), [-1])) if post_ln else y
            if act:
                z = bb.emit(op.nn.gelu(z))
            extras = {"attention": o, "residual": y}.get(extra)
            out = bb.emit_output(relax.Tuple([z, extras]) if extras is not None and not extras.same_as(z) else z)
        bb.emit_func_output(out)
    return bb.get()


@st.composite
def blocks(draw):
    return dict(b=draw(st.sampled_from((1, 2))), s=draw(st.sampled_from((3, 5, 8, 12))),
                h=draw(st.sampled_from((1, 2, 3))), d=draw(st.sampled_from((4, 8))),
                norm=draw(st.sampled_from((None, "rms", "layer"))), bias=draw(st.booleans()),
                mask=draw(st.booleans()), residual=draw(st.booleans()), post_ln=draw(st.booleans()),
                act=draw(st.booleans()), extra=draw(st.sampled_from((None, None, "attention", "residual"))),
                seed=draw(st.integers(0, 2**16)))


SWITCHES = st.sampled_from((None, {"ChainedGemmFusionPass": "off"}, {"AttentionProjectionFusionPass": "off"}))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(blocks(), SWITCHES)
def test_attention_blocks_match_default(kw, switches):
    check_block(kw, switches)


def check_block(kw, switches):
    mod = _block(**kw)
    result = compile_ours(mod, switches=switches)
    x = np.random.default_rng(kw["seed"]).standard_normal((kw["b"], kw["s"], kw["h"] * kw["d"])).astype("float32")
    got, want = run_vm(result.executable, [x]), run_reference(mod, [x])
    got, want = (got, want) if isinstance(got, list) else ([got], [want])
    for g, w in zip(got, want):
        assert_close(g, w, **tol("float32"))
    # an attention kernel (fused with its projections or not) always gets its own rule, never the fallback
    stuck = [k for k in result.report.kernels if k.get("rule") == "fallback" and "softmax" in k.get("ops", [])]
    assert not stuck, stuck
    return result


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=False, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(blocks(), SWITCHES)
def test_attention_blocks_sweep_slow(kw, switches):
    check_block(kw, switches)
