"""AttentionProjectionRule: attention (heads cut out of a merged QKV) -> head merge -> output projection
(+ residual, + row norm) in one kernel, one head per panel of the projection; against the unscheduled kernel,
and through the pipeline (grouping, pre-packed weight, capacity)."""

import dataclasses

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op

from tests.helpers import assert_same_numbers, assert_scheduled_within_capacity, kernel_count
from tvm_ascendfuse.schedule.attention_projection import AttentionProjectionRule
from tvm_ascendfuse.target import get_target

from .kernels import HOST, NATIVE, NPU, attention_kernel, causal_mask, check_rule, fused_kernel


def _heads(t, s, h, d):
    return op.permute_dims(op.reshape(t, (1, s, h, d)), [0, 2, 1, 3])


def attention_block(s, h, d, n2=None, mask=True, norm=False):
    """(shapes, build): qkv [1, s, 3hd] -> causal attention -> heads merged -> · Wo (+ x, + LayerNorm)."""
    n1, n2 = h * d, n2 or h * d

    def build(qkv, wo, x, *rest):
        q, k, v = (_heads(op.strided_slice(qkv, [2], [i * n1], [(i + 1) * n1]), s, h, d) for i in range(3))
        sc = op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                         relax.const(np.float32(1 / np.sqrt(d))))
        if mask:
            sc = op.add(sc, rest[0])
        o = op.reshape(op.permute_dims(op.matmul(op.nn.softmax(sc, -1), v), [0, 2, 1, 3]), (1, s, n1))
        y = op.add(op.matmul(o, wo), x)
        if norm:
            y = op.nn.layer_norm(y, rest[-2], rest[-1], [-1])
        return y

    shapes = [(1, s, 3 * n1), (n1, n2), (1, s, n2)] + ([(1, 1, s, s)] if mask else [])
    shapes += [(n2,), (n2,)] if norm else []
    return shapes, build


@pytest.mark.parametrize("s,h,d,n2", [(32, 2, 16, None), (20, 3, 8, 40), (9, 2, 8, None)])
def test_matches_unscheduled(s, h, d, n2):
    shapes, build = attention_block(s, h, d, n2)
    _, note = check_rule(AttentionProjectionRule(), fused_kernel(build, shapes), fixed={3: causal_mask(s, s)},
                         with_note=True)
    assert note and f"{h} heads of {d}" in note, note


def query_block(s, h, d):
    """(shapes, build): x -> RMSNorm -> · Wq (the query) with K|V given merged -> causal attention -> · Wo + x."""
    n = h * d

    def build(x, g, wq, kv, mask, wo):
        q = _heads(op.matmul(op.nn.rms_norm(x, g), wq), s, h, d)
        k, v = (_heads(op.strided_slice(kv, [2], [i * n], [(i + 1) * n]), s, h, d) for i in range(2))
        sc = op.add(op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                                relax.const(np.float32(1 / np.sqrt(d)))), mask)
        o = op.reshape(op.permute_dims(op.matmul(op.nn.softmax(sc, -1), v), [0, 2, 1, 3]), (1, s, n))
        return op.add(op.matmul(o, wo), x)

    return [(1, s, n), (n,), (n, n), (1, s, 2 * n), (1, 1, s, s), (n, n)], build


@pytest.mark.parametrize("s,h,d", [(32, 2, 16), (12, 3, 8)])
def test_query_projection_with_norm_prologue_matches_unscheduled(s, h, d):
    """The query rows computed per head from the block's normalised rows (staged once per row block in L1)."""
    shapes, build = query_block(s, h, d)
    rule = AttentionProjectionRule()
    check_rule(rule, fused_kernel(build, shapes), fixed={4: causal_mask(s, s)})
    scopes = [str(b.scope()) for b in rule.apply(fused_kernel(build, shapes), NPU, HOST).mod["main"].body.block
              .alloc_buffers]
    assert scopes.count("local.L1") == 2, scopes          # the normalised rows and the Kᵀ panel


def test_query_projection_with_bias_and_no_norm_matches_unscheduled():
    """BERT's form: q = x·Wq + bq straight from the layer input (which the residual reads anyway)."""
    s, h, d = 16, 2, 8
    n = h * d

    def build(x, wq, bq, kv, wo):
        q = _heads(op.add(op.matmul(x, wq), bq), s, h, d)
        k, v = (_heads(op.strided_slice(kv, [2], [i * n], [(i + 1) * n]), s, h, d) for i in range(2))
        p = op.nn.softmax(op.divide(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), relax.const(np.float32(3))), -1)
        o = op.reshape(op.permute_dims(op.matmul(p, v), [0, 2, 1, 3]), (1, s, n))
        return op.add(op.matmul(o, wo), x)

    rule = AttentionProjectionRule()
    check_rule(rule, fused_kernel(build, [(1, s, n), (n, n), (n,), (1, s, 2 * n), (n, n)]))


