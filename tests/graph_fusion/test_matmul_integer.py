"""DynamicQuantMatMulFusionPass: ORT quantize_dynamic's MatMulInteger as a uint8 x int8 GEMM, checked against
onnxruntime running the same quantized model."""

import numpy as np
import pytest
import tvm
from onnx import helper

from tests.graph_fusion.common import onnx_model, run_ort, run_pass
from tests.graph_fusion.quant_models import agreement
from tests.helpers import compile_ours, run_vm
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.graph_fusion import DynamicQuantMatMulFusionPass as P
from tvm_ascendfuse.graph_fusion.safe_fold import SafeFoldConstant


def _mlp(tmp_path, rows=16, d=64, hidden=96, batch=()):
    """x -> MatMul(W1) + b1 -> Relu -> MatMul(W2) + b2, quantized by ORT's quantize_dynamic."""
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((d, hidden)).astype("float32") * 0.1,
             "b1": rng.standard_normal(hidden).astype("float32") * 0.1,
             "w2": rng.standard_normal((hidden, 32)).astype("float32") * 0.1,
             "b2": rng.standard_normal(32).astype("float32") * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["hr"]), helper.make_node("MatMul", ["hr", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    model = onnx_model(nodes, {"x": (*batch, rows, d)}, {"y": (*batch, rows, 32)}, inits)
    src, dst = tmp_path / "mlp.onnx", tmp_path / "mlp_dyn.onnx"
    import onnx
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst))
    return onnx.load(dst)


def _int8_matmuls(mod):
    return [b.value for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, tvm.relax.Call) and getattr(b.value.op, "name", "") == "relax.matmul"
            and str(b.value.args[0].ty.dtype) == "uint8" and str(b.value.args[1].ty.dtype) == "int8"]


@pytest.mark.parametrize("batch", [(), (2,)], ids=["2d", "3d"])
def test_matmul_integer_becomes_int8_gemm_and_matches_onnxruntime(tmp_path, batch):
    model = _mlp(tmp_path, batch=batch)
    kept = SafeFoldConstant(keep=("relax.dequantize",))(import_onnx(model))
    out, rec = run_pass(P, kept)
    assert (rec.match_times, rec.effect_times) == (2, 2)
    assert len(_int8_matmuls(out)) == 2
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type
                                                  .shape.dim]).astype("float32")
    result = compile_ours(import_onnx(model), portable=False, switches={"GraphFusion": {P.switch_name: "on"}})
    ours, ref = run_vm(result.executable, [x]), run_ort(model, [x])
    cos, diff = agreement(ours, ref)
    # same integers as ORT: only float rounding of the scale products differs
    assert cos >= 0.9999 and diff <= 1e-4 * float(np.abs(ref).max()), (cos, diff)
    # the last GEMM runs on the int8 rule (the first one's kernel also takes the next DynamicQuantizeLinear's
    # max over its output: the GEMM+reduction rule schedules that one)
    assert result.report.kernels[-1]["rule"] == "matmul_int8"


def test_off_by_default(tmp_path):
    result = compile_ours(import_onnx(_mlp(tmp_path)), portable=False)
    rec = result.report.get(P.switch_name)
    assert rec.match_times == 2 and rec.effect_times == 0


def test_switched_off_keeps_the_int32_matmul(tmp_path):
    model = _mlp(tmp_path)
    kept = SafeFoldConstant(keep=("relax.dequantize",))(import_onnx(model))
    out, rec = run_pass(P, kept, enabled=False)
    assert rec.match_times == 2 and rec.effect_times == 0 and not _int8_matmuls(out)
