"""--verify: the build against an unfused reference on seeded inputs; a sabotaged kernel is found and named."""

import json

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir, tirx

import tvm_ascendfuse as af
import tvm_ascendfuse.schedule.apply as schedule_apply
from tvm_ascendfuse.schedule.base import ScheduleRule
from tvm_ascendfuse.cli import main
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.schedule.attention_projection import AttentionProjectionRule
from tvm_ascendfuse.verify import compare, make_inputs, onnxruntime_reference, verify_text
from tvm_ascendfuse.workloads import (bert_layer, conv_bn_relu, focus_conv, llama_block, ln_linear_gelu, mlp3,
                                      resnet50)

pytest.importorskip("onnxruntime")

SMALL = {
    "W1": lambda: conv_bn_relu(in_channels=8, out_channels=16, hw=12),
    "W2": lambda: resnet50(image=32, base_width=8, layers=(1, 1, 1, 1), num_classes=10),
    "W3": lambda: bert_layer(seq=16, hidden=64, heads=4, ffn=128, mask=True),
    "W4": lambda: ln_linear_gelu(rows=16, hidden=64, ffn=128),
    "W5": lambda: focus_conv(hw=32),
    "W6": lambda: mlp3(rows=8, width=64),
    "W7": lambda: llama_block(seq=16, hidden=64, heads=4, ffn=96),
}


@pytest.mark.parametrize("wid", list(SMALL))
def test_workloads_verify(wid):
    model = SMALL[wid]()
    result = af.compile_model(import_onnx(model), portable=True, verify=True,
                              reference=onnxruntime_reference(model), reference_name="onnxruntime")
    v = result.verification
    assert v.ok, verify_text(v.to_dict())
    assert v.reference == "onnxruntime" and result.report.sections["verify"]["ok"]
    assert all(o.max_abs < 1e-3 for o in v.outputs)


def _perturbed(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Every store into the kernel's output scaled by 1.01: a wrong schedule."""
    out = func.params[-1]

    def store(s):
        if s.buffer.same_as(out):
            return tirx.BufferStore(s.buffer, s.value * tirx.const(1.01, str(s.value.ty.dtype)), s.indices)
        return s

    return tvm_ffi.structural_map(func, (tirx.BufferStore, store))


class SabotageRule(ScheduleRule):
    """Schedules the attention + projection kernel as its rule does, then perturbs its output."""

    name = "sabotage"

    def __init__(self):
        self.inner = AttentionProjectionRule()

    def apply(self, func, target, host):
        sch = self.inner.apply(func, target, host)
        if sch is None:
            return None
        return s_tir.Schedule(tvm.IRModule({"main": _perturbed(sch.mod["main"])}))


def test_sabotaged_kernel_is_named(tmp_path, monkeypatch, capsys):
    path = tmp_path / "llama.onnx"
    onnx.save(SMALL["W7"](), str(path))
    monkeypatch.setattr(schedule_apply, "DEFAULT_RULES", (SabotageRule,) + schedule_apply.DEFAULT_RULES)
    out = tmp_path / "out"
    status = main(["compile", str(path), "-o", str(out), "--portable", "--verify", "--no-traffic-baseline"])
    printed = capsys.readouterr().out
    assert status == 1
    report = json.loads((out / "fusion_result.json").read_text())
    ver = report["verify"]
    assert not ver["ok"] and ver["reference"] == "onnxruntime"
    bad = ver["bisection"]["first_bad_kernel"]
    sabotaged = [k for k in report["kernels"] if k["rule"] == "sabotage"]
    assert len(sabotaged) == 1 and len(report["kernels"]) == 3
    assert bad["kernel"] == sabotaged[0]["name"] and bad["index"] == 1   # the FFN after it is not blamed
    assert "softmax" in bad["ops"] and bad["rule"] == "sabotage"
    assert "MISMATCH" in printed and bad["kernel"] in printed and "source ops: " in printed


def test_clean_build_passes_through_cli(tmp_path, capsys):
    path = tmp_path / "llama.onnx"
    onnx.save(SMALL["W7"](), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "o"), "--portable", "--verify"]) == 0
    assert "verify against onnxruntime (seed 0): OK" in capsys.readouterr().out