def test_query_projection_avx512_widths():
    shapes, build = query_block(64, 4, 16)
    check_rule(AttentionProjectionRule(), fused_kernel(build, shapes), host=NATIVE, fixed={4: causal_mask(64, 64)})


@pytest.mark.parametrize("b,s", [(2, 6), (3, 6)])
def test_batch_row_blocks_stay_within_one_sequence(b, s):
    """Batch > 1: the rows are batch x query rows; a row block never straddles two sequences (3 x 6 rows on two
    cores would otherwise get blocks of 9)."""
    h, d = 2, 8
    n = h * d

    def heads(t):
        return op.permute_dims(op.reshape(t, (b, s, h, d)), [0, 2, 1, 3])

    def build(qkv, wo, x, mask):
        q, k, v = (heads(op.strided_slice(qkv, [2], [i * n], [(i + 1) * n])) for i in range(3))
        sc = op.add(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), mask)
        o = op.reshape(op.permute_dims(op.matmul(op.nn.softmax(sc, -1), v), [0, 2, 1, 3]), (b, s, n))
        return op.add(op.matmul(o, wo), x)

    _, note = check_rule(AttentionProjectionRule(), fused_kernel(build, [(b, s, 3 * n), (n, n), (b, s, n), (1, 1, s, s)]),
                         fixed={3: causal_mask(s, s)}, with_note=True)
    m = int(note.split("query rows per block ")[1].split(",")[0])
    assert s % m == 0, note


def test_row_norm_after_the_projection():
    """Post-LN (BERT): the LayerNorm's row statistics computed from the accumulator rows, per row block."""
    shapes, build = attention_block(16, 2, 8, mask=False, norm=True)
    check_rule(AttentionProjectionRule(), fused_kernel(build, shapes))


def test_avx512_widths():
    shapes, build = attention_block(64, 4, 16)
    check_rule(AttentionProjectionRule(), fused_kernel(build, shapes), host=NATIVE, fixed={3: causal_mask(64, 64)})


def test_everything_on_chip_and_row_block_capped_by_l0c():
    """Every intermediate is an on-chip buffer (the accumulator rows in L0C, Kᵀ in L1, the rest in UB); a
    small L0C caps the query rows per block, same numbers."""
    shapes, build = attention_block(32, 2, 16)
    sch = AttentionProjectionRule().apply(fused_kernel(build, shapes), NPU, HOST)
    scopes = {b.name: str(b.scope()) for b in sch.mod["main"].body.block.alloc_buffers}
    assert all(s.startswith("local.") for s in scopes.values()), scopes
    assert {"local.UB", "local.L1", "local.L0C"} <= set(scopes.values()), scopes
    small = dataclasses.replace(NPU, l0c_bytes=4 * 32 * 4)
    _, note = check_rule(AttentionProjectionRule(), fused_kernel(build, shapes), target=small,
                         fixed={3: causal_mask(32, 32)}, with_note=True)
    assert "query rows per block 4" in note, note


def test_declines_plain_attention_and_a_chained_ffn():
    check_rule(AttentionProjectionRule(), attention_kernel(h=2, s=16, d=8), expect=False)
    ffn = fused_kernel(lambda x, a, b: op.matmul(op.nn.relu(op.matmul(x, a)), b), [(8, 16), (16, 32), (32, 16)])
    check_rule(AttentionProjectionRule(), ffn, expect=False)


# ---- through the pipeline ------------------------------------------------------------------------------------

