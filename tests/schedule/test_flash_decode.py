"""FlashDecodeRule: the flash-decoding kernel scheduled (chunk tasks in parallel, scores and exponentials in UB)
gives the unscheduled kernel's numbers at key counts around the chunk size; its on-chip buffers have a static
size whatever the key count; other kernels and head dims the host's lanes do not divide are declined."""

from __future__ import annotations

import pytest
from tvm import te, tirx

from tests.schedule.kernels import NATIVE, NPU, attention_kernel, check_rule
from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.flash_decode import CHUNK, ScoreSpace, flash_decode
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.flash_decode import FlashDecodeRule
from tvm_ascendfuse.schedule.hostvec import host_vector


def kernel(heads=2, rows=1, d=32, group=1, stacked=True):
    n = tirx.Var("n", "int64")
    q = te.placeholder((1, heads, rows, d), "float32", "q")
    k = te.placeholder((1, heads, n, d), "float32", "k")
    v = te.placeholder((1, heads, n, d), "float32", "v")
    mask = te.placeholder((1, 1, 1, n), "float32", "mask")
    out = flash_decode(q, k, v, mask, chain=(("multiply", 0.125), ("add", 0)),
                       space=ScoreSpace(group, rows // group, stacked))
    return te.create_prim_func([q, k, v, mask, out])


@pytest.mark.parametrize("keys", [1, CHUNK - 1, CHUNK, CHUNK + 1, 4 * CHUNK + 5])
@pytest.mark.parametrize("rows", [1, 4])
def test_numbers_equal_the_unscheduled_kernel(keys, rows):
    check_rule(FlashDecodeRule(), kernel(rows=rows, group=rows, stacked=False), host=NATIVE, sizes={"n": keys})


def test_scores_and_exponentials_stay_on_chip_at_a_static_size():
    rows = 4
    sch = FlashDecodeRule().apply(kernel(rows=rows), NPU, NATIVE)
    usage = kernel_usage("flash", sch.mod["main"], NPU)
    on_chip = {a.name: a.nbytes for a in usage.allocations}
    assert on_chip == {"ifa_score_local.UB": rows * CHUNK * 4, "ifa_exp_local.UB": rows * CHUNK * 4}, on_chip


def test_other_kernels_and_odd_head_dims_are_declined():
    assert FlashDecodeRule().apply(use_fast_math(attention_kernel()), NPU, NATIVE) is None
    lanes = host_vector(NATIVE).lanes("float32")
    assert FlashDecodeRule().apply(kernel(d=lanes + 4), NPU, NATIVE) is None
