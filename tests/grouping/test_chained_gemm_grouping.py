"""Chained GEMMs in the grouping pass: an FFN's up-projection (+ activation, or SwiGLU's pair) and its
down-projection become one kernel when a row of the output and a panel of the intermediate fit UB; refused,
with the reason in the report, otherwise."""

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
