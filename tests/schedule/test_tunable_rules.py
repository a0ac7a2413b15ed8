"""The tunable spaces of the rules beyond Matmul and Conv2d: for each, the rule's own schedule is the first point,
the space has other points, every point fits the target's on-chip capacity and computes exactly what the
unscheduled kernel computes, and a sampled decision replays from its trace (what a database record does)."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.relax import op

from tests.schedule.kernels import HOST, NATIVE, NPU, assert_decision_replays, attention_kernel, fused_kernel
from tvm_ascendfuse.analysis.verify_ub import VerifyUBCapacity
from tvm_ascendfuse.schedule.apply import DEFAULT_RULES
from tvm_ascendfuse.schedule.base import Scheduled
from tvm_ascendfuse.schedule.fast_math import use_fast_math
from tvm_ascendfuse.schedule.tunable import candidate_schedules, tunable_rules, ub_fits
from tvm_ascendfuse.schedule.tuned import finish_traced, workload_module
from tests.helpers import assert_close


def _workload(build, shapes):
    return workload_module(use_fast_math(fused_kernel(build, shapes).without_attr("global_symbol")))


def _attention():
    return workload_module(use_fast_math(attention_kernel(h=2, s=16, d=8).without_attr("global_symbol")))


def _ffn():
    return _workload(lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2), [(16, 12), (12, 40), (40, 8)])


def _rms_swiglu():
    def build(x, g, wg, wu, wd):
        h = op.nn.rms_norm(x, g, [-1])
        return op.add(op.matmul(op.multiply(op.nn.silu(op.matmul(h, wg)), op.matmul(h, wu)), wd), x)

    return _workload(build, [(12, 16), (16,), (16, 24), (16, 24), (24, 16)])


def _proj_add_ln(m, k, n):
    return _workload(lambda x, w, b, r, g, be: op.nn.layer_norm(op.add(op.add(op.matmul(x, w), b), r), g, be, [-1]),
                     [(m, k), (k, n), (n,), (m, n), (n,), (n,)])


def _two_products():
    return _workload(lambda x, a, b: op.multiply(op.nn.silu(op.matmul(x, a)), op.matmul(x, b)),
                     [(4, 16), (16, 32), (16, 32)])


def _grouped(xs, ws, groups, stride=1):
    def build(x, w, b):
        return op.nn.relu(op.add(op.nn.conv2d(x, w, strides=stride, padding=[1] * 4, groups=groups), b))

    return _workload(build, [xs, ws, (1, ws[0], 1, 1)])


def _max_pool():
    return _workload(lambda x: op.nn.relu(op.nn.max_pool2d(x, [3, 3], [2, 2], [1, 1, 1, 1])), [(1, 16, 16, 16)])


def _conv_pool():
    """ResNet's stem shape in small: conv + bias + ReLU, then the 3x3/2 max-pool, one kernel."""
    def build(x, w, b):
        y = op.nn.relu(op.add(op.nn.conv2d(x, w, strides=2, padding=[1] * 4), b))
        return op.nn.max_pool2d(y, [3, 3], [2, 2], [1, 1, 1, 1])

    return _workload(build, [(1, 3, 16, 16), (16, 3, 3, 3), (1, 16, 1, 1)])


def _layer_norm():
    return _workload(lambda x, g, b: op.nn.layer_norm(x, g, b, [-1]), [(6, 128), (128,), (128,)])


def _softmax():
    return _workload(lambda x: op.nn.softmax(x, -1), [(2, 3, 128)])


def _depthwise(xs, stride=1):
    c = xs[1]

    def build(x, w, b):
        return op.clip(op.add(op.nn.conv2d(x, w, strides=stride, padding=[1] * 4, groups=c), b), 0.0, 6.0)

    return _workload(build, [xs, (c, 1, 3, 3), (1, c, 1, 1)])


def _attention_projection():
    """Attention with heads cut out of a merged QKV, heads merged, projected, + residual (no mask); the
    workload is the kernel as the rule prepares it (``prepare``: simplified indices)."""
    from tests.schedule.test_attention_projection import attention_block
    from tvm_ascendfuse.schedule.attention_projection import AttentionProjectionRule

    shapes, build = attention_block(16, 2, 8, mask=False)
    return workload_module(AttentionProjectionRule.prepare(_workload(build, shapes)["main"]))


