"""Shared schedule helpers (``schedule/common.py``): what may be vectorised.

ONNX And/Or/Xor/Not on 2-D/4-D tensors failed to build ("dtype mismatch on BufferStore: buffer's dtype is
T.bool ... RHS's dtype is T.int8x4") when a rule vectorised both the store of a bool tile into UB and its copy
out: TVM's StorageRewrite then retyped the UB buffer to int8 vectors. Bool and sub-byte stores stay scalar.
"""

import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir
from tvm.relax import op
from tvm.script import tirx as T

from tvm_ascendfuse.schedule.common import innermost_vector, vector_storable
from tvm_ascendfuse.schedule.elementwise import ElementwiseRule
from tvm_ascendfuse.schedule.fallback import FallbackRule

from .kernels import HOST, NATIVE, NPU, check_rule, fused_kernel

BOOL_KERNELS = {
    "and_2d": (lambda a, b: op.logical_and(a, b), [(3, 4), (3, 4)], "bool"),
    "xor_bcast_4d": (lambda a, b: op.logical_xor(a, b), [(3, 4, 5, 6), (5, 6)], "bool"),
    "not_4d": (lambda a: op.logical_not(a), [(3, 4, 5, 8)], "bool"),
    "or_long": (lambda a, b: op.logical_or(a, b), [(4, 4096), (4, 4096)], "bool"),
    "compare_float": (lambda a, b: op.logical_and(op.greater(a, b), op.less(a, relax.const(0.5))),
                      [(16, 64), (16, 64)], "float32"),
}


@pytest.mark.parametrize("rule", [ElementwiseRule, FallbackRule], ids=["elementwise", "fallback"])
@pytest.mark.parametrize("case", sorted(BOOL_KERNELS))
def test_bool_kernels_build_and_match(rule, case):
    build, shapes, dtype = BOOL_KERNELS[case]
    func = fused_kernel(build, shapes, dtype)
    check_rule(rule(), func)
    check_rule(rule(), func, host=NATIVE)


def _vectorized_loops(mod):
    found = []
    tvm_ffi.structural_walk(mod["main"].body, [(tvm.tirx.For, lambda s: found.append(s)
                                                if s.kind == tvm.tirx.ForKind.VECTORIZED else None)])
    return found


def test_bool_stores_stay_scalar_float_stores_vectorised():
    build, shapes, dtype = BOOL_KERNELS["or_long"]
    sch = ElementwiseRule().apply(fused_kernel(build, shapes, dtype), NPU, HOST)
    assert not _vectorized_loops(sch.mod)
    sch = ElementwiseRule().apply(fused_kernel(lambda a, b: op.add(a, b), [(4, 4096), (4, 4096)]), NPU, HOST)
    assert _vectorized_loops(sch.mod)


@T.prim_func(s_tir=True)
def _copy_int4(a: T.Buffer((8, 64), "int4"), b: T.Buffer((8, 64), "int4")):
    for i, j in T.grid(8, 64):
        with T.sblock("copy"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi, vj]


def test_vector_storable_by_dtype():
    sch = s_tir.Schedule(_copy_int4)
    block = sch.get_sblock("copy")
    assert not vector_storable(sch, block)
    innermost_vector(sch, block, 16)
    assert not _vectorized_loops(sch.mod)
    for dtype, storable in (("bool", False), ("int8", True), ("float16", True), ("float32", True)):
        func = fused_kernel(lambda a: op.add(a, a) if dtype != "bool" else op.logical_not(a), [(8, 64)], dtype)
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock(sch.mod["main"].body.block.name_hint))
        assert vector_storable(sch, blocks[-1]) is storable, dtype


def test_bool_epilogues_of_matmul_conv_pool_rules():
    """The rules that vectorise through ``common.vectorize_inner`` (GEMM/conv/pool epilogues and staging)
    keep a bool epilogue's stores scalar too, and still compute what the unscheduled kernel computes."""
    from tvm_ascendfuse.schedule.conv import Conv2dRule
    from tvm_ascendfuse.schedule.common import vectorize_inner
    from tvm_ascendfuse.schedule.matmul import MatmulRule
    from tvm_ascendfuse.schedule.pool import PoolRule

    zero = relax.const(0.0)
    check_rule(MatmulRule(), fused_kernel(lambda x, w: op.greater(op.matmul(x, w), zero), [(16, 32), (32, 64)]))
    check_rule(Conv2dRule(), fused_kernel(lambda x, w: op.greater(op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), zero),
                                          [(1, 8, 16, 16), (16, 8, 3, 3)]))
    check_rule(PoolRule(), fused_kernel(lambda x: op.less(op.nn.max_pool2d(x, [2, 2], [2, 2]), zero),
                                        [(1, 8, 16, 16)]))
    sch = s_tir.Schedule(_copy_int4)
    vectorize_inner(sch, sch.get_sblock("copy"), 16)
    assert not _vectorized_loops(sch.mod)


def test_unwritten_output_counts_the_iterations_writing_each_output():
    """A kernel whose blocks write fewer elements of an output than it holds (what TVM's reverse_compute_at
    left of a layout epilogue) is named with both counts; a whole one, or one written by two blocks (a concat
    as two stores), is not."""
    from tvm.script import tirx as T

    from tvm_ascendfuse.schedule.common import unwritten_output

    @T.prim_func(s_tir=True)
    def half(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 4):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj]

    @T.prim_func(s_tir=True)
    def two_stores(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4, 8), "float32")):
        for i, j in T.grid(4, 4):
            with T.sblock("left"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj]
        for i, j in T.grid(4, 4):
            with T.sblock("right"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj + 4] = a[vi, vj]

    assert unwritten_output(half) == ("b", 16, 32)
    assert unwritten_output(two_stores) is None


def _copy_kernel():
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((8, 8), "float32"), B: T.Buffer((8, 8), "float32")):
        for i, j in T.grid(8, 8):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj]
    return main


def test_refused_primitive_says_what_failed_without_the_module():
    """Schedules the rules make (``new_schedule``, and their copies) keep a refused primitive's message to
    what failed: TVM's default renders the whole module into it, time spent on every refused trial, and
    printer warnings on the terminal when the half-scheduled module does not print."""
    from tvm_ascendfuse.schedule.common import new_schedule

    for sch in (new_schedule(_copy_kernel()), new_schedule(_copy_kernel()).copy()):
        with pytest.raises(s_tir.ScheduleError) as err:
            sch.compute_inline(sch.get_sblock("copy"))      # writes an output: refused
        assert "T.prim_func" not in str(err.value) and "B[vi, vj]" not in str(err.value)
        assert "output block" in str(err.value)


def test_rules_make_their_schedules_through_new_schedule():
    """No schedule module builds an ``s_tir.Schedule`` with TVM's default error rendering itself."""
    import pathlib

    import tvm_ascendfuse.schedule as pkg

    offenders = [p.name for p in pathlib.Path(pkg.__file__).parent.glob("*.py")
                 if p.name != "common.py" and "s_tir.Schedule(" in p.read_text()]
    assert not offenders