def _decoder_attention(s, h, d, seed=0, extra_output=False):
    """x -> RMSNorm -> merged QKV projection -> causal attention -> · Wo + x, weights as constants."""
    rng = np.random.default_rng(seed)
    n = h * d
    c = lambda *shape: relax.const((rng.standard_normal(shape) * 0.2).astype("float32"))
    mask = relax.const(causal_mask(s, s))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, s, n), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            qkv = bb.emit(op.matmul(op.nn.rms_norm(x, relax.const(np.ones(n, "float32"))), c(n, 3 * n)))
            q, k, v = (bb.emit(_heads(op.strided_slice(qkv, [2], [i * n], [(i + 1) * n]), s, h, d)) for i in range(3))
            sc = op.add(op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                                    relax.const(np.float32(1 / np.sqrt(d)))), mask)
            o = bb.emit(op.reshape(op.permute_dims(op.matmul(op.nn.softmax(sc, -1), v), [0, 2, 1, 3]), (1, s, n)))
            y = bb.emit(op.add(op.matmul(o, c(n, n)), x))
            out = bb.emit_output(relax.Tuple([y, o]) if extra_output else y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target", ["ascend910b", "ascend310p"])
@pytest.mark.parametrize("s,h,d", [(32, 4, 16), (24, 2, 32)])
def test_pipeline_attention_and_projection_in_one_kernel(target, s, h, d):
    result = assert_same_numbers(_decoder_attention(s, h, d), target=target)
    assert kernel_count(result) == 2
    assert "attention-projection" in result.report.sections["schedules"].values()
    groups = result.report.sections["grouping"]["groups"]
    assert any(g.get("chain", {}).get("kind") == "attention + output projection" for g in groups), groups
    assert_scheduled_within_capacity(result, target)


@pytest.mark.parametrize("target", ["ascend910b", "ascend310p"])
def test_llama_query_projection_inside_and_kv_merged(target):
    """LLaMA block: the sibling merge leaves the query apart (its own RMSNorm copy), K|V stay merged; the
    attention kernel computes the query rows itself, so its kernel reads x, Wq, K|V, the mask and Wo, and
    Q is never written: three kernels in all (K|V, attention + projections, chained FFN)."""
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.workloads import llama_block

    result = assert_same_numbers(import_onnx(llama_block(seq=16, hidden=64, heads=4, ffn=96)), target=target)
    assert kernel_count(result) == 3
    merged = result.report.get("MatMulSiblingMergeFusionPass")
    assert merged.effect_times == 1
    groups = result.report.sections["grouping"]["groups"]
    [att] = [g for g in groups if g.get("chain", {}).get("kind") == "attention + output projection"]
    assert att["chain"]["query_norm"] == "rms_norm" and "query_projection" in att["chain"], att
    off = assert_same_numbers(import_onnx(llama_block(seq=16, hidden=64, heads=4, ffn=96)),
               switches={"AttentionProjectionFusionPass": "off"})
    assert kernel_count(off) == 4        # Q|K|V merged again, attention and o-projection apart


def test_bert_query_with_bias_inside_post_ln():
    """BERT (post-LN, biases, no norm in front of Q/K/V): the query with its bias computed in the attention kernel,
    which ends with the residual LayerNorm; K|V merged. Three kernels."""
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.workloads import bert_layer

    result = assert_same_numbers(import_onnx(bert_layer(seq=16, hidden=64, heads=4, ffn=128)))
    assert kernel_count(result) == 3
    [att] = [g for g in result.report.sections["grouping"]["groups"]
             if g.get("chain", {}).get("kind") == "attention + output projection"]
    assert "query_projection" in att["chain"] and "query_norm" not in att["chain"], att
    assert "layer_norm" in att["ops"]


def test_switch_off_and_attention_output_used_elsewhere_are_reported():
    off = assert_same_numbers(_decoder_attention(16, 2, 8), switches={"AttentionProjectionFusionPass": "off"})
    assert kernel_count(off) == 3
    why = [r.get("why", "") for r in off.report.get("CostBasedFusionPass").not_effective]
    assert any("output projection in one kernel (switched off)" in w for w in why), why
    both = assert_same_numbers(_decoder_attention(16, 2, 8, extra_output=True))
    assert "attention-projection" not in both.report.sections["schedules"].values()
    why = [r.get("why", "") for r in both.report.get("CostBasedFusionPass").not_effective]
    assert any("also used outside the kernel" in w for w in why), why


def _kv_projected_attention(s, h, d, seed=0):
    """Q given, K = x·Wk computed in the graph (a key projection in front of the attention), · Wo + x."""
    rng = np.random.default_rng(seed)
    n = h * d
    c = lambda *shape: relax.const((rng.standard_normal(shape) * 0.2).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, s, n), "float32"))
    q = relax.Var("q", relax.TensorType((1, h, s, d), "float32"))
    with bb.function("main", [x, q]):
        with bb.dataflow():
            k = bb.emit(_heads(op.matmul(x, c(n, n)), s, h, d))
            v = bb.emit(_heads(x, s, h, d))
            p = op.nn.softmax(op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                                          relax.const(np.float32(1 / np.sqrt(d)))), -1)
            o = bb.emit(op.reshape(op.permute_dims(op.matmul(p, v), [0, 2, 1, 3]), (1, s, n)))
            out = bb.emit_output(op.add(op.matmul(o, c(n, n)), x))
        bb.emit_func_output(out)
    return bb.get()


