"""ScaledDotProductAttentionFusionPass: R.nn.attention written out as matmul / scale / mask / softmax / matmul.

Numbers are compared with TVM's own legalization of the one op (random inputs, odd sizes, every mask kind)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.graph_fusion.common import assert_refused, assert_same_after, assert_switched_off, ops, run_pass
from tvm_ascendfuse.graph_fusion import ScaledDotProductAttentionFusionPass as P


def attention(sq=5, skv=5, heads=3, dim=4, dim_v=None, causal=None, scale=None, bias=False, window=None,
              dtype="float32"):
    dim_v = dim_v or dim
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((2, sq, heads, dim), dtype))
    k = relax.Var("k", relax.TensorType((2, skv, heads, dim), dtype))
    v = relax.Var("v", relax.TensorType((2, skv, heads, dim_v), dtype))
    params = [q, k, v]
    b = None
    if bias:
        b = relax.Var("b", relax.TensorType((2, heads, sq, skv), dtype))
        params.append(b)
    with bb.function("main", params):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.attention(q, k, v, bias=b, scale=scale, causal_mask=causal,
                                              window_size=window))
            gv = bb.emit_output(relax.op.add(a, relax.const(1.0, dtype)))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("kw", [
    {},
    {"scale": 0.3},
    {"causal": "TopLeft"},
    {"causal": "BottomRight", "sq": 3, "skv": 7},
    {"causal": "TopLeft", "sq": 3, "skv": 7},
    {"bias": True, "sq": 4, "skv": 6, "dim_v": 5},
    {"bias": True, "causal": "TopLeft", "scale": 0.5},
])
def test_matches_tvm_legalization(kw):
    mod = attention(**kw)
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    names = ops(out)
    assert "nn.attention" not in names and "nn.attention_bias" not in names
    assert names.count("matmul") == 2 and "nn.softmax" in names
    assert_same_after(mod, out)


def test_causal_bias_values():
    from tvm_ascendfuse.graph_fusion.attention_op import causal_bias

    top = causal_bias(3, 5, "TopLeft", "float32")[0, 0]
    bottom = causal_bias(3, 5, "BottomRight", "float32")[0, 0]
    assert (top == 0).sum(axis=1).tolist() == [1, 2, 3]
    assert (bottom == 0).sum(axis=1).tolist() == [3, 4, 5]
    assert top.min() == np.finfo(np.float32).min


def test_refused_sliding_window_and_switch_off():
    assert_refused(P, attention(causal="TopLeft", window=2), "sliding-window")
    assert_switched_off(P, attention(), 1)
