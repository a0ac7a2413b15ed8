"""A 16-bit input's conversion to float32 in front of a cube operand (``grouping/operand_cast.py``): recognised
only as a widening float conversion. That it then joins the GEMM's kernel: the fp16/bf16 tests in tests/patterns
(one kernel each) and tests/schedule/test_widening_operand.py."""

import pytest
import tvm
from tvm import relax

from tests.grouping.util import legalize
from tvm_ascendfuse.grouping.operand_cast import widening_cast


def _cast_module(src: str, dst: str):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), src))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.astype(x, dst))
        bb.emit_func_output(out)
    return bb.get()


def _prim(mod):
    [prim] = [f for _, f in legalize(mod).functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    return prim


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
def test_widening_cast_recognised(src):
    assert widening_cast(_prim(_cast_module(src, "float32")))


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float16", "int32"), ("int8", "float32"),
                                     ("float32", "float64")])
def test_other_casts_are_not(src, dst):
    """Narrowing and integer casts round or compute: they keep the rule that only layout ops feed a cube op."""
    assert not widening_cast(_prim(_cast_module(src, dst)))


def test_exp_is_not_a_widening_cast():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.exp(relax.op.astype(x, "float32")))
        bb.emit_func_output(out)
    prims = [f for _, f in legalize(bb.get()).functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert [widening_cast(p) for p in prims].count(True) == 1     # the cast, not the exp
