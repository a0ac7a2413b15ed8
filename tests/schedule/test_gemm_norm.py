"""GemmNormRule: matmul + bias + residual + LayerNorm/RMSNorm in one kernel, against the unscheduled kernel."""

import pytest
from tvm.relax import op

from tvm_ascendfuse.schedule.reduction import GemmNormRule

from .kernels import NATIVE, NPU, check_rule, fused_kernel


def proj_add_ln(m, k, n):
    return ([(m, k), (k, n), (n,), (m, n), (n,), (n,)],
            lambda x, w, b, r, g, be: op.nn.layer_norm(op.add(op.add(op.matmul(x, w), b), r), g, be, [-1]))


def proj_rms(m, k, n):
    return ([(m, k), (k, n), (m, n), (n,)],
            lambda x, w, r, g: op.nn.rms_norm(op.add(op.matmul(x, w), r), g, [-1]))


@pytest.mark.parametrize("shapes_build", [proj_add_ln(16, 32, 64), proj_add_ln(7, 19, 33), proj_rms(12, 16, 48)])
def test_matches_unscheduled(shapes_build):
    shapes, build = shapes_build
    check_rule(GemmNormRule(), fused_kernel(build, shapes))


def test_residual_sum_as_second_output():
    """LLaMA's o-proj: the residual sum is both returned and normalised (two outputs)."""
    from tvm import relax

    def build(x, w, r, g):
        h = op.add(op.matmul(x, w), r)
        return relax.Tuple([h, op.nn.rms_norm(h, g, [-1])])

    _, note = check_rule(GemmNormRule(), fused_kernel(build, [(1, 12, 16), (16, 48), (1, 12, 48), (48,)]), host=NATIVE,
                         with_note=True)
    assert note and "second output" in note


def test_avx512_widths():
    shapes, build = proj_add_ln(32, 64, 128)
    mod = check_rule(GemmNormRule(), fused_kernel(build, shapes), host=NATIVE)
    assert "T.parallel" in mod.script()


def test_declines_plain_norm_and_plain_matmul():
    rule = GemmNormRule()
    assert rule.apply(fused_kernel(lambda x, g, b: op.nn.layer_norm(x, g, b, [-1]), [(4, 8), (8,), (8,)]),
                      NPU, None) is None
    assert rule.apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None


def test_swiglu_two_products():
    from tvm_ascendfuse.schedule.multi_gemm import MultiGemmRule

    build = lambda x, wg, wu: op.multiply(op.nn.silu(op.matmul(x, wg)), op.matmul(x, wu))  # noqa: E731
    check_rule(MultiGemmRule(), fused_kernel(build, [(1, 16, 32), (32, 64), (32, 64)]), host=NATIVE)
    check_rule(MultiGemmRule(), fused_kernel(build, [(9, 12), (12, 20), (12, 20)]))
    assert MultiGemmRule().apply(fused_kernel(lambda a, b: op.matmul(a, b), [(8, 16), (16, 4)]), NPU, None) is None
