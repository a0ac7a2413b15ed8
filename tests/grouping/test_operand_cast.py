"""A 16-bit input's conversion to float32 in front of a cube operand (``grouping/operand_cast.py``): recognised
only as a widening float conversion, and it joins the GEMM's kernel instead of being a kernel of its own."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ascendfuse as af
from tests.grouping.util import legalize
from tests.helpers import assert_close, run_reference, tol
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


def _fp16_linear(m, k, n):
    w = np.random.default_rng(3).standard_normal((k, n)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def test_fp16_gemm_input_conversion_is_in_the_gemm_kernel():
    """One kernel reading the fp16 input, the conversion staged as A's panel (vectorised, once per element),
    not a separate kernel and not a scalar conversion in the micro-kernel; numbers as TVM's build."""
    mod = _fp16_linear(64, 96, 128)
    res = af.compile_model(mod, target="ascend910b")
    [k] = res.report.kernels
    assert k["ops"][0] == "cast" and k["precision"]["inputs"][0] == "float16", k
    [prim] = [f for _, f in res.scheduled_module.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    text = prim.script()
    update = [ln for ln in text.splitlines() if "matmul_intermediate" in ln and "+" in ln and "=" in ln]
    assert update and not any("Cast" in ln for ln in update), text     # the micro-kernel reads float32
    panel = [ln for ln in text.splitlines() if "local_L1[" in ln and 'T.Cast("float32", p0' in ln]
    assert panel, text
    x = np.random.default_rng(0).standard_normal((64, 96)).astype("float16")
    vm = relax.VirtualMachine(res.executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert_close(out.astype("float32"), run_reference(mod, [x]).astype("float32"), **tol("float16"))
