"""ReductionRule: row reductions with prologue/epilogue, against the unscheduled kernel."""

import pytest
from tvm import tirx
from tvm.relax import op

from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.reduction import ReductionRule
from tvm_ascendfuse.target import get_target

from .kernels import NATIVE, NPU, check_rule, fused_kernel


def add_layer_norm(h):
    return ([(6, h), (6, h), (h,), (h,)], lambda x, r, g, b: op.nn.layer_norm(op.add(x, r), g, b, [-1]))


CASES = {
    "add_layer_norm_768": add_layer_norm(768),
    "add_layer_norm_odd": add_layer_norm(33),
    "layer_norm_3d": ([(2, 5, 40), (40,), (40,)], lambda x, g, b: op.nn.layer_norm(x, g, b, [-1])),
    "rms_norm": ([(7, 96), (96,)], lambda x, w: op.nn.rms_norm(x, w, [-1])),
    "softmax_odd": ([(3, 5, 37)], lambda x: op.nn.softmax(x, -1)),
    "softmax_128": ([(2, 4, 128)], lambda x: op.nn.softmax(x, -1)),
    "global_avg_pool": ([(2, 24, 7, 7)], lambda x: op.mean(x, axis=[2, 3], keepdims=True)),
    "sum_rows": ([(5, 1000)], lambda x: op.sum(x, axis=[1])),
    "max_rows": ([(9, 64)], lambda x: op.max(x, axis=[1])),
    "mean_then_scale": ([(4, 48)], lambda x: op.multiply(op.mean(x, axis=[1], keepdims=True), x)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_unscheduled(case):
    shapes, build = CASES[case]
    check_rule(ReductionRule(), fused_kernel(build, shapes))


@pytest.mark.parametrize("case", ["add_layer_norm_768", "softmax_odd"])
def test_avx512_widths(case):
    shapes, build = CASES[case]
    check_rule(ReductionRule(), fused_kernel(build, shapes), host=NATIVE)


def test_float16():
    shapes, build = add_layer_norm(64)
    check_rule(ReductionRule(), fused_kernel(build, shapes, "float16"))
    check_rule(ReductionRule(), fused_kernel(lambda x: op.nn.softmax(x, -1), [(3, 50)], "float16"))


def test_symbolic_batch_and_seq():
    n, s = tirx.Var("n", "int64"), tirx.Var("s", "int64")
    func = fused_kernel(lambda x, g, b: op.nn.layer_norm(x, g, b, [-1]), [(n, s, 64), (64,), (64,)])
    check_rule(ReductionRule(), func, sizes={"n": 2, "s": 3})
    func = fused_kernel(lambda x: op.nn.softmax(x, -1), [(n, s)])        # symbolic row length too
    check_rule(ReductionRule(), func, sizes={"n": 3, "s": 45})


def test_row_is_staged_in_ub_and_partials_are_vectorised():
    shapes, build = add_layer_norm(768)
    mod = check_rule(ReductionRule(), fused_kernel(build, shapes), host=NATIVE)
    text = mod.script()
    assert "_rf" in text and "T.vectorized" in text        # rfactor partials
    usage = kernel_usage("k", mod["main"], NPU)
    assert usage.bytes("local.UB") >= 768 * 4               # the x + r row lives in UB


def test_row_larger_than_ub_streams_and_says_so():
    tiny = get_target("ascend910b", ub_bytes=16 * 1024, ub_reserved_bytes=0, l1_bytes=512 * 1024)
    shapes, build = add_layer_norm(4096)
    rule = ReductionRule()
    mod, note = check_rule(rule, fused_kernel(build, shapes), target=tiny, with_note=True)
    assert note and "row" in note
    assert kernel_usage("k", mod["main"], tiny).bytes("local.UB") < tiny.ub_usable
    assert rule.apply_with_note(fused_kernel(build, shapes), NPU, None).note is None    # the note was the call's


def test_declines_matmul_and_elementwise():
    rule = ReductionRule()
    assert rule.apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None
    assert rule.apply(fused_kernel(lambda a: op.exp(a), [(8, 16)]), NPU, None) is None
