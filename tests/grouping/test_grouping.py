"""The grouping pass on hand-made graphs: what it fuses, what it refuses and why, and the numbers."""


import numpy as np
import tvm
from tvm import relax

from tests.grouping.util import build, check_equivalent, group, legalize
from tvm_ascendfuse.grouping.cost import GroupingConfig
from tvm_ascendfuse.grouping import CostBasedFusionPass
from tvm_ascendfuse.report import CAP_HIT, CYCLE, NOT_PROFITABLE, UB_OVERFLOW, FusionReport
from tests.helpers import assert_close

PASS = "CostBasedFusionPass"


def refusals(report, reason):
    return [r for r in report.get(PASS).not_effective if r["reason"] == reason]


def _mm_softmaxish(n):
    def body(bb, x, w, b):
        r = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
        s = bb.emit(relax.op.sum(r, axis=[1], keepdims=True))
        return relax.Tuple([bb.emit(relax.op.permute_dims(relax.op.divide(r, s), [1, 0])), r])
    return build([(4, 64), (64, n), (n,)], body)


def test_matmul_epilogue_with_row_reduction_when_row_block_fits_l0c():
    fused, report, before, after = check_equivalent(_mm_softmaxish(32))
    assert (before, after) == (6, 1)
    rows = report.sections["grouping"]["groups"]
    assert rows[0]["outputs"] == 2            # r is also a model output: multi-output group
    assert all(r["modeled_time_us"] < r["modeled_time_us_unfused"] for r in rows)


def test_matmul_epilogue_and_long_row_reduction_two_kernels():
    # a 4096-element row block of 16 fp32 rows (256 KiB) does not fit L0C (128 KiB): reduction stays apart
    fused, report, before, after = check_equivalent(_mm_softmaxish(4096))
    assert (before, after) == (6, 2)
    names = sorted(g.name_hint for g, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc))
    assert names == ["fused_matmul_add_relu", "fused_sum_divide_transpose"]
    assert any("exceeds L0C" in r.get("why", "") for r in report.get(PASS).not_effective)


def test_ub_overflow_refused_with_bytes():
    def body(bb, x):   # max over a 256 KiB row, then the row epilogue: the row must stay in UB
        return bb.emit(relax.op.subtract(x, relax.op.max(x, axis=[-1], keepdims=True)))
    fused, report, before, after = check_equivalent(build([(2, 65536)], body))
    assert before == after == 2
    [r] = refusals(report, UB_OVERFLOW)
    assert r["needed_bytes"] > r["available_bytes"] == 184 * 1024
    # the same graph with a short row fuses
    fused, report, before, after = check_equivalent(build([(2, 1024)], body))
    assert (before, after) == (2, 1)


def _fanout(k):
    def body(bb, x, y):
        p = bb.emit(relax.op.add(x, y))
        ops = [relax.op.sum, relax.op.max, relax.op.min, relax.op.mean][:k]
        return relax.Tuple([bb.emit(o(p, axis=[-1], keepdims=True)) for o in ops])
    return body


SINGLE_OUTPUT = GroupingConfig(allow_siblings=False, allow_multi_output=False)


def test_duplication_refused_when_recompute_costs_more():
    # 4 consumers each re-reading both 8 MiB inputs cost more than writing+reading the sum once
    shape = (1024, 2048)
    _, report, _ = group(build([shape, shape], _fanout(4)), config=SINGLE_OUTPUT)
    [r] = [r for r in refusals(report, NOT_PROFITABLE) if r["kind"] == "duplicate"]
    assert r["copies"] == 4 and r["modeled_gain_us"] < 0
    assert r["modeled_us_fused"] > r["modeled_us_unfused"]


def test_duplication_taken_when_it_pays():
    fused, report, before, after = check_equivalent(build([(64, 64), (64, 64)], _fanout(2)), config=SINGLE_OUTPUT)
    assert (before, after) == (3, 2)
    assert report.get(PASS).effect_times == 1
    assert all(n.startswith("fused_add_") for n in (g.name_hint for g, f in fused.functions.items()
                                                      if isinstance(f, tvm.tirx.PrimFunc)))


