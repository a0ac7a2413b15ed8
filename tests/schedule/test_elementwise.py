"""ElementwiseRule: injective chains tiled through local.UB, against the unscheduled kernel."""

import pytest
from tvm import relax, tirx
from tvm.relax import op

from tvm_ascendfuse.analysis.ub_usage import kernel_usage
from tvm_ascendfuse.schedule.elementwise import ElementwiseRule
from tvm_ascendfuse.target import get_target

from .kernels import NATIVE, NPU, check_rule, fused_kernel

CASES = {
    "bias_relu": ([(33, 77), (77,)], lambda x, b: op.nn.relu(op.add(x, b))),
    "mul_sigmoid": ([(3, 5, 1000)], lambda x: op.multiply(x, op.sigmoid(x))),
    "transpose": ([(3, 7, 33)], lambda x: op.permute_dims(x, [0, 2, 1])),
    "concat": ([(4, 9), (4, 7)], lambda a, b: op.concat([a, b], axis=1)),
    "strided_slice": ([(6, 40)], lambda x: op.strided_slice(x, axes=[1], begin=[1], end=[39], strides=[3])),
    "reshape_add": ([(6, 8), (48,)], lambda a, b: op.add(op.reshape(a, (48,)), b)),
    "erf_gelu": ([(5, 131)], lambda x: op.multiply(op.multiply(x, relax.const(0.5, "float32")),
                                                      op.add(relax.const(1.0, "float32"),
                                                             op.erf(op.multiply(x, relax.const(0.7071, "float32")))))),
    "long_1d": ([(70001,)], lambda x: op.exp(x)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_unscheduled(case):
    shapes, build = CASES[case]
    check_rule(ElementwiseRule(), fused_kernel(build, shapes))


def test_avx512_widths():
    shapes, build = CASES["bias_relu"]
    check_rule(ElementwiseRule(), fused_kernel(build, shapes), host=NATIVE)


def test_float16():
    func = fused_kernel(lambda x, b: op.nn.relu(op.add(x, b)), [(17, 64), (64,)], "float16")
    check_rule(ElementwiseRule(), func)


def test_symbolic_batch_and_seq():
    n, s = tirx.Var("n", "int64"), tirx.Var("s", "int64")
    func = fused_kernel(lambda x, b: op.add(op.tanh(x), b), [(n, s, 24), (24,)])
    check_rule(ElementwiseRule(), func, sizes={"n": 3, "s": 5})
    func = fused_kernel(lambda x: op.nn.relu(x), [(n, s)])
    check_rule(ElementwiseRule(), func, sizes={"n": 2, "s": 37})


def test_tile_is_staged_in_ub_and_fits_both_targets():
    func = fused_kernel(lambda x, y: op.add(x, y), [(512, 1024), (512, 1024)])
    for name in ("ascend910b", "ascend310p"):
        t = get_target(name)
        mod = check_rule(ElementwiseRule(), func, target=t)
        used = kernel_usage("k", mod["main"], t).bytes("local.UB")
        # output tile only is staged; with 2 inputs + output double-buffered it must fit usable UB
        assert 0 < used and 3 * 2 * used <= t.ub_usable + 3 * 2 * t.ub_align


def test_declines_reductions():
    func = fused_kernel(lambda x: op.sum(x, axis=[1]), [(4, 8)])
    assert ElementwiseRule().apply(func, NPU, None) is None
