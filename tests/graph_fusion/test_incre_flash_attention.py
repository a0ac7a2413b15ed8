"""IncreFlashAttentionFusionPass: a decode attention over a symbolic key count becomes one flash-decoding kernel
(scheduled by the flash-decode rule), agreeing with numpy at key counts around the chunk size, with masks
broadcast per head or over every head, grouped-query heads stacked as rows, and masked-out keys."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.graph_fusion.common import ops, run_pass
from tests.graph_fusion.test_grouped_query_matmul import _repeat
from tests.helpers import assert_close, compile_ours, run_vm
from tvm_ascendfuse.flash_decode import CHUNK
from tvm_ascendfuse.graph_fusion import GroupedQueryMatmulFusionPass, IncreFlashAttentionFusionPass as P

LOWEST = np.finfo(np.float32).min


def decode_attention(heads=4, kv=4, rows=1, d=16, keys=None, mask="keys", scale_op="multiply", scale_first=True):
    """``softmax(q · kᵀ ∘ scale (+ mask)) · v`` over ``keys`` keys (None: a symbolic count ``n``); ``kv < heads``
    repeats K and V as transformers' repeat_kv does; ``mask``: None, "keys" (1, 1, 1, n) or "heads"
    (1, heads, rows, n)."""
    n = tvm.tirx.Var("n", "int64") if keys is None else keys
    g = heads // kv
    bb = relax.BlockBuilder()
    params = [relax.Var("q", relax.TensorType((1, heads, rows, d), "float32")),
              relax.Var("k", relax.TensorType((1, kv, n, d), "float32")),
              relax.Var("v", relax.TensorType((1, kv, n, d), "float32"))]
    if mask is not None:
        shape = (1, 1, 1, n) if mask == "keys" else (1, heads, rows, n)
        params.append(relax.Var("mask", relax.TensorType(shape, "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            q, k, v = params[:3]
            if g > 1:
                k, v = _repeat(bb, k, kv, g, n, d), _repeat(bb, v, kv, g, n, d)
            s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            factor = d ** -0.5 if scale_op == "multiply" else d ** 0.5
            scaled = (lambda t: bb.emit(getattr(relax.op, scale_op)(t, relax.const(factor, "float32"))))
            if scale_first:
                s = scaled(s)
            if mask is not None:
                s = bb.emit(relax.op.add(s, params[3]))
            if not scale_first:
                s = scaled(s)
            p = bb.emit(relax.op.nn.softmax(s, axis=-1))
            out = bb.emit_output(relax.op.matmul(p, v))
        bb.emit_func_output(out)
    return bb.get()


def reference(inputs, heads, kv, d, scale_first=True):
    q, k, v = (x.astype("float64") for x in inputs[:3])
    g = heads // kv
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(k, -1, -2)
    factor = d ** -0.5                  # the module multiplies by 1/sqrt(d) or divides by sqrt(d)
    if scale_first:
        s = s * factor
    if len(inputs) > 3:
        s = s + inputs[3]
    if not scale_first:
        s = s * factor
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def _inputs(heads, kv, rows, d, keys, mask, seed):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(s).astype("float32") for s in ((1, heads, rows, d), (1, kv, keys, d), (1, kv, keys, d))]
    if mask is not None:
        shape = (1, 1, 1, keys) if mask == "keys" else (1, heads, rows, keys)
        out.append(np.where(rng.random(shape) < 0.3, LOWEST, 0.0).astype("float32"))
    return out


def _flash_kernels(result):
    return [k for k in result.report.kernels if k["rule"] == "flash-decode"]


# MHA (GPT-2) and GQA (LLaMA: 4 query heads per KV head), a mask per head, three query rows (draft tokens),
# a divided scale after the mask
CASES = {"mha": dict(), "gqa": dict(heads=8, kv=2), "gqa_head_mask": dict(heads=8, kv=2, mask="heads"),
         "rows3": dict(heads=4, kv=2, rows=3, mask="heads"), "no_mask": dict(mask=None),
         "divide_after_mask": dict(scale_op="divide", scale_first=False)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_kernel_agrees_around_the_chunk_size(case):
    kw = {"heads": 4, "kv": 4, "rows": 1, "d": 16, "mask": "keys", **CASES[case]}
    shape_kw = {k: kw[k] for k in ("heads", "kv", "rows", "d", "mask")}
    mod = decode_attention(**kw)
    result = compile_ours(mod, portable=False)
    assert result.report.get(P.switch_name).effect_times == 1
    assert len(_flash_kernels(result)) == 1, result.report.kernels
    assert not [k for k in result.report.kernels if "softmax" in k["ops"]]
    for keys in (1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17):
        inputs = _inputs(**shape_kw, keys=keys, seed=keys)
        want = reference(inputs, kw["heads"], kw["kv"], kw["d"], kw.get("scale_first", True))
        got = run_vm(result.executable, inputs)
        got = got.reshape(want.shape)
        assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_masked_chunks_weigh_nothing_and_a_fully_masked_row_is_uniform():
    """Keys masked with -inf over a whole chunk contribute nothing (no NaN from exp(-inf - -inf)); a row masked
    everywhere with the dtype's lowest value is softmax's uniform row, as the unfused ops make it."""
    keys, heads, d = 2 * CHUNK + 5, 2, 16
    result = compile_ours(decode_attention(heads=heads, kv=heads, d=d), portable=False)
    inputs = _inputs(heads, heads, 1, d, keys, "keys", seed=3)
    inputs[3][..., :CHUNK] = -np.inf                                     # the whole first chunk
    got = run_vm(result.executable, inputs)
    assert np.isfinite(got).all()
    assert_close(got, reference(inputs, heads, heads, d), rtol=1e-4, atol=1e-5)
    inputs[3][:] = LOWEST
    got = run_vm(result.executable, inputs)
    assert_close(got, np.broadcast_to(inputs[2].mean(axis=2, keepdims=True), got.shape), rtol=1e-4, atol=1e-5)


def test_grouped_heads_are_rewritten_after_their_stacking():
    mod = GroupedQueryMatmulFusionPass()(decode_attention(heads=8, kv=2))
    out, rec = run_pass(P, mod)
    assert (rec.match_times, rec.effect_times) == (1, 1)
    assert "nn.softmax" not in ops(out) and "matmul" not in ops(out)
    assert any(isinstance(f, tvm.tirx.PrimFunc) for f in out.functions.values())


def test_static_keys_stay_with_the_attention_patterns():
    out, rec = run_pass(P, decode_attention(keys=64))
    assert rec.effect_times == 0 and "nn.softmax" in ops(out)


def test_a_prefill_over_a_symbolic_cache_is_refused_with_its_rows():
    out, rec = run_pass(P, decode_attention(heads=2, kv=2, rows=32))
    assert rec.effect_times == 0 and "nn.softmax" in ops(out)
    assert rec.not_effective and "32 query rows" in rec.not_effective[0]["failed"], rec.not_effective


def test_switched_off_keeps_the_ops_and_the_numbers():
    out, rec = run_pass(P, decode_attention(), enabled=False)
    assert rec.effect_times == 0 and "nn.softmax" in ops(out)
    result = compile_ours(decode_attention(), switches={"GraphFusion": {P.switch_name: "off"}}, portable=False)
    assert not _flash_kernels(result)
    inputs = _inputs(4, 4, 1, 16, 200, "keys", seed=1)
    assert_close(run_vm(result.executable, inputs), reference(inputs, 4, 4, 16), rtol=1e-4, atol=1e-5)
