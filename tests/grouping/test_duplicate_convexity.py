"""A duplicated producer's copies are real dependences for the convexity check.

Once ``p`` is duplicated into its consumers it has no owner; the convexity walk used to follow only owned
nodes, so the path ``exp(x) -> cumsum -> [p copy, multiply]`` vanished and the greedy merge put ``exp(x)``
into the group of ``multiply`` around the cumsum: a cyclic grouping, caught only at emission, where the pass
gave up and fell back to FuseOps (first seen on ONNX ``test_unsqueeze_axis_0``).
"""

import warnings

import pytest
from tvm import relax

from tests.grouping.graph_gen import random_graph
from tests.grouping.util import check_equivalent, group
from tests.helpers import assert_same_numbers
from tvm_ascendfuse.report import CYCLE, FusionReport

PASS = "CostBasedFusionPass"


def _copy_on_the_only_path():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.op.cumsum(a, axis=0))          # not fusable: splits the path
            p = bb.emit(relax.op.negative(b))                # duplicated into both consumers' groups
            q1 = bb.emit(relax.op.tanh(p))
            c1 = bb.emit(relax.op.cumsum(q1, axis=0))        # keeps q1 and q2 in separate groups
            q2 = bb.emit(relax.op.multiply(p, c1))
            g = bb.emit(relax.op.sqrt(a))
            z = bb.emit_output(relax.op.add(g, q2))
        bb.emit_func_output(z)
    return bb.get()


class _Log(FusionReport):
    """Keeps the taken merges too (the report only counts them)."""

    def __init__(self):
        super().__init__()
        self.taken = []

    def record(self, pass_name, effect, reason=None, where=None, **detail):
        if effect and pass_name == PASS:
            self.taken.append(dict(detail, where=where))
        super().record(pass_name, effect, reason, where, **detail)


def _groups(report):
    return sorted(tuple(row["ops"]) for row in report.sections["grouping"]["groups"])


def test_merge_around_a_duplicated_copy_is_refused_as_a_cycle():
    mod = _copy_on_the_only_path()
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the FuseOps fallback warns: it must not happen
        _, report, _ = group(mod, report=_Log())
        result = assert_same_numbers(mod)
    assert [t["where"] for t in report.taken if t.get("kind") == "duplicate"] == ["tir_negative"]
    cycles = [r["where"] for r in report.get(PASS).not_effective if r["reason"] == CYCLE]
    assert cycles == ["tir_exp -> tir_negative+multiply+tir_sqrt+add"]
    assert _groups(report) == [("tir_negative", "multiply", "tir_sqrt", "add"), ("tir_negative", "tir_tanh")]
    assert all(r["duplicated_ops"] == 1 for r in report.sections["grouping"]["groups"])
    # inside the full pipeline: the pass's own grouping, no fallback recorded
    assert _groups(result.report) == _groups(report)
    assert not any("internal error" in r.get("why", "") for r in result.report.get(PASS).not_effective)


@pytest.mark.parametrize("seed", [45, 53])
def test_stale_duplication_candidate_is_dropped(seed):
    """A producer duplicated into a consumer group bumps that group's version; its own old "duplicate me"
    candidate, re-scored, used to treat the group's first member (the copy) as the op to duplicate and
    crashed (KeyError, FuseOps fallback). Graphs from the random generator where this happened."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, report, before, after = check_equivalent(random_graph(seed, max_ops=14), seed)
    assert after < before
    assert before - after == report.get(PASS).effect_times
