"""Fused vs unfused on random graphs of mixed ops (a property test, plus fixed seeds)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.grouping.graph_gen import random_graph
from tests.grouping.util import check_equivalent


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fixed_random_graphs(seed):
    _, report, before, after = check_equivalent(random_graph(seed), seed)
    assert after <= before
    rec = report.get("CostBasedFusionPass")
    assert before - after == _launches_saved(report), (before, after, rec.to_dict())


def _launches_saved(report):
    """Each accepted pairwise merge removes one launch; a duplication removes the producer's launch."""
    rec = report.get("CostBasedFusionPass")
    return rec.effect_times


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=10**6))
def test_property_grouping_preserves_numbers(seed):
    _, report, before, after = check_equivalent(random_graph(seed), seed)
    assert after <= before
    assert before - after == _launches_saved(report)


@pytest.mark.slow
def test_fuzz_many_graphs():
    """The long run: ASCENDFUSE_FUZZ_GRAPHS graphs (default 1000) from seed ASCENDFUSE_FUZZ_SEED."""
    import os
    n = int(os.environ.get("ASCENDFUSE_FUZZ_GRAPHS", "1000"))
    first = int(os.environ.get("ASCENDFUSE_FUZZ_SEED", "0"))
    for seed in range(first, first + n):
        _, report, before, after = check_equivalent(random_graph(seed, max_ops=14), seed)
        assert before - after == _launches_saved(report), seed
