"""Chained GEMMs in the grouping pass: an FFN's up-projection (+ activation, or SwiGLU's pair) and its
down-projection become one kernel when a row of the output and a panel of the intermediate fit UB; refused,
with the reason in the report, otherwise. A pre-norm row norm read only by the first product(s) joins the
chain as its prologue when its row fits UB and the block's normalised rows fit L1."""

import tvm
from tvm import relax

from tests.grouping.util import build, check_equivalent
from tvm_ascendfuse.analysis.traffic import count_primfunc
from tvm_ascendfuse.grouping.cost import GroupingConfig
from tvm_ascendfuse.report import CHECK_FAILED, NOT_PROFITABLE, UB_OVERFLOW

PASS = "CostBasedFusionPass"
op = relax.op


def refusals(report, reason):
    return [r for r in report.get(PASS).not_effective if r["reason"] == reason]


def ffn(m, k, f, with_ln=True):
    def body(bb, x, w1, b1, w2, b2, g, be):
        h = bb.emit(op.nn.gelu(op.add(op.matmul(x, w1), b1)))
        y = bb.emit(op.add(op.add(op.matmul(h, w2), b2), x))
        return bb.emit(op.nn.layer_norm(y, g, be, [-1])) if with_ln else y
    return build([(m, k), (k, f), (f,), (f, k), (k,), (k,), (k,)], body)


def swiglu(m, k, f):
    def body(bb, x, wg, wu, wd):
        h = bb.emit(op.multiply(op.nn.silu(op.matmul(x, wg)), op.matmul(x, wu)))
        return bb.emit(op.add(op.matmul(h, wd), x))
    return build([(m, k), (k, f), (k, f), (f, k)], body)


