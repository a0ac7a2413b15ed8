"""The priority-fusion queue on its own: decisions as data, convexity, merges and the copies of a duplicated
producer, over a graph and a model built from one legalized block."""

import dataclasses

import pytest
from tvm import relax

from tests.grouping.util import build, legalize
from tvm_ascendfuse.grouping import GroupingConfig
from tvm_ascendfuse.grouping.graph import build_graph
from tvm_ascendfuse.grouping.model import FusionModel
from tvm_ascendfuse.grouping.queue import DUPLICATE, PRODUCER_CONSUMER, Decision, FusionQueue
from tvm_ascendfuse.report import CYCLE, FusionReport
from tvm_ascendfuse.target import get_target


def _queue(mod, config=None):
    target, config = get_target("ascend910b"), config or GroupingConfig()
    func = mod["main"]
    [block] = [b for b in func.body.blocks if isinstance(b, relax.DataflowBlock)]
    graph = build_graph(block, func, mod, target, [])
    report = FusionReport()
    return FusionQueue(graph, FusionModel(graph, target, config), config, target, report), graph, report


def _gid(queue, graph, name):
    [n] = [n for n in graph.nodes if n.name == name]
    return queue.owner[n.idx]


def _diamond():
    """exp -> sum -> subtract, and exp -> subtract directly: merging exp with subtract alone leaves the sum on
    a path that leaves the group and comes back."""
    def body(bb, x):
        a = bb.emit(relax.op.exp(x))
        b = bb.emit(relax.op.sum(a, axis=[1], keepdims=True))
        return bb.emit(relax.op.subtract(a, b))
    return legalize(build([(8, 64)], body))


def test_producer_consumer_merge_is_a_decision_with_numbers():
    # exp + sum alone, the exp also read outside, is a two-output kernel no rule schedules well
    # (test_schedulable.py): the rule table is off here, this test is about the decision record
    queue, graph, _ = _queue(_diamond(), GroupingConfig(schedulable_only=False))
    d = queue.evaluate(PRODUCER_CONSUMER, (_gid(queue, graph, "tir_exp"), _gid(queue, graph, "sum")))
    assert isinstance(d, Decision) and d.merge and d.reason is None
    assert d.gain_us > 0 and d.detail["modeled_gain_us"] == round(d.gain_us, 4)
    assert d.detail["modeled_us_unfused"] > d.detail["modeled_us_fused"]
    assert [graph.nodes[m].name for m in d.members] == ["tir_exp", "sum"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.merge = False


def test_non_convex_merge_refused_as_cycle():
    queue, graph, _ = _queue(_diamond())
    d = queue.evaluate(PRODUCER_CONSUMER, (_gid(queue, graph, "tir_exp"), _gid(queue, graph, "subtract")))
    assert not d.merge and d.reason == CYCLE and d.gain_us is None


def test_run_merges_once_per_saved_launch_and_owns_every_node():
    queue, graph, report = _queue(_diamond(), GroupingConfig(allow_duplication=False))
    queue.run()
    assert queue.merges == report.get("CostBasedFusionPass").effect_times == 2
    [g] = [g for g in queue.groups.values() if len(g.members) > 1]
    calls = [n.idx for n in graph.nodes if n.fusable]
    assert sorted(g.members) == sorted(g.owner_of) == calls
    assert all(queue.owner[m] == g.gid for m in calls)


def _fanout():
    """One cheap producer read by two reductions (which cannot share a group): duplicated into both."""
    def body(bb, x, y):
        p = bb.emit(relax.op.add(x, y))
        s = bb.emit(relax.op.sum(p, axis=[1]))
        m = bb.emit(relax.op.max(p, axis=[1]))
        return relax.Tuple([s, m])
    return legalize(build([(8, 64), (8, 64)], body))


def test_duplicate_leaves_copies_in_each_consumer_group():
    queue, graph, _ = _queue(_fanout(), GroupingConfig(max_reductions=1, allow_siblings=False))
    add = _gid(queue, graph, "add")
    [p] = queue.groups[add].members
    d = queue.evaluate(DUPLICATE, (add,))
    assert d.merge and d.members == (p,) and d.detail["copies"] == 2
    touched = queue.duplicate(queue.groups[add])
    assert add not in queue.groups and p not in queue.owner
    assert queue.copies[p] == {t.gid for t in touched} and len(touched) == 2
    assert all(p in t.members and p not in t.owner_of and t.version == 1 for t in touched)