CASES = {
    # name: (rule, workload, host, least points)
    "attention": ("attention", _attention, HOST, 4),
    "attention_avx512": ("attention", _attention, NATIVE, 4),
    "attention_projection": ("attention-projection", _attention_projection, HOST, 3),
    "chained_ffn": ("chained-matmul", _ffn, HOST, 4),
    "chained_norm_swiglu": ("chained-matmul", _rms_swiglu, HOST, 3),
    "gemm_norm": ("matmul+norm", lambda: _proj_add_ln(4, 16, 32), HOST, 5),
    # an odd output width: no register block, the space is the rule's schedule alone
    "gemm_norm_untiled": ("matmul+norm", lambda: _proj_add_ln(7, 19, 33), HOST, 1),
    "multi_gemm": ("multi-matmul", _two_products, HOST, 5),
    "grouped_conv": ("grouped-conv2d", lambda: _grouped((1, 64, 16, 16), (64, 16, 3, 3), 4), NATIVE, 5),
    "grouped_conv_s2": ("grouped-conv2d", lambda: _grouped((1, 32, 17, 17), (32, 8, 3, 3), 4, 2), HOST, 4),
    "layer_norm": ("reduction", _layer_norm, HOST, 3),
    "softmax": ("reduction", _softmax, NATIVE, 3),
    "depthwise": ("depthwise-conv2d", lambda: _depthwise((1, 32, 16, 16)), NATIVE, 6),
    "depthwise_s2": ("depthwise-conv2d", lambda: _depthwise((1, 16, 16, 16), 2), HOST, 4),
    "max_pool": ("pool", _max_pool, HOST, 6),
    "conv_pool": ("pool", _conv_pool, HOST, 4),
}


def _run(mod, inputs):
    mod = tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")})
    args = [tvm.runtime.tensor(x) for x in inputs]
    tvm.compile(mod, target="llvm")["main"](*args)
    return args[-1].numpy()


def _rule(name):
    return next(r for r in DEFAULT_RULES if r.name == name)


@pytest.mark.parametrize("case", list(CASES))
def test_every_point_fits_and_matches_the_unscheduled_kernel(case):
    rule, make, host, least = CASES[case]
    workload = make()
    points = candidate_schedules(workload, rule, NPU, host)
    result = _rule(rule)().apply_with_note(workload["main"], NPU, host)
    assert isinstance(result, Scheduled)
    # untuned = first point (as a record is applied: with the rewrites no trace records)
    assert tvm_ffi.structural_equal(finish_traced(points[0][1]).mod, result.sch.mod)
    choices = [c for c, _ in points]
    assert len(points) >= least and len(set(choices)) == len(choices), choices
    assert len({tvm_ffi.structural_hash(s.mod) for _, s in points}) == len(points)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in workload["main"].params]
    expected = _run(workload, inputs)
    for choice, sch in points:
        sch = finish_traced(sch)
        assert ub_fits(sch.mod["main"], NPU), choice
        VerifyUBCapacity(NPU)(sch.mod)                          # raises UBCapacityError on overflow
        assert_close(_run(sch.mod, inputs), expected, rtol=1e-4, atol=1e-4, err_msg=str(choice))


@pytest.mark.parametrize("case", ["attention", "chained_ffn", "gemm_norm", "multi_gemm", "grouped_conv", "max_pool", "layer_norm", "depthwise"])
def test_sampled_decision_is_in_the_trace_and_replays(case):
    rule, make, host, _ = CASES[case]
    workload = make()
    assert_decision_replays(workload, rule, host)


def test_the_tunable_rules():
    assert {"matmul", "conv2d", "attention", "chained-matmul", "matmul+norm", "multi-matmul",
            "grouped-conv2d", "pool", "reduction", "depthwise-conv2d",
            "attention-projection"} <= set(tunable_rules())


def test_multi_gemm_products_share_one_decision():
    """The first product's draw is every product's register block where it is one of that product's
    candidates; at the first product's default each product keeps its own default (the untuned schedule)."""
    from tvm_ascendfuse.schedule.multi_gemm import _SharedTiles

    drawn = []

    def pick(value):
        return lambda sch, default, candidates: drawn.append(candidates()) or value

    shared = _SharedTiles(pick((2, 2)))
    assert shared(None, (8, 2), lambda: [(8, 2), (2, 2)]) == (2, 2) and len(drawn) == 1
    assert shared(None, (4, 1), lambda: [(4, 1), (2, 2)]) == (2, 2)        # the same block for the next product
    assert shared(None, (4, 1), lambda: [(4, 1), (1, 1)]) == (4, 1)        # not one of its own: its default
    assert len(drawn) == 1                                                  # one decision in the trace
    untuned = _SharedTiles(pick((8, 2)))
    untuned(None, (8, 2), lambda: [(8, 2), (4, 1)])
    assert untuned(None, (4, 1), lambda: [(4, 1), (8, 2)]) == (4, 1)
