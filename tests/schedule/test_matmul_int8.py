"""Int8MatmulRule: uint8 x int8 GEMMs (QDQ MatMul/Gemm after MatMulQuantFusionPass) on the int8 dot product,
checked against onnxruntime in output quantization steps, with VNNI (the host's features) and without."""

import numpy as np
import pytest

from tests.graph_fusion.quant_models import agreement, output_step, qdq_model
from tests.graph_fusion.test_conv_quant import _inputs
from tests.graph_fusion.common import run_ort
from tests.helpers import compile_ours, run_vm
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.hostvec import has_int8_dot

SHAPES = [dict(op="gemm", rows=24, cin=64, cout=48, relu=True), dict(op="matmul", rows=10, cin=32, cout=64),
          dict(op="matmul", act="uint8", rows=7, cin=128, cout=32, bias=False, requant=False)]


def _rules(result):
    return {k["rule"] for k in result.report.kernels if "matmul" in k["ops"]}


@pytest.mark.parametrize("portable", [False, True], ids=["host", "portable"])
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: f"{c['op']}{c['rows']}x{c['cin']}x{c['cout']}")
def test_int8_gemm_rule_matches_onnxruntime(case, portable):
    model = qdq_model(**case)
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), portable=portable)
    assert _rules(result) == {"matmul_int8"}
    ours, ref = run_vm(result.executable, inputs), run_ort(model, inputs)
    cos, diff = agreement(ours, ref)
    step = output_step(model) or 1e-4 * float(np.abs(ref).max())
    assert cos >= 0.999 and diff <= step * 1.001, (cos, diff / step)


def test_vnni_is_used_where_the_host_has_it():
    from tvm_ascendfuse.target import get_target
    result = compile_ours(import_onnx(qdq_model("gemm", rows=8, cin=64, cout=32)), portable=False)
    host = get_target("ascend910b").host_target()
    text = result.scheduled_module.script()
    assert ("vpdpbusd" in text) == has_int8_dot(host)


def test_shapes_the_tile_does_not_divide_go_to_the_generic_rule():
    model = qdq_model("gemm", rows=4, cin=30, cout=20)     # K % 4, N % 16
    inputs = _inputs(model)
    result = compile_ours(import_onnx(model), portable=False)
    assert "matmul_int8" not in _rules(result)
    cos, _ = agreement(run_vm(result.executable, inputs), run_ort(model, inputs))
    assert cos >= 0.999


@pytest.mark.parametrize("portable", [False, True], ids=["host", "portable"])
def test_gemm_without_epilogue_accumulates_in_its_output(portable):
    """A bare u8 x s8 -> s32 GEMM (ORT's MatMulInteger whose zero-point correction went to the consumers, e.g.
    merged Q/K/V siblings): the int8 rule takes it, and the integers are exact."""
    from tvm import relax

    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (64, 96)).astype("int8")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 64), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(w), out_dtype="int32"))
        bb.emit_func_output(out)
    result = compile_ours(bb.get(), portable=portable)
    assert _rules(result) == {"matmul_int8"}
    xv = rng.integers(0, 256, (1, 24, 64)).astype("uint8")
    np.testing.assert_array_equal(run_vm(result.executable, [xv]), xv.astype("int64") @ w.astype("int64"))