def test_a_key_projection_stays_outside_and_is_reported():
    """A product in front of the attention that feeds Kᵀ (not the query rows) cannot be computed per block of
    query rows: every block reads all keys. The merge is refused with that reason; numbers unchanged."""
    result = assert_same_numbers(_kv_projected_attention(16, 2, 8))
    why = [r.get("why", "") for r in result.report.get("CostBasedFusionPass").not_effective]
    assert any("not the attention's query projection" in w for w in why), why
    assert "attention-projection" in result.report.sections["schedules"].values()


def test_k_and_v_panels_over_l1_refuse_the_merge_with_the_bytes():
    """A target whose L1 cannot hold one head's K and V panels: the attention and the projection stay two
    kernels and the refusal names L1 and the bytes."""
    small = dataclasses.replace(get_target("ascend910b"), name="small_l1", l1_bytes=192 * 1024)
    result = assert_same_numbers(_decoder_attention(256, 2, 64), target=small)
    assert "attention-projection" not in result.report.sections["schedules"].values()
    refused = [r for r in result.report.get("CostBasedFusionPass").not_effective if r.get("scope") == "L1"]
    assert refused and refused[0]["needed_bytes"] > refused[0]["available_bytes"], refused


def test_chained_gemms_off_keeps_qkv_merged_and_every_kernel_scheduled():
    """With chained GEMMs off (the README's CPU advice) the FFN's norm stays with the o-projection, which then
    writes h and norm(h): the attention kernel (one output) refuses it with that reason, the query is not
    left apart for nothing (Q|K|V merged: 5 kernels), and no kernel falls back to the generic schedule."""
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.workloads import llama_block

    # at this size (as at W7's) the grouping puts the FFN's norm with the o-projection; smaller blocks leave
    # the norm alone and would not tell whether the query was left apart for nothing
    result = assert_same_numbers(import_onnx(llama_block(seq=32, hidden=128, heads=4, ffn=256)),
                                 switches={"ChainedGemmFusionPass": "off"})
    assert kernel_count(result) == 5
    assert "fallback" not in result.report.sections["schedules"].values(), result.report.sections["schedules"]
    why = [r.get("why", "") for r in result.report.get("CostBasedFusionPass").not_effective]
    assert any("more than one output" in w for w in why), why


@pytest.mark.parametrize("s,b", [(13, 1), (37, 2), (37, 1)])
def test_prime_sequence_gets_blocks_of_several_rows_with_a_short_last_one(s, b):
    """A prime number of query rows (ViT's 197): blocks of several rows, the last one short, instead of blocks
    of one row (which transposed the head's whole K panel and streamed both weights per query row); each
    block stays within one sequence."""
    h, d = 2, 8
    n = h * d

    def heads(t):
        return op.permute_dims(op.reshape(t, (b, s, h, d)), [0, 2, 1, 3])

    def build(qkv, wo, x):
        q, k, v = (heads(op.strided_slice(qkv, [2], [i * n], [(i + 1) * n])) for i in range(3))
        o = op.reshape(op.permute_dims(op.matmul(op.nn.softmax(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), -1),
                                                 v), [0, 2, 1, 3]), (b, s, n))
        return op.add(op.matmul(o, wo), x)

    small = dataclasses.replace(NPU, l0c_bytes=4 * n * 8)     # at most 8 accumulator rows: several blocks
    _, note = check_rule(AttentionProjectionRule(), fused_kernel(build, [(b, s, 3 * n), (n, n), (b, s, n)]),
                         target=small, with_note=True)
    m = int(note.split("query rows per block ")[1].split(",")[0])
    assert 1 < m <= 8 and s % m, note


def test_query_row_block_choice():
    from tvm_ascendfuse.schedule.attention_projection import query_row_block, row_block_candidates

    assert query_row_block(128, 32) == 32            # a divisor: whole blocks
    assert query_row_block(197, 98) == 72            # prime: 3 blocks of 72 rows (whole 8-row tiles), the last 53
    assert query_row_block(13, 6) == 5               # shorter than a register tile: 3 balanced blocks
    assert query_row_block(198, 64) == 33            # a divisor at least half the cap
    cands = row_block_candidates(72, 197, 98)
    assert cands[0] == 72 and len(cands) == len(set(cands)) <= 12 and all(c <= 98 for c in cands)
