"""The schedule phase's cheap pre-checks: they must only skip work whose answer is known.

* ``product_blocks`` counts what ``analysis.is_contraction`` calls products, without a schedule; a rule
  whose ``min_products`` is above the count is not tried (the rule chosen stays the same).
* ``_symbolic_on_chip`` skips the compaction analysis when every parameter has a static shape.
"""

import pytest
from tvm import s_tir
from tvm.relax import op

from tests.schedule.kernels import HOST, NPU, attention_kernel, fused_kernel
from tvm_ascendfuse.schedule import apply as ap
from tvm_ascendfuse.schedule.analysis import is_contraction
from tvm_ascendfuse.schedule.common import block_infos


def _ln_matmul_gelu(x, g, b, w):
    return op.nn.gelu(op.matmul(op.nn.layer_norm(x, g, b, axes=[-1]), w))


def _two_matmuls(x, w1, w2):
    return op.add(op.matmul(x, w1), op.matmul(x, w2))


def _softmax(x):
    return op.nn.softmax(x)


KERNELS = {
    "matmul": (lambda: fused_kernel(lambda x, w: op.matmul(x, w), [(8, 16), (16, 8)]), 1),
    "ln_matmul_gelu": (lambda: fused_kernel(_ln_matmul_gelu, [(8, 16), (16,), (16,), (16, 8)]), 1),
    "two_matmuls": (lambda: fused_kernel(_two_matmuls, [(8, 16), (16, 8), (16, 8)]), 2),
    "attention": (lambda: attention_kernel(s=16, d=8), 2),
    "softmax": (lambda: fused_kernel(_softmax, [(4, 32)]), 0),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_product_count_matches_is_contraction(name):
    build, expected = KERNELS[name]
    func = build()
    sch = s_tir.Schedule(func)
    reference = sum(1 for b in block_infos(sch) if b.is_reduction() and is_contraction(sch, b.block_rv))
    assert ap.product_blocks(func) == reference == expected


@pytest.mark.parametrize("name", ["matmul", "ln_matmul_gelu", "softmax"])
def test_skipping_multi_product_rules_keeps_the_chosen_rule(name, monkeypatch):
    func = KERNELS[name][0]()
    fast = ap.ApplyUBSchedules(NPU).schedule_one("k", func, HOST)
    unskipped = ap._rule_instances(ap.DEFAULT_RULES)
    for rule in unskipped:
        monkeypatch.setattr(rule, "min_products", 0)
    slow = ap.ApplyUBSchedules(NPU, rules=unskipped).schedule_one("k", func, HOST)
    assert fast[1] == slow[1] is not None


def test_on_chip_analysis_only_skipped_without_on_chip_buffers(monkeypatch):
    unscheduled = fused_kernel(_softmax, [(4, 32)])
    scheduled = ap.ApplyUBSchedules(NPU).schedule_one("k", unscheduled, HOST)[0]
    counted = []
    real = ap.kernel_usage
    monkeypatch.setattr(ap, "kernel_usage", lambda *a: counted.append(a[0]) or real(*a))
    assert ap._on_chip("plain", unscheduled, NPU) == (False, None) and counted == []
    assert ap._on_chip("staged", scheduled, NPU) == (False, None) and counted == ["staged"]


def test_symbolic_check_only_for_kernels_of_symbolic_shape():
    from tvm import tirx
    assert ap._all_static(fused_kernel(_softmax, [(4, 32)]))
    assert not ap._all_static(fused_kernel(_softmax, [(tirx.Var("n", "int64"), 32)]))
