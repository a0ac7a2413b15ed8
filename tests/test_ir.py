"""The IR helpers every layer shares: one answer for an op's name, a shape and an element's size."""

import pytest
import tvm
from tvm import relax
from tvm.relax import op

from tvm_ascendfuse.ir import dims, dtype_bytes, is_call_tir, op_name, static_dims, static_shape, tensor_type


@pytest.mark.parametrize("dtype, nbytes", [
    ("float32", 4), ("float16", 2), ("bfloat16", 2), ("float64", 8), ("int64", 8), ("int8", 1), ("uint16", 2),
    ("bool", 1), ("float8_e4m3fn", 1), ("float8_e5m2", 1),
    ("int4", 1), ("float4_e2m1fn", 1),           # sub-byte: one byte each (the traffic count once said 52)
    ("float32x4", 16),                           # a vector element is all its lanes
    ("void", 1),                                 # nothing known: at least one byte
])
def test_dtype_bytes(dtype, nbytes):
    assert dtype_bytes(dtype) == nbytes
    assert dtype_bytes(tvm.DataType(dtype)) == nbytes


def test_op_name_and_call_tir():
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    add = op.add(x, x)
    assert op_name(add) == "relax.add" and not is_call_tir(add)
    assert op_name(x) is None                        # not a call
    gv = relax.GlobalVar("f")
    assert op_name(relax.Call(gv, [x])) is None      # a call of a function, not of an op
    launch = relax.call_tir(relax.GlobalVar("k"), (x,), relax.TensorType((4, 8), "float32"))
    assert is_call_tir(launch) and op_name(launch) == "relax.call_tir"


def test_shapes():
    n = tvm.tirx.Var("n", "int64")
    static = relax.Var("a", relax.TensorType((4, 8), "float32"))
    symbolic = relax.Var("b", relax.TensorType((n, 8), "float32"))
    unknown_rank = relax.Var("c", relax.TensorType(ndim=2, dtype="float32"))
    assert dims(static) == [4, 8] and static_dims(static) == [4, 8] and static_shape(static) == (4, 8)
    assert dims(symbolic)[0].same_as(n) and dims(symbolic)[1] == 8
    assert static_dims(symbolic) == [None, 8] and static_shape(symbolic) is None
    assert dims(unknown_rank) is static_dims(unknown_rank) is static_shape(unknown_rank) is None
    assert tensor_type(static) is not None and tensor_type(relax.Var("t", relax.TupleType([]))) is None
