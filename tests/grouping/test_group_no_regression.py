"""Never a modeled regression, group by group: each kernel the grouping pass forms is modeled no slower than
the kernels it replaces (every op it holds, a duplicated producer included, as its own kernel).

The greedy rule (take a merge only when its modeled gain is positive) is what should guarantee it; this
checks the emitted groups on the small benchmark workloads, where the per-workload statement
(ours <= TVM default) is also asserted. All times are modeled NPU times.
"""

import pytest

from tests.helpers import compile_ours
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.workloads import bert_layer, llama_block, resnet50

SMALL = {
    "bert_layer": lambda: bert_layer(seq=16, hidden=64, heads=4, ffn=128),
    "llama_block": lambda: llama_block(seq=16, hidden=64, heads=4, ffn=176),
    "resnet_bottlenecks": lambda: resnet50(image=32, base_width=8, layers=(1, 1, 1, 1), num_classes=10),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_every_group_modeled_no_slower_than_its_parts(name):
    report = compile_ours(import_onnx(SMALL[name]()), traffic_baseline=True).report
    rows = report.sections["grouping"]["groups"]
    assert rows, "the grouping pass formed no group: nothing was checked"
    for r in rows:
        assert len(r["ops"]) >= 2
        assert r["modeled_time_us_parts"] >= r["modeled_time_us_unfused"] > 0
        assert r["modeled_time_us"] <= r["modeled_time_us_parts"], (r["name"], r["modeled_time_us"],
                                                                    r["modeled_time_us_parts"])
        if not r["duplicated_ops"]:
            assert r["modeled_time_us"] <= r["modeled_time_us_unfused"], r["name"]
    traffic = report.sections["traffic"]
    assert traffic["ours"]["modeled_time_us"] <= traffic["tvm_default"]["modeled_time_us"]
