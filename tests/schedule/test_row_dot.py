"""RowDotRule: a few query rows per KV head dotted with every key row of a cache whose length is symbolic -
numbers equal to the unscheduled kernel at key counts that are and are not whole chunks, K read in place (no
padded copy), one parallel loop; P·V (V read by columns), many rows and static-free reductions are declined."""

from __future__ import annotations

import pytest
from tvm import tirx
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, check_rule, fused_kernel
from tvm_ascendfuse.schedule.indices import simplify_indices
from tvm_ascendfuse.schedule.row_dot import CHUNK, RowDotRule
from tvm_ascendfuse.target import get_target

NPU = get_target("ascend910b")


def scores(kv=2, group=4, rows=1, d=32, keys=None):
    """(query heads stacked per KV head) · Kᵀ over ``keys`` keys (None: symbolic ``n``), the form the
    grouped-query products take after GroupedQueryMatmulFusionPass."""
    n = tirx.Var("n", "int64") if keys is None else keys

    def build(q, k):
        stacked = op.reshape(q, (1, kv, group * rows, d))
        return op.matmul(stacked, op.permute_dims(k, [0, 1, 3, 2]))
    # the schedule phase hands rules kernels with the reshape's index arithmetic simplified
    return simplify_indices(fused_kernel(build, [(1, kv * group, rows, d), (1, kv, n, d)]))


@pytest.mark.parametrize("host", [HOST, NATIVE], ids=["portable", "native"])
@pytest.mark.parametrize("keys", [1, CHUNK - 1, CHUNK + 1, 3 * CHUNK, 100])
def test_numbers_at_any_key_count(host, keys):
    mod = check_rule(RowDotRule(), scores(), host=host, sizes={"n": keys})
    script = mod.script()
    assert "row dots" in script and script.count("T.parallel") == 1
    assert "_pad" not in script                        # K read where it is, no padded copy of the cache


@pytest.mark.parametrize("kv, group, rows, d", [(4, 4, 1, 64), (1, 4, 1, 16), (2, 2, 2, 32)])
def test_numbers_for_gqa_mqa_and_two_rows(kv, group, rows, d):
    check_rule(RowDotRule(), scores(kv=kv, group=group, rows=rows, d=d), host=NATIVE, sizes={"n": 45})


def test_values_times_probabilities_are_declined():
    """P·V: the reduction (keys) is not V's contiguous axis; a GEMM schedule's business."""
    n = tirx.Var("n", "int64")
    pv = fused_kernel(lambda p, v: op.matmul(p, v), [(1, 2, 4, n), (1, 2, n, 32)])
    check_rule(RowDotRule(), pv, sizes={"n": 40}, expect=False)


def test_many_rows_are_declined():
    check_rule(RowDotRule(), scores(group=8, rows=4), sizes={"n": 40}, expect=False)


def test_a_query_read_across_its_rows_is_declined():
    """Each operand must be read along the reduction: a query stored (d, rows) would be read with a stride."""
    n = tirx.Var("n", "int64")

    def build(qt, k):
        return op.matmul(op.permute_dims(qt, [0, 1, 3, 2]), op.permute_dims(k, [0, 1, 3, 2]))
    func = simplify_indices(fused_kernel(build, [(1, 2, 32, 4), (1, 2, n, 32)]))
    check_rule(RowDotRule(), func, sizes={"n": 40}, expect=False)
