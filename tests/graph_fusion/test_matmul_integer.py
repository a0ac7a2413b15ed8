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
    # both GEMMs run on the int8 rule (the next DynamicQuantizeLinear's min/max over the first one's output
    # is a kernel of its own: the grouping keeps reductions out of int8 GEMM kernels)
    assert [k["rule"] for k in result.report.kernels if any(op.startswith("matmul") for op in k["ops"])] \
        == ["matmul_int8"] * 2


def test_on_by_default(tmp_path):
    result = compile_ours(import_onnx(_mlp(tmp_path)), portable=False)
    rec = result.report.get(P.switch_name)
    assert rec.match_times == 2 and rec.effect_times == 2


def test_switched_off_keeps_the_int32_matmul(tmp_path):
    model = _mlp(tmp_path)
    kept = SafeFoldConstant(keep=("relax.dequantize",))(import_onnx(model))
    out, rec = run_pass(P, kept, enabled=False)
    assert rec.match_times == 2 and rec.effect_times == 0 and not _int8_matmuls(out)


def _encoder_tail(tmp_path, rows=32, d=64):
    """BERT's attention-output tail: MatMul(W1) + b1 + residual -> LayerNorm -> MatMul(W2) + b2, quantized by
    ORT's quantize_dynamic (each MatMul's input through its own DynamicQuantizeLinear)."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((d, d)).astype("float32") * 0.1,
             "b1": rng.standard_normal(d).astype("float32") * 0.1,
             "g": 1 + rng.standard_normal(d).astype("float32") * 0.1,
             "be": rng.standard_normal(d).astype("float32") * 0.1,
             "w2": rng.standard_normal((d, 32)).astype("float32") * 0.1,
             "b2": rng.standard_normal(32).astype("float32") * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Add", ["hb", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "be"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["y"])]
    model = onnx_model(nodes, {"x": (1, rows, d)}, {"y": (1, rows, 32)}, inits, opset=17)
    src, dst = tmp_path / "tail.onnx", tmp_path / "tail_dyn.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst))
    return onnx.load(dst)


def test_gemm_before_a_layer_norm_stays_an_int8_kernel(tmp_path):
    """The grouping keeps the LayerNorm (and the next DynamicQuantizeLinear's min/max) out of the int8 GEMM's
    kernel: with them inside, the kernel would go to the generic GEMM + row-reduction rule."""
    model = _encoder_tail(tmp_path)
    x = np.random.default_rng(1).standard_normal((1, 32, 64)).astype("float32")
    result = compile_ours(import_onnx(model), portable=False, switches={"GraphFusion": {P.switch_name: "on"}})
    gemm_rules = [k["rule"] for k in result.report.kernels if any(op.startswith("matmul") for op in k["ops"])]
    assert gemm_rules and set(gemm_rules) == {"matmul_int8"}, gemm_rules
    ours, ref = run_vm(result.executable, [x]), run_ort(model, [x])
    cos, diff = agreement(ours, ref)
    # the LayerNorm's float rounding may move the second GEMM's quantized input by one step here and there
    assert cos >= 0.999 and diff <= 0.02 * float(np.abs(ref).max()), (cos, diff / float(np.abs(ref).max()))


def test_int8_siblings_stay_apart_each_with_its_dequantizing_epilogue(tmp_path):
    """Q/K/V-like siblings of one dynamically quantized input are not merged: merged, each one's zero-point
    correction, scale and bias would sit behind a slice, outside every int8 kernel."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    inits, nodes, outs = {}, [], {}
    for i, n in enumerate((48, 32, 64)):     # widths apart: one kernel each in the report
        inits[f"w{i}"] = rng.standard_normal((64, n)).astype("float32") * 0.1
        inits[f"b{i}"] = rng.standard_normal(n).astype("float32") * 0.1
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"h{i}"]),
                  helper.make_node("Add", [f"h{i}", f"b{i}"], [f"y{i}"])]
        outs[f"y{i}"] = (1, 16, n)
    src, dst = tmp_path / "qkv.onnx", tmp_path / "qkv_dyn.onnx"
    onnx.save(onnx_model(nodes, {"x": (1, 16, 64)}, outs, inits), src)
    quantize_dynamic(str(src), str(dst))
    model = onnx.load(dst)
    result = compile_ours(import_onnx(model), portable=False, switches={"GraphFusion": {P.switch_name: "on"}})
    merge = result.report.get("MatMulSiblingMergeFusionPass")
    assert merge.effect_times == 0
    gemms = [k for k in result.report.kernels if any(op.startswith("matmul") for op in k["ops"])]
    assert [k["rule"] for k in gemms] == ["matmul_int8"] * 3
    assert all(any(op.startswith("multiply") for op in k["ops"]) for k in gemms)   # the scale in the kernel
    x = rng.standard_normal((1, 16, 64)).astype("float32")
    for ours, ref in zip(run_vm(result.executable, [x]), run_ort(model, [x])):
        cos, diff = agreement(ours, ref)
        assert cos >= 0.9999 and diff <= 1e-4 * float(np.abs(ref).max()), (cos, diff)
