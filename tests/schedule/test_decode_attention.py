"""DecodeAttentionRule: attention of one to a few query rows per head over a cache of keys - numbers equal to
the unscheduled kernel (MHA, GQA through an in-kernel repeat of the KV heads, a mask, the head merge), one
parallel task per head, the scores on chip; many query rows are the attention rule's."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op

from tests.helpers import assert_same_numbers
from tests.schedule.kernels import HOST, NATIVE, attention_kernel, check_rule, fused_kernel
from tvm_ascendfuse.rule_specs import GroupShape, predict_rule
from tvm_ascendfuse.schedule.decode_attention import DecodeAttentionRule
from tvm_ascendfuse.target import get_target

NPU = get_target("ascend910b")


def gqa_decode(heads=8, kv_heads=2, keys=96, d=32, rows=1):
    """q (1, H, rows, d); K, V (1, KV, keys, d) repeated to H heads inside the kernel (LLaMA's repeat_kv),
    scale, additive mask over the keys, P.V, heads merged into the hidden size."""
    rep = heads // kv_heads

    def repeat(x):
        x = op.broadcast_to(op.expand_dims(x, [2]), (1, kv_heads, rep, keys, d))
        return op.reshape(x, (1, heads, keys, d))

    def build(q, k, v, mask):
        s = op.multiply(op.matmul(q, op.permute_dims(repeat(k), [0, 1, 3, 2])), relax.const(d ** -0.5, "float32"))
        p = op.nn.softmax(op.add(s, mask), -1)
        o = op.matmul(p, repeat(v))
        return op.reshape(op.permute_dims(o, [0, 2, 1, 3]), (1, rows, heads * d))

    return fused_kernel(build, [(1, heads, rows, d), (1, kv_heads, keys, d), (1, kv_heads, keys, d), (keys,)])


@pytest.mark.parametrize("host", [HOST, NATIVE], ids=["portable", "native"])
@pytest.mark.parametrize("func", [
    lambda: attention_kernel(b=1, h=4, s=96, d=32, sq=1),                 # MHA, one query row
    lambda: attention_kernel(b=2, h=3, s=80, d=16, sq=2, mask=None),      # batch 2, two rows, no mask
    lambda: gqa_decode(),                                                 # GQA 8/2 + head merge
    lambda: gqa_decode(heads=4, kv_heads=1, keys=64, d=64, rows=3),       # MQA, three rows
], ids=["mha", "batch_two_rows", "gqa", "mqa_three_rows"])
def test_numbers(func, host):
    mod = check_rule(DecodeAttentionRule(), func(), host=host)
    script = mod.script()
    assert "decode attention" in script and script.count("T.parallel") == 1


def test_kv_heads_read_in_place():
    """The GQA repeat is index arithmetic of the K/V reads: no per-query-head copy of the cache."""
    sch = DecodeAttentionRule().apply(gqa_decode(), NPU, NATIVE)
    assert "T_broadcast_to" not in sch.mod.script()


def test_many_query_rows_are_declined():
    assert DecodeAttentionRule().apply(attention_kernel(b=1, h=2, s=64, d=16, sq=64), NPU, NATIVE) is None


def test_not_attention_is_declined():
    chain = fused_kernel(lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2), [(1, 32), (32, 64), (64, 32)])
    assert DecodeAttentionRule().apply(chain, NPU, NATIVE) is None


def test_rule_table():
    assert predict_rule(GroupShape("LLGEERGL", True, rows=1, batched=True)).name == "decode-attention"
    assert predict_rule(GroupShape("LLGEERGL", True, rows=64, batched=True)).name == "attention"


def decode_step(h=2, d=16, past=24, seed=0):
    """One token through self-attention with a KV cache: x -> RMSNorm -> Q/K/V projections (GEMVs) -> new K/V
    appended to the past -> attention over past + 1 keys -> output projection + residual."""
    rng = np.random.default_rng(seed)
    n = h * d
    c = lambda *shape: relax.const((rng.standard_normal(shape) * 0.2).astype("float32"))  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, n), "float32"))
    pk = relax.Var("past_k", relax.TensorType((1, h, past, d), "float32"))
    pv = relax.Var("past_v", relax.TensorType((1, h, past, d), "float32"))

    def heads(t):
        return op.permute_dims(op.reshape(t, (1, 1, h, d)), [0, 2, 1, 3])

    with bb.function("main", [x, pk, pv]):
        with bb.dataflow():
            xn = bb.emit(op.nn.rms_norm(x, c(n), axes=[-1]))
            q, k, v = (bb.emit(heads(op.matmul(xn, c(n, n)))) for _ in range(3))
            keys = bb.emit(op.concat([pk, k], axis=2))
            vals = bb.emit(op.concat([pv, v], axis=2))
            s = op.multiply(op.matmul(q, op.permute_dims(keys, [0, 1, 3, 2])), relax.const(np.float32(d ** -0.5)))
            o = bb.emit(op.reshape(op.permute_dims(op.matmul(op.nn.softmax(s, -1), vals), [0, 2, 1, 3]), (1, 1, n)))
            y = bb.emit(op.add(op.matmul(o, c(n, n)), x))
            out = bb.emit_output(relax.Tuple([y, keys, vals]))
        bb.emit_func_output(out)
    return bb.get()


def test_decode_step_end_to_end():
    result = assert_same_numbers(decode_step())
    rules = {k["rule"] for k in result.report.kernels}
    assert {"gemv", "decode-attention"} <= rules, [(k["rule"], k["ops"]) for k in result.report.kernels]
