"""FallbackRule: whatever no other rule takes still gets parallel/vector loops and stays correct."""

import numpy as np
import tvm
from tvm import tirx
import pytest
from tvm.relax import op
from tvm.script import tirx as T

from tvm_ascendfuse.schedule.fallback import FallbackRule

from .kernels import NATIVE, NPU, check_rule, fused_kernel

CASES = {
    "matmul": ([(9, 13), (13, 7)], "float32", lambda a, b: op.matmul(a, b)),
    "argmax": ([(6, 50)], "float32", lambda a: op.argmax(a, axis=1)),
    "take": ([(10, 6), (5,)], "float32", lambda a, i: op.take(a, op.astype(i, "int32"), axis=0)),
    "sum_axis0": ([(64, 10)], "float32", lambda a: op.sum(a, axis=[0])),
    "max_pool": ([(1, 3, 9, 9)], "float32", lambda a: op.nn.max_pool2d(a, (3, 3), (2, 2))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_unscheduled(case):
    shapes, dtype, build = CASES[case]
    fixed = {1: np.array([0, 3, 9, 2, 1], "float32")} if case == "take" else None   # in-range indices
    check_rule(FallbackRule(), fused_kernel(build, shapes, dtype), host=NATIVE, fixed=fixed)


def test_parallelises_outer_loop():
    shapes, dtype, build = CASES["matmul"]
    mod = check_rule(FallbackRule(), fused_kernel(build, shapes, dtype))
    assert "T.parallel" in mod.script()


def test_never_fails_on_opaque_tir():
    @T.prim_func(s_tir=True)
    def opaque(a: T.handle, b: T.handle):
        A = T.match_buffer(a, (16,), "float32")
        B = T.match_buffer(b, (16,), "float32")
        for i in range(16):
            B[i] = A[i] + T.float32(1)       # no blocks at all

    sch = FallbackRule().apply(opaque.with_attr("global_symbol", "main"), NPU, NATIVE)
    assert sch is None or sch.mod["main"] is not None


def _inner_loop_of(mod, block_name):
    sch = tvm.s_tir.Schedule(mod)
    blk = sch.get_sblock(block_name)
    loop = sch.get(sch.get_loops(blk)[-1])
    kind = {iv.var.name: iv.iter_type for iv in sch.get(blk).iter_vars}
    return loop, sch.get(blk), kind


def test_unmatched_gemm_walks_the_output_row_vectorised():
    """A GEMM behind a head-merge layout change, as the fallback gets it when no rule takes it: the
    reduction loop moves above the output column loop, which vectorises; the rows are parallel. Exact."""
    from .test_matmul import head_merge_linear

    func = fused_kernel(head_merge_linear(4, 37, 16), [(1, 4, 37, 16), (64, 48), (48,), (1, 37, 48)])
    mod = check_rule(FallbackRule(), func, host=NATIVE)
    loop, block, _ = _inner_loop_of(mod, "matmul")
    assert loop.kind == tvm.tirx.ForKind.VECTORIZED
    assert any(lp.kind == tvm.tirx.ForKind.PARALLEL for lp in _loops(mod, "matmul"))


def test_unmatched_gemm_with_symbolic_rows():
    n = tirx.Var("n", "int64")
    check_rule(FallbackRule(), fused_kernel(lambda a, b: op.matmul(a, b), [(1, n, 24), (24, 40)]), host=NATIVE,
               sizes={"n": 13})


def test_row_reduction_keeps_its_reduction_loop_innermost():
    """Vectorising over the rows of a row sum would gather across rows: the nest stays as it was."""
    mod = check_rule(FallbackRule(), fused_kernel(lambda a: op.sum(a, axis=[1]), [(6, 50)]), host=NATIVE)
    loop, block, kind = _inner_loop_of(mod, block_name(mod))
    assert loop.kind != tvm.tirx.ForKind.VECTORIZED
    assert any(k == tvm.tirx.IterVar.CommReduce for k in kind.values())


def test_column_sum_vectorises_over_columns():
    mod = check_rule(FallbackRule(), fused_kernel(lambda a: op.sum(a, axis=[0]), [(64, 40)]), host=NATIVE)
    loop, _, _ = _inner_loop_of(mod, block_name(mod))
    assert loop.kind == tvm.tirx.ForKind.VECTORIZED


def block_name(mod):
    sch = tvm.s_tir.Schedule(mod)
    root = sch.get_sblock(sch.mod["main"].body.block.name_hint)
    return next(sch.get(b).name_hint for b in sch.get_child_blocks(root)
                if any(iv.iter_type != tvm.tirx.IterVar.DataPar for iv in sch.get(b).iter_vars))


def _loops(mod, block_name):
    sch = tvm.s_tir.Schedule(mod)
    return [sch.get(lp) for lp in sch.get_loops(sch.get_sblock(block_name))]
