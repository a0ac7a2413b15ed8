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


def convnext_head(n, h, w, k, c):
    """ConvNeXt's last block and head: linear on channels-last rows -> permute to NCHW -> layer scale ->
    + residual -> global average pool -> LayerNorm over the pooled channels (NHWC (n, 1, 1, c))."""
    shapes = [(n, h, w, k), (k, c), (c,), (c, 1, 1), (n, c, h, w), (c,), (c,)]

    def build(x, wt, b, scale, res, g, be):
        y = op.add(op.multiply(scale, op.permute_dims(op.add(op.matmul(x, wt), b), [0, 3, 1, 2])), res)
        pooled = op.mean(y, axis=[2, 3], keepdims=True)
        return op.nn.layer_norm(op.permute_dims(pooled, [0, 2, 3, 1]), g, be, [-1])
    return shapes, build


def _redundancy(mod):
    """Largest ratio, over the blocks, of the iterations their loops run to the block's own domain."""
    import math

    from tvm import tirx
    worst = 1.0

    def visit(stmt, trip):
        nonlocal worst
        if isinstance(stmt, tirx.For):
            visit(stmt.body, trip * int(stmt.extent))
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, trip)
        elif hasattr(stmt, "block") and hasattr(stmt.block, "iter_vars"):
            dom = math.prod(int(iv.dom.extent) for iv in stmt.block.iter_vars)
            if stmt.block.name_hint != "root":
                worst = max(worst, trip / max(1, dom))
            visit(stmt.block.body, trip if stmt.block.name_hint == "root" else 1)
        elif hasattr(stmt, "body"):
            visit(stmt.body, trip)
    visit(mod["main"].body, 1)
    return worst


@pytest.mark.parametrize("dims", [(1, 7, 7, 96, 48), (2, 3, 5, 40, 24), (1, 4, 4, 32, 20)])
def test_pooled_norm_after_the_gemm_computed_once(dims):
    """A pooling reduction over the GEMM's rows then a norm over the pooled vector: no common row loop, so
    each block runs once (placed under the norm's column loop they were recomputed once per column)."""
    shapes, build = convnext_head(*dims)
    mod = check_rule(GemmNormRule(), fused_kernel(build, shapes))
    assert _redundancy(mod) <= 2, _redundancy(mod)