def _model_matches_count(fused, report):
    prims = {g.name_hint: f for g, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    rows = report.sections["grouping"]["groups"]
    assert rows
    for r in rows:
        counted = count_primfunc(prims[r["name"]]).gm_bytes
        assert abs(r["modeled_gm_bytes"] - counted) <= 0.10 * counted, (r["name"], r["modeled_gm_bytes"], counted)


def test_ffn_with_layernorm_is_one_kernel():
    fused, report, before, after = check_equivalent(ffn(16, 32, 64))
    assert after == 1 < before
    _model_matches_count(fused, report)
    # the intermediate (16 x 64) is not a parameter of the kernel: its bytes are gone from the count
    [prim] = [f for _, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert all(tuple(int(d) for d in p.ty.shape) != (16, 64) for p in prim.params
               if isinstance(p.ty, tvm.tirx.BufferType))


def test_odd_sizes_and_no_norm():
    fused, report, before, after = check_equivalent(ffn(13, 20, 36, with_ln=False))
    assert after == 1 < before
    _model_matches_count(fused, report)


def test_swiglu_pair_then_down_projection_is_one_kernel():
    fused, report, before, after = check_equivalent(swiglu(12, 16, 40))
    assert after == 1 < before
    _model_matches_count(fused, report)


def test_refused_when_an_output_row_does_not_fit_ub():
    # 49152 fp32 output columns: one row is 192 KiB > 184 KiB usable on ascend910b
    def body(bb, x, w1, w2):
        return bb.emit(op.matmul(bb.emit(op.nn.relu(op.matmul(x, w1))), w2))
    _, report, _, after = check_equivalent(build([(2, 8), (8, 16), (16, 49152)], body))
    assert after == 2
    [r] = [r for r in refusals(report, UB_OVERFLOW) if "chained GEMM" in r.get("what", "")]
    assert r["needed_bytes"] > r["available_bytes"] == 184 * 1024


def test_switched_off_by_config():
    _, report, _, after = check_equivalent(ffn(16, 32, 64), config=GroupingConfig(allow_chained_gemm=False))
    assert after == 2
    assert any("switched off" in r.get("why", "") for r in refusals(report, CHECK_FAILED))


def test_not_a_chain_when_the_intermediate_is_the_weight_side():
    # w3 @ relu(x @ w1): the second product reduces over the intermediate's rows, not its columns
    def body(bb, x, w1, w3):
        return bb.emit(op.matmul(w3, bb.emit(op.nn.relu(op.matmul(x, w1)))))
    _, report, _, after = check_equivalent(build([(16, 8), (8, 24), (4, 16)], body))
    assert after == 2
    assert any("last axis" in r.get("why", "") for r in refusals(report, CHECK_FAILED))


def test_chain_refused_when_intermediate_is_small_next_to_the_weights():
    # 4 rows through two 64x64 weights: the intermediate round trip (2 KB) is 1/16 of the weight bytes that a
    # chain streams again per row block, below the 0.1 default; with the limit at 0 the same graph chains
    _, report, before, after = check_equivalent(ffn(4, 64, 64, with_ln=False))
    assert after == 2
    [r] = [r for r in refusals(report, NOT_PROFITABLE) if "saving_vs_weights" in r]
    assert r["saving_vs_weights"] == 0.0625 and r["limit"] == 0.1
    _, _, _, after = check_equivalent(ffn(4, 64, 64, with_ln=False),
                                      config=GroupingConfig(chain_min_saving_vs_weights=0.0))
    assert after == 1


# ---- norm prologue --------------------------------------------------------------------------------------

def prenorm(m, k, f):
    """h = x Wo + x; out = SwiGLU(rms_norm(h)) Wd + h: the norm's only consumers are the chain's first products,
    and the chain reads h anyway (residual)."""
    def body(bb, x, wo, g, wg, wu, wd):
        h = bb.emit(op.add(op.matmul(x, wo), x))
        n = bb.emit(op.nn.rms_norm(h, g))
        a = bb.emit(op.multiply(op.nn.silu(op.matmul(n, wg)), op.matmul(n, wu)))
        return bb.emit(op.add(op.matmul(a, wd), h))
    return build([(m, k), (k, k), (k,), (k, f), (k, f), (f, k)], body)


def _groups(report):
    return report.sections["grouping"]["groups"]


def test_norm_in_front_of_the_chain_joins_it():
    fused, report, before, after = check_equivalent(prenorm(13, 32, 88))
    assert after == 2 < before
    _model_matches_count(fused, report)
    [chain] = [g for g in _groups(report) if "chain" in g]
    assert chain["ops"][0] == "rms_norm" and chain["chain"]["norm_prologue"] == "rms_norm"
    # the normalised row block is recorded: rows per block, its L1 bytes, the UB it needs
    c = chain["chain"]
    assert c["normalised_rows_l1_bytes"] == c["rows_per_block"] * 32 * 4 <= c["l1_available_bytes"]
    assert 0 < c["ub_bytes"] <= c["ub_available_bytes"] and "being normalised" in c["ub_holds"]
    # the kernel in front writes h only: no kernel has the normalised tensor as an output
    prims = [f for _, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert [sum(1 for b in count_primfunc(p).write_bytes if b) for p in prims] == [1, 1]


def test_post_norm_residual_keeps_the_norm_out_of_the_chain():
    # n = rms_norm(x) is both the chain's input and its residual (post-norm, W3's shape): not a prologue
    def body(bb, x, g, wg, wu, wd):
        n = bb.emit(op.nn.rms_norm(x, g))
        a = bb.emit(op.multiply(op.nn.silu(op.matmul(n, wg)), op.matmul(n, wu)))
        return bb.emit(op.add(op.matmul(a, wd), n))
    _, report, _, after = check_equivalent(build([(13, 32), (32,), (32, 88), (32, 88), (88, 32)], body))
    assert after == 2
    [chain] = [g for g in _groups(report) if "chain" in g]
    assert "rms_norm" not in chain["ops"] and "norm_prologue" not in chain["chain"]
    assert any("also used outside" in r.get("why", "") for r in refusals(report, CHECK_FAILED))


def test_norm_prologue_refused_when_its_row_does_not_fit_ub():
    # a 16384-wide input row: the row being normalised (double-buffered) and its normalised row take
    # 3 x 64 KiB of UB > 184 KiB; the chain itself still forms, the norm stays a kernel of its own
    def body(bb, x, g, w1, w2):
        n = bb.emit(op.nn.rms_norm(x, g))
        return bb.emit(op.matmul(bb.emit(op.nn.relu(op.matmul(n, w1))), w2))
    cfg = GroupingConfig(chain_min_saving_vs_weights=0.0)      # a chain in spite of its large weights
    _, report, _, after = check_equivalent(build([(64, 16384), (16384,), (16384, 256), (256, 8)], body), config=cfg)
    assert after == 2
    [chain] = [g for g in _groups(report) if "chain" in g]
    assert "norm_prologue" not in chain["chain"]
    [r] = [r for r in refusals(report, UB_OVERFLOW) if "being normalised" in r.get("what", "")]
    assert r["needed_bytes"] > r["available_bytes"] == 184 * 1024


def _workload_groups(model):
    from tvm_ascendfuse.frontend import import_onnx
    from tvm_ascendfuse.pipeline import graph_fusion_phase, ub_fusion_phase
    from tvm_ascendfuse.report import FusionReport
    from tvm_ascendfuse.switches import resolve_switches
    from tvm_ascendfuse.target import get_target

    # the NPU model's structure: the host's cost of a chain (tested apart) left out
    npu, report, sw = get_target("ascend910b"), FusionReport(), resolve_switches({"ChainedGemmHostCost": "off"})
    host = npu.host_target(portable=True)
    with host:
        mod = tvm.transform.Sequential(graph_fusion_phase(npu, sw, report))(import_onnx(model))
        tvm.transform.Sequential(ub_fusion_phase(npu, sw, report, host))(mod)
    return _groups(report)


def test_w7_ffn_norm_is_inside_the_chain():
    """LLaMA (pre-norm): the FFN's RMSNorm is the chain's prologue, so the o-projection kernel in front
    writes only h (no multi-output group is left)."""
    from tvm_ascendfuse.workloads import llama_block

    groups = _workload_groups(llama_block(seq=13, hidden=64, heads=4, ffn=176))
    [chain] = [g for g in groups if "chain" in g and "kind" not in g["chain"]]     # not attention + projection
    assert "rms_norm" in chain["ops"] and chain["chain"].get("norm_prologue") == "rms_norm"
    assert all(g["outputs"] == 1 for g in groups)


def test_w3_post_ln_chain_unchanged():
    """BERT (post-LN): its LayerNorm output is also the FFN's residual; the chain has no norm prologue."""
    from tvm_ascendfuse.workloads import bert_layer

    groups = _workload_groups(bert_layer(seq=16, hidden=64, heads=4, ffn=128))
    [chain] = [g for g in groups if "chain" in g and "kind" not in g["chain"]]
    assert "norm_prologue" not in chain["chain"]


# ---- the host's cost of a chain (GroupingConfig.chain_host_cores) ------------------------------------------
def _host_refusal(report):
    return [r for r in refusals(report, CHECK_FAILED) if "on this host" in r.get("why", "")]


def test_host_one_row_block_per_core_keeps_the_chain_with_its_numbers():
    """16 rows on 2 cores: one block of 8 rows per core, no weight streamed twice; the chain is kept and
    the group's report row carries the host's numbers."""
    fused, report, before, after = check_equivalent(ffn(16, 32, 64), config=GroupingConfig(chain_host_cores=2))
    assert after == 1 < before and not _host_refusal(report)
    [row] = [g for g in report.sections["grouping"]["groups"] if "chain" in g]
    assert row["chain"]["host"] == {
        "host_cores": 2, "rows_per_block": 8, "row_blocks": 2, "partial_last_block": False,
        "restreamed_weight_bytes": 0, "saved_intermediate_bytes": 2 * 16 * 64 * 4, "chain_on_host": True}


def test_host_refuses_weights_restreamed_beyond_the_saving():
    """512 rows on 2 cores: the UB's row block (128 rows) makes 4 blocks, two more than cores, each
    streaming both weights again; their bytes exceed the intermediate's round trip: two GEMM kernels, the
    numbers in the refusal. The NPU model alone (no host cores) chains the same graph."""
    mod = ffn(512, 384, 1024, with_ln=False)
    _, report, _, after = check_equivalent(mod, config=GroupingConfig(chain_host_cores=2))
    assert after == 2
    [r] = _host_refusal(report)
    assert "B of weights re-streamed" in r["why"] and "NPU model alone would chain" in r["why"], r
    _, npu_report, _, npu_after = check_equivalent(mod)
    assert npu_after == 1 and not _host_refusal(npu_report)


def test_host_refuses_a_partial_last_row_block():
    """13 rows on 2 cores: blocks of 6 rows leave a partial block (its predicate lands in the micro-kernel,
    measured 2.7x slower at ViT's 197 rows): two GEMM kernels."""
    _, report, _, after = check_equivalent(ffn(13, 20, 36, with_ln=False), config=GroupingConfig(chain_host_cores=2))
    assert after == 2
    [r] = _host_refusal(report)
    assert "partial last row block (13 rows, blocks of 6)" in r["why"], r


def test_host_row_block_is_the_rules():
    """The row block the host cost assumes is the one the chained-GEMM rule schedules (pipeline build)."""
    import re

    from tvm_ascendfuse.api import compile_model
    from tvm_ascendfuse.grouping.chain import Chain
    from tvm_ascendfuse.target import get_target

    for rows, k, f in ((96, 32, 64), (64, 48, 256), (200, 16, 32)):
        res = compile_model(ffn(rows, k, f, with_ln=False), switches={"ChainedGemmHostCost": "off"})
        cores = int(res.host_target.attrs["num-cores"])
        want = Chain((0,), 1, 2, frozenset(), rows, k, f, k, False).host_cost(cores, 4, get_target("ascend910b"))
        notes = [n for ns in res.report.sections["schedule_notes"].values() for n in ns if "row block" in n]
        [got] = [int(re.search(r"row block (\d+) rows", n).group(1)) for n in notes]
        assert got == want["rows_per_block"], (rows, got, want)


def test_chain_with_two_outputs_after_the_second_product_refused():
    # the residual sum is an output, and so is a mean over it (a channel mean of a channels-first
    # LayerNorm2d): the chained kernel writes one output, so the mean is not taken into the chain
    def body(bb, x, w1, w2):
        y = bb.emit(op.add(op.matmul(bb.emit(op.nn.relu(op.matmul(x, w1))), w2), x))
        m = bb.emit(op.mean(y, axis=[1], keepdims=True))
        return relax.Tuple([y, m])
    _, report, _, after = check_equivalent(build([(13, 32), (32, 96), (96, 32)], body))
    assert after >= 2
    for g in _groups(report):
        if "chain" in g:
            assert "mean" not in g["ops"], g["ops"]
    assert any("more than one output after the second product" in r.get("why", "")
               for r in refusals(report, CHECK_FAILED))
