"""GroupedQueryMatmulFusionPass: grouped-query products over a symbolic key count read each KV head once
(the query heads sharing it stacked as rows), exact, and nothing else is touched."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.graph_fusion.common import assert_same_after, ops, run_pass
from tvm_ascendfuse.graph_fusion import GroupedQueryMatmulFusionPass


def _repeat(bb, x, kv, g, n, d):
    """transformers' repeat_kv: (1, kv, n, d) -> (1, kv * g, n, d)."""
    wide = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(x, [2])), (1, kv, g, n, d)))
    return bb.emit(relax.op.reshape(wide, (1, kv * g, n, d)))


def gqa_attention(heads=8, kv=2, rows=1, d=8, keys=None):
    """softmax(q · repeat(k)ᵀ * scale) · repeat(v) over ``keys`` keys (None: a symbolic count ``n``)."""
    n = tvm.tirx.Var("n", "int64") if keys is None else keys
    g = heads // kv
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, heads, rows, d), "float32"))
    k = relax.Var("k", relax.TensorType((1, kv, n, d), "float32"))
    v = relax.Var("v", relax.TensorType((1, kv, n, d), "float32"))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(_repeat(bb, k, kv, g, n, d), [0, 1, 3, 2]))
            s = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)), relax.const(d ** -0.5, "float32")))
            p = bb.emit(relax.op.nn.softmax(s, axis=-1))
            out = bb.emit_output(relax.op.matmul(p, _repeat(bb, v, kv, g, n, d)))
        bb.emit_func_output(out)
    return bb.get()


def _inputs(heads, kv, rows, d, keys, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for s in ((1, heads, rows, d), (1, kv, keys, d), (1, kv, keys, d))]


@pytest.mark.parametrize("heads,kv,rows", [(8, 2, 1), (4, 1, 1), (6, 2, 3)])   # GQA, MQA, three query rows
def test_symbolic_keys_read_each_kv_head_once_and_agree(heads, kv, rows):
    mod = gqa_attention(heads=heads, kv=kv, rows=rows)
    out, rec = run_pass(GroupedQueryMatmulFusionPass, mod)
    assert (rec.match_times, rec.effect_times) == (2, 2)
    assert "broadcast_to" not in ops(out)            # the repeat is not materialised any more
    for keys in (1, 5, 37):
        assert_same_after(mod, out, inputs=_inputs(heads, kv, rows, 8, keys, seed=keys))


def test_static_keys_are_left_to_the_attention_kernels():
    out, rec = run_pass(GroupedQueryMatmulFusionPass, gqa_attention(keys=16))
    assert rec.effect_times == 0 and ops(out).count("broadcast_to") == 2


def test_switched_off_leaves_the_repeat():
    out, rec = run_pass(GroupedQueryMatmulFusionPass, gqa_attention(), enabled=False)
    assert rec.effect_times == 0 and ops(out).count("broadcast_to") == 2