def embedding_model(vocab=50, dim=8):
    """ids (int64) -> Gather from a (vocab, dim) table -> Relu: out-of-range ids would be undefined."""
    table = np.random.default_rng(0).standard_normal((vocab, dim)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])], "emb",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, dim])], [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_token_ids_stay_below_the_vocabulary():
    model = embedding_model(vocab=50)
    mod = import_onnx(model)
    arrays, info = make_inputs(mod, seed=3)
    assert info[0]["range"] == "[0, 50)" and arrays[0].dtype == np.int64
    assert arrays[0].min() >= 0 and arrays[0].max() < 50 and arrays[0].max() > 10
    result = af.compile_model(mod, portable=True, verify=True, reference=onnxruntime_reference(model))
    assert result.verification.ok


def test_compare_tolerances():
    ref = np.linspace(-10, 10, 100).astype("float32")
    assert compare("y", ref + 1e-4, ref).ok                     # within atol scaled by max |ref| = 10
    assert not compare("y", ref + 0.1, ref).ok
    # float32: 1e-3 of the output's scale anywhere, even on its small elements; beyond it, never
    drift = np.where(np.abs(ref) < 1, 0.009, 0.0).astype("float32")
    assert compare("y", ref + drift, ref).ok
    assert not compare("y", ref + 2 * drift, ref).ok
    tiny = ref * 1e-5                                           # a small output: the bound scales with it
    assert not compare("y", tiny + 1e-6, tiny).ok and compare("y", tiny + 5e-8, tiny).ok
    assert not compare("y", ref[:50], ref).ok                   # shape
    nan = ref.copy()
    nan[3] = np.nan
    assert not compare("y", nan, ref).ok and compare("y", nan, nan).ok
    ints = np.arange(5, dtype="int32")
    assert compare("i", ints, ints).ok and not compare("i", ints + 1, ints).ok


def test_tvm_default_reference_when_none_given():
    mod = import_onnx(SMALL["W6"]())
    result = af.compile_model(mod, portable=True, verify=True)
    assert result.verification.ok and result.verification.reference == "tvm_default"


# ---- 16-bit builds: tolerance by the storage dtype, on the output's scale and by cosine ---------------------
def test_compare_sixteen_bit():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000).astype("float32")
    # what rounding every kernel's output to fp16 through a deep model adds up to: ~1% of the output's scale
    rounded = ref + 0.004 * np.abs(ref).max() * rng.standard_normal(1000).astype("float32")
    assert not compare("y", rounded, ref).ok                     # beyond the float32 tolerance
    c = compare("y", rounded, ref, storage="float16")
    assert c.ok and c.cosine > 0.999 and c.to_dict()["min_cosine"] == 0.999
    flipped = rounded.copy()
    flipped[:40] *= -1                                           # a wrong kernel: error and cosine both off
    bad = compare("y", flipped, ref, storage="float16")
    assert not bad.ok and bad.cosine < 0.999
    far = rounded + 0.05 * np.abs(ref).max()                     # cosine still high, error above 3% of scale
    assert not compare("y", far, ref, storage="float16").ok
    assert compare("y", ref.astype("float16"), ref.astype("float16"), storage="float16").ok
    nan = rounded.copy()
    nan[3] = np.nan
    assert not compare("y", nan, ref, storage="float16").ok


def _fp16_onnx(model):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=False)


def test_fp16_model_verifies_against_onnxruntime(tmp_path, capsys):
    path = tmp_path / "llama16.onnx"
    onnx.save(_fp16_onnx(SMALL["W7"]()), str(path))
    out = tmp_path / "o"
    assert main(["compile", str(path), "-o", str(out), "--portable", "--verify", "--no-traffic-baseline",
                 "--html"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "fusion_result.json").read_text())
    assert "GM dtypes (in → out)" in (out / "fusion_report.html").read_text()
    o = report["verify"]["outputs"][0]
    assert report["verify"]["ok"] and o["cosine"] >= 0.999 and o["dtype"] == "float16/float16"
    assert "cosine" in printed and "GM dtypes" in printed and "f16" in printed
    assert report["precision"]["dtype"] == "float16"


class LargeSabotageRule(SabotageRule):
    """The attention kernel's output scaled by 1.2: beyond any 16-bit rounding."""

    def apply(self, func, target, host):
        sch = self.inner.apply(func, target, host)
        if sch is None:
            return None
        out = sch.mod["main"].params[-1]

        def store(s):
            if s.buffer.same_as(out):
                return tirx.BufferStore(s.buffer, s.value * tirx.const(1.2, str(s.value.ty.dtype)), s.indices)
            return s

        return s_tir.Schedule(tvm.IRModule({"main": tvm_ffi.structural_map(sch.mod["main"],
                                                                            (tirx.BufferStore, store))}))


def test_sixteen_bit_build_names_the_wrong_kernel(tmp_path, monkeypatch):
    """force_fp16: the build's kernels read and write fp16, the reference kernels float32; the bisection
    converts between them and still names the sabotaged kernel, not the rounding of the others."""
    model = SMALL["W7"]()
    mod = import_onnx(model)
    clean = af.compile_model(mod, portable=True, verify=True, reference=onnxruntime_reference(model),
                             precision_mode="force_fp16")
    assert clean.verification.ok, verify_text(clean.verification.to_dict())
    assert clean.verification.outputs[0].cosine >= 0.999
    monkeypatch.setattr(schedule_apply, "DEFAULT_RULES", (LargeSabotageRule,) + schedule_apply.DEFAULT_RULES)
    bad = af.compile_model(mod, portable=True, verify=True, reference=onnxruntime_reference(model),
                           precision_mode="force_fp16")
    v = bad.verification
    assert not v.ok
    first = v.bisection["first_bad_kernel"]
    assert first is not None and first["rule"] == "sabotage" and "softmax" in first["ops"]


