"""The recognisers the rules decide on: what kind of kernel, which block is a GEMM, a conv, a pool, and the
row norm in front of a kernel's products."""

import pytest
from tvm import s_tir
from tvm.relax import op

from tests.schedule.kernels import attention_kernel, fused_kernel
from tvm_ascendfuse.schedule.analysis import (find_gemm, match_conv2d, match_gemm, match_norm_prologue, match_pool,
                                              reduction_between_products, reduction_kinds)
from tvm_ascendfuse.schedule.common import root_blocks

KERNELS = {
    # name: (kernel, reduction kinds, softmax between two products)
    "matmul": (lambda: fused_kernel(lambda x, w: op.matmul(x, w), [(8, 16), (16, 8)]), "P", False),
    "layer_norm_matmul": (lambda: fused_kernel(lambda x, g, b, w: op.matmul(op.nn.layer_norm(x, g, b, axes=[-1]), w),
                                               [(8, 16), (16,), (16,), (16, 8)]), "RRP", False),
    "attention": (lambda: attention_kernel(s=16, d=8), "PRRP", True),
    "ffn": (lambda: fused_kernel(lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2),
                                 [(8, 16), (16, 32), (32, 16)]), "PP", False),
    "conv": (lambda: fused_kernel(lambda x, w: op.nn.conv2d(x, w, padding=[1, 1, 1, 1]), [(1, 4, 8, 8), (8, 4, 3, 3)]),
             "P", False),
    "max_pool": (lambda: fused_kernel(lambda x: op.nn.max_pool2d(x, [3, 3], [2, 2], [1, 1, 1, 1]), [(1, 4, 9, 9)]),
                 "R", False),
    "row_sum": (lambda: fused_kernel(lambda x: op.sum(x, axis=[1]), [(8, 16)]), "R", False),
}


def _blocks(func):
    sch = s_tir.Schedule(func)
    blocks = list(root_blocks(sch))
    return sch, blocks, [sch.get(b).name_hint for b in blocks]


@pytest.mark.parametrize("name", list(KERNELS))
def test_reduction_kinds_read_off_the_function(name):
    build, kinds, softmax_between = KERNELS[name]
    func = build()
    assert reduction_kinds(func) == kinds
    assert reduction_between_products(func) is softmax_between


@pytest.mark.parametrize("name, gemm, conv, pool", [
    ("matmul", ["matmul"], [], []), ("attention", ["matmul", "matmul1"], [], []),
    ("ffn", ["matmul", "matmul1"], [], []),
    ("conv", [], ["conv2d_nchw"], []), ("max_pool", [], [], ["pool_max"]), ("row_sum", [], [], []),
])
def test_matchers_tell_the_kernel_kinds_apart(name, gemm, conv, pool):
    sch, blocks, names = _blocks(KERNELS[name][0]())
    assert [n for b, n in zip(blocks, names) if match_gemm(sch, b)] == gemm
    assert [n for b, n in zip(blocks, names) if match_conv2d(sch, b)] == conv
    assert [n for b, n in zip(blocks, names) if match_pool(sch, b)] == pool


def test_gemm_roles_and_pool_window():
    sch, _, _ = _blocks(fused_kernel(lambda x, w: op.matmul(x, w), [(2, 6, 10), (10, 12)]))
    blocks, gi, info = find_gemm(sch)
    assert gi == len(blocks) - 1 and (info.batch, info.m, info.b_n_axis, info.b_k_axis) == ([], [0, 1], 1, 0)
    sch, blocks, names = _blocks(KERNELS["max_pool"][0]())
    pool = match_pool(sch, blocks[names.index("pool_max")])
    assert (pool.rows_in, pool.cols_in, pool.kernel_rows) == (11, 11, 3)      # the padded input, 3x3 window


def test_norm_prologue_in_front_of_a_product():
    """An RMSNorm read only by the product is its prologue (its reductions to the block the product reads);
    a reduction over another axis is not."""
    def prologue(func):
        sch, blocks, names = _blocks(func)
        return match_norm_prologue(sch, dict(zip(names, blocks)), names[:names.index("matmul")], ["matmul"])

    norm = prologue(fused_kernel(lambda x, g, w: op.matmul(op.nn.rms_norm(x, g, axes=[-1]), w),
                                 [(8, 16), (16,), (16, 8)]))
    assert norm["out"] == norm["stage"][-1] and "T_multiply_red" in norm["stage"]
    assert prologue(fused_kernel(lambda x, w: op.matmul(x, w), [(8, 16), (16, 8)])) == {"stage": [], "out": None}
    column = fused_kernel(lambda x, w: op.matmul(op.divide(x, op.sum(x, axis=[0], keepdims=True)), w),
                          [(8, 16), (16, 8)])
    assert prologue(column) is None
