"""Schedulability in the fusion decision: a merge whose kernel the rule table (``rule_specs.py``) would give
only the fallback rule, or a worse rule than each of its parts gets, is refused with its reason, the rules
and the kind strings; with the check switched off the cost model alone decides (and the merged kernel lands
on the rule the table said)."""

from tvm import relax
from tvm.relax import op

from tests.grouping.test_queue import _gid, _queue
from tests.grouping.util import build, check_equivalent, legalize
from tests.helpers import assert_same_numbers
from tvm_ascendfuse.grouping import queue as queue_mod
from tvm_ascendfuse.grouping.cost import GroupingConfig
from tvm_ascendfuse.grouping.queue import PRODUCER_CONSUMER
from tvm_ascendfuse.report import NO_SCHEDULE, SLOWER_SCHEDULE
from tvm_ascendfuse.rule_specs import ROWS, spec

PASS = "CostBasedFusionPass"
OFF = GroupingConfig(schedulable_only=False)


def _refusals(report, reason):
    return [r for r in report.get(PASS).not_effective if r["reason"] == reason]


def _exp_and_its_sum(bb, x):
    """exp -> sum, with the exp's value also an output: as one kernel, an elementwise output next to a row
    reduction, a form no rule but the fallback schedules (the reduction rule places every block at the rows
    of its one output)."""
    a = bb.emit(relax.op.exp(x))
    return relax.Tuple([a, bb.emit(relax.op.sum(a, axis=[1]))])


def test_merge_only_the_fallback_would_take_is_refused_with_rules():
    mod = build([(64, 64)], _exp_and_its_sum)
    fused, report, before, after = check_equivalent(mod)
    assert (before, after) == (2, 2)
    [r] = _refusals(report, NO_SCHEDULE)
    assert r["rule_fused"] == "fallback" and sorted(r["rules_parts"]) == ["elementwise", "reduction"]
    assert r["kinds_fused"] == "eR" and sorted(r["kinds_parts"]) == ["E", "R"]   # lower case: also an output
    assert r["modeled_gain_us"] > 0                     # the cost model wanted it
    assert report.sections["grouping"]["stats"][NO_SCHEDULE] == 1
    # the check is what keeps them apart: without it the cost model makes one kernel of the two
    _, report_off, _, after_off = check_equivalent(mod, config=OFF)
    assert after_off == 1 and not _refusals(report_off, NO_SCHEDULE)
    assert NO_SCHEDULE not in report_off.sections["grouping"]["stats"]


def test_pipeline_keeps_the_fallback_off_and_the_switch_turns_the_check_off():
    mod = build([(64, 64)], _exp_and_its_sum)
    on = assert_same_numbers(mod)
    assert sorted(k["rule"] for k in on.report.kernels) == ["elementwise", "reduction"]
    assert _refusals(on.report, NO_SCHEDULE)
    off = assert_same_numbers(mod, switches={"ScheduleRuleCheck": "off"})
    # the merge the check refuses: one kernel, on the fallback rule, as the table predicted
    assert [(k["rule"], k["predicted_rule"]) for k in off.report.kernels] == [("fallback", "fallback")]


def _depthwise_then_pool():
    """depthwise 3x3 conv + ReLU -> 3x3/2 max-pool: each part has a rule of its own (depthwise-conv2d, pool);
    as one kernel only the row-reduction rule takes them."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "float32"))
    w = relax.Var("w", relax.TensorType((16, 1, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(op.nn.relu(op.nn.conv2d(x, w, padding=1, groups=16)))
            out = bb.emit_output(op.nn.max_pool2d(y, 3, 2, 1))
        bb.emit_func_output(out)
    return bb.get()


def test_merge_onto_a_worse_rule_is_refused_as_slower():
    mod = _depthwise_then_pool()
    on = assert_same_numbers(mod)
    assert sorted(k["rule"] for k in on.report.kernels) == ["depthwise-conv2d", "pool"]
    [r] = _refusals(on.report, SLOWER_SCHEDULE)
    assert r["rule_fused"] == "reduction" and sorted(r["rules_parts"]) == ["depthwise-conv2d", "pool"]
    assert r["kinds_fused"] == "DEP"
    assert on.report.sections["grouping"]["stats"][SLOWER_SCHEDULE] == 1
    off = assert_same_numbers(mod, switches={"ScheduleRuleCheck": "off"})
    assert [(k["rule"], k["predicted_rule"]) for k in off.report.kernels] == [("reduction", "reduction")]


def _exp_sum():
    def body(bb, x):
        a = bb.emit(relax.op.exp(x))
        return bb.emit(relax.op.sum(a, axis=[1], keepdims=True))
    return legalize(build([(64, 64)], body))


def test_merge_onto_a_rule_as_good_as_one_parts_is_left_to_the_cost_model(monkeypatch):
    queue, graph, _ = _queue(_exp_sum())
    a, b = _gid(queue, graph, "tir_exp"), _gid(queue, graph, "sum")
    elementwise, reduction, matmul = spec("elementwise"), spec("reduction"), spec("matmul")
    monkeypatch.setattr(queue_mod, "predict_rule",
                        lambda shape: reduction if len(shape.kinds) > 1 else (matmul if "R" in shape.kinds else elementwise))
    assert queue.evaluate(PRODUCER_CONSUMER, (a, b)).merge
    # below every part's rule: refused (a fresh queue: the parts' rules are cached per group)
    monkeypatch.setattr(queue_mod, "predict_rule", lambda shape: reduction if len(shape.kinds) > 1 else matmul)
    queue, graph, _ = _queue(_exp_sum())
    d = queue.evaluate(PRODUCER_CONSUMER, (_gid(queue, graph, "tir_exp"), _gid(queue, graph, "sum")))
    assert not d.merge and d.reason == SLOWER_SCHEDULE and reduction.rank == ROWS < matmul.rank


def test_merge_the_table_takes_as_well_is_made():
    queue, graph, _ = _queue(_exp_sum())
    d = queue.evaluate(PRODUCER_CONSUMER, (_gid(queue, graph, "tir_exp"), _gid(queue, graph, "sum")))
    assert d.merge and d.reason is None