def test_bf16_mode_on_310p_is_a_user_error(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(SMALL["W6"](), str(path))
    status = main(["compile", str(path), "-o", str(tmp_path / "o"), "--target", "ascend310p",
                   "--precision-mode", "force_bf16"])
    assert status == 2
    assert "force_bf16" in capsys.readouterr().err


def test_quantized_model_is_verified_by_cosine_and_steps(tmp_path, capsys):
    """A QDQ model verifies against onnxruntime by cosine (its rounding differs a step here and there);
    a build that is wrong by more than rounding still fails."""
    from tests.graph_fusion.quant_models import qdq_model
    from tvm_ascendfuse.verify import QUANT_COSINE, is_quantized

    model = qdq_model("conv", residual=True)
    path = tmp_path / "qdq.onnx"
    onnx.save(model, str(path))
    assert is_quantized(import_onnx(model)) and not is_quantized(import_onnx(SMALL["W6"]()))
    assert main(["compile", str(path), "-o", str(tmp_path / "o"), "--portable", "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "cosine" in printed and "quantized model" in printed
    report = json.loads((tmp_path / "o" / "fusion_result.json").read_text())
    assert report["verify"]["outputs"][0]["cosine"] >= QUANT_COSINE
    ref = np.random.default_rng(0).standard_normal(1000).astype("float32")
    assert compare("y", np.round(ref * 10) / 10, ref, quantized=True).ok          # a rounding step apart
    assert not compare("y", ref + np.random.default_rng(1).standard_normal(1000).astype("float32"), ref,
                       quantized=True).ok                                          # noise as large as the signal
    q = np.arange(-5, 5, dtype="int8")
    assert compare("q", q + 1, q, quantized=True).ok and not compare("q", q + 2, q, quantized=True).ok


def test_onnxruntime_reference_prints_no_warnings_about_the_model(capfd):
    """A quantized export carries initializers no node uses; ORT warned once per initializer on the
    terminal of every ``--verify`` (a line each, dozens for a QDQ MobileNet). The reference session prints
    errors only."""
    unused = [numpy_helper.from_array(np.ones(2, np.float32), f"unused_{i}") for i in range(3)]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], unused)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    run = onnxruntime_reference(model)
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(run([x])[0], np.maximum(x, 0))
    err = capfd.readouterr().err
    assert "unused_" not in err, err


def _integer_model(op: str, a_shape, w: np.ndarray, a_zp: int, w_zp: np.ndarray) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.uint8(a_zp), "azp"),
             numpy_helper.from_array(w_zp, "wzp")]
    out_shape = [a_shape[0], w.shape[1]] if op == "MatMulInteger" else None
    node = helper.make_node(op, ["a", "w", "azp", "wzp"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    return model


def test_integer_ops_reference_is_exact():
    """MatMulInteger / ConvInteger in the reference give the exact integer sums, on operands that saturate a
    16-bit pair sum (255 x 127 twice: ONNX Runtime's own kernel on a CPU without VNNI clips those)."""
    rng = np.random.default_rng(0)
    a = rng.integers(200, 256, (8, 64), dtype=np.uint8)
    w = rng.integers(100, 128, (64, 16), dtype=np.int8)
    wzp = np.zeros(16, np.int8)
    wzp[3] = 5                                   # a per-column zero point
    (got,) = onnxruntime_reference(_integer_model("MatMulInteger", a.shape, w, 3, wzp))([a])
    want = (a.astype(np.int64) - 3) @ (w.astype(np.int64) - wzp.astype(np.int64))
    np.testing.assert_array_equal(got, want)

    x = rng.integers(200, 256, (1, 8, 6, 6), dtype=np.uint8)
    k = rng.integers(100, 128, (4, 8, 3, 3), dtype=np.int8)
    kzp = np.array([0, 2, 0, -1], np.int8)      # per output channel
    (got,) = onnxruntime_reference(_integer_model("ConvInteger", x.shape, k, 7, kzp))([x])
    xs = x.astype(np.int64) - 7
    ks = k.astype(np.int64) - kzp.astype(np.int64)[:, None, None, None]
    want = np.zeros((1, 4, 4, 4), np.int64)
    for i in range(4):
        for j in range(4):
            want[0, :, i, j] = np.einsum("chw,mchw->m", xs[0, :, i:i + 3, j:j + 3], ks)
    np.testing.assert_array_equal(got, want)
