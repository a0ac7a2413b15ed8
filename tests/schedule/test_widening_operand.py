"""A 16-bit kernel input converted to float32 in front of GEMM operands (``grouping/operand_cast.py`` puts the
conversion in the GEMM's kernel): the rules convert it once per element with vector loads, never one element
per FMA in the micro-kernel (``contraction.widening_to_stage`` / ``is_widening_block``); numbers as TVM's."""

import numpy as np
import tvm
from tvm import relax

import tvm_ascendfuse as af
from tests.helpers import assert_close, run_reference, tol


def _fp16_module(m, k, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _weight(k, n, seed):
    return relax.const(np.random.default_rng(seed).standard_normal((k, n)).astype("float16"))


def _compile_one_kernel(mod, m, k):
    res = af.compile_model(mod, target="ascend910b")
    [kern] = res.report.kernels
    assert kern["ops"][0] == "cast" and kern["precision"]["inputs"][0] == "float16", kern
    [prim] = [f for _, f in res.scheduled_module.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    x = np.random.default_rng(0).standard_normal((m, k)).astype("float16")
    out = relax.VirtualMachine(res.executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert_close(out.astype("float32"), run_reference(mod, [x]).astype("float32"), **tol("float16"))
    return prim.script()


def _conversions(text):
    return [ln for ln in text.splitlines() if 'T.Cast("float32", p0' in ln]


def test_matmul_stages_the_converted_operand():
    """MatmulRule: the conversion writes A's packed panel (L1 here), the micro-kernel reads float32."""
    m, k, n = 64, 96, 128
    mod = _fp16_module(m, k, lambda bb, x: relax.op.nn.relu(bb.emit(relax.op.matmul(x, _weight(k, n, 3)))))
    text = _compile_one_kernel(mod, m, k)
    conv = _conversions(text)
    assert conv and all("local_L1[" in ln and "+" not in ln for ln in conv), text


def test_multi_gemm_converts_once_for_its_products():
    """MultiGemmRule (SwiGLU's two products of one input): one conversion stage, not one per product's FMA."""
    m, h = 32, 64

    def body(bb, x):
        g = bb.emit(relax.op.matmul(x, _weight(h, 2 * h, 2)))
        u = bb.emit(relax.op.matmul(x, _weight(h, 2 * h, 3)))
        return relax.op.multiply(bb.emit(relax.op.nn.silu(g)), u)

    text = _compile_one_kernel(_fp16_module(m, h, body), m, h)
    conv = _conversions(text)
    assert len(conv) == 1 and "+" not in conv[0], text