def test_multi_output_and_sibling_merge_one_kernel():
    def body(bb, x, y):     # add -> exp and add -> relu, both outputs: one streaming kernel with two outputs
        p = bb.emit(relax.op.add(x, y))
        return relax.Tuple([bb.emit(relax.op.exp(p)), bb.emit(relax.op.nn.relu(p))])
    fused, report, before, after = check_equivalent(build([(64, 64), (64, 64)], body))
    assert (before, after) == (3, 1)


def test_two_reductions_of_one_sum_stay_apart():
    # add -> sum and add -> max as one kernel would have two reduction outputs, which only the fallback rule
    # schedules (the reduction rule places every block at the rows of one output): the add is copied into
    # each reduction instead (test_schedulable.py); without the rule table the cost model makes one kernel
    fused, report, before, after = check_equivalent(build([(64, 64), (64, 64)], _fanout(2)))
    assert (before, after) == (3, 2)
    _, _, _, after_off = check_equivalent(build([(64, 64), (64, 64)], _fanout(2)),
                                          config=GroupingConfig(schedulable_only=False))
    assert after_off == 1


def test_cycle_is_refused_and_reported():
    def body(bb, x):   # relu -> cumsum (not a call_tir) -> add, and relu -> add directly
        p = bb.emit(relax.op.nn.relu(x))
        return bb.emit(relax.op.add(p, bb.emit(relax.op.cumsum(p, axis=1))))
    fused, report, before, after = check_equivalent(build([(8, 16)], body))
    assert before == after
    [r] = refusals(report, CYCLE)
    assert r["where"] == "relu -> add"


def test_caps_are_configurable_and_reported():
    def body(bb, x):
        for _ in range(6):
            x = bb.emit(relax.op.tanh(x))
        return x
    mod = build([(16, 16)], body)
    _, _, before, after = check_equivalent(mod)
    assert (before, after) == (6, 1)
    fused, report, before, after = check_equivalent(mod, config=GroupingConfig(max_ops=3))
    assert before == 6 and after in (2, 3)   # greedy pairs first; no group exceeds the cap
    assert all(len(g["ops"]) <= 3 for g in report.sections["grouping"]["groups"])
    assert refusals(report, CAP_HIT)[0]["limit"] == 3


def test_conv_bias_relu_residual_one_kernel():
    def body(bb, x, w):
        c = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
        b = relax.const(np.linspace(-1, 1, 8).reshape(1, 8, 1, 1).astype("float32"))
        return bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.relu(relax.op.add(c, b)), x)))
    _, report, before, after = check_equivalent(build([(1, 8, 8, 8), (8, 8, 3, 3)], body))
    assert (before, after) == (5, 1)


def test_switch_is_registered_as_ub_fusion():
    from tvm_ascendfuse.switches import UB_FUSION, FusionSwitches, known_switches
    assert known_switches()[PASS].category == UB_FUSION
    assert not FusionSwitches.from_flat(f"{PASS}:off").is_on(PASS)
    # (the pipeline falls back to FuseOps when it is off: tests/grouping/test_pipeline_grouping.py)


def test_symbolic_dim_uses_upper_bound_or_records_assumption():
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.relu(relax.op.exp(x)))
        bb.emit_func_output(o)
    mod = bb.get()
    report = FusionReport()
    CostBasedFusionPass("ascend910b", report)(legalize(mod))
    assert any("assumed" in a for a in report.sections["grouping"]["assumptions"])
    bounded = mod.clone() if hasattr(mod, "clone") else mod
    bounded["main"] = mod["main"].with_attr("tir_var_upper_bound", {"n": 64})
    report = FusionReport()
    out = CostBasedFusionPass("ascend910b", report)(legalize(bounded))
    assert report.sections["grouping"]["assumptions"] == []
    assert report.get(PASS).effect_times == 1
    fused = relax.transform.FuseTIR()(out)
    ex = tvm.compile(fused, target="llvm")
    xin = np.random.default_rng(0).standard_normal((5, 32)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xin)).numpy()
    assert_close(got, np.maximum(np.exp(xin), 0), rtol=1e-5)
