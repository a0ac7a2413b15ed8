"""FallbackRule: whatever no other rule takes still gets parallel/vector loops and stays correct."""

import numpy as np
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
