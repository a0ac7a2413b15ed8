"""benchmarks/public_models.py: library definitions exported to ONNX (needs the optional `models` extra)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pm = importlib.import_module("public_models")
pk = importlib.import_module("profile_kernels")


def test_importing_the_set_needs_no_torch():
    # the registry and its sizes are plain data; only building a model imports torch
    assert {"resnet18", "convnext_tiny", "gpt2", "llama", "whisper_tiny_encoder", "qwen2"} <= set(pm.MODELS)
    assert {"llama_decode", "llama_decode_sym", "gpt2_decode", "gpt2_decode_sym"} <= set(pm.MODELS)
    assert all(pm.MODELS[n].dynamo for n in pm.MODELS if "_decode" in n)
    # greedy generation's two calls per decoder (generate_benchmark.py)
    assert {f"{n}_lm_{c}" for n in ("llama", "qwen2", "gpt2") for c in ("prefill128", "step")} <= set(pm.MODELS)
    assert pm.LLAMA["num_attention_heads"] % pm.LLAMA["num_key_value_heads"] == 0
    assert pm.KNOWN_TVM_FAILURES <= set(pm.MODELS)
    # timm's Inception-v3 (issue 28's CNN set) at its own resolution
    assert pm.MODELS["inception_v3"].family == "cnn" and pm.INCEPTION_IMAGE == 299


def test_batchnorm_calibration_keeps_activations_at_unit_scale():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), torch.nn.BatchNorm2d(8))
    with torch.no_grad():
        net[2].weight.mul_(0.02)                    # a layer that shrinks its input, as depthwise inits do
    x = torch.randn(1, 3, 16, 16)
    before = float(net.eval()(x).std())
    pm.calibrate_batchnorm(net, (1, 3, 16, 16), torch)
    after = float(net(x).std())
    assert not net.training
    assert before < 0.1 and 0.5 < after < 2.0


def test_zero_initialised_layers_get_random_weights():
    torch = pytest.importorskip("torch")
    head = torch.nn.Linear(8, 4)
    with torch.no_grad():
        head.weight.zero_()
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), head)
    kept = net[0].weight.detach().clone()
    assert pm.randomize_zero_layers(net, torch) == 1
    assert torch.equal(net[0].weight, kept)           # only the zero layer changes
    x = torch.randn(3, 8)
    out = net(x)                                      # the output now depends on the input
    assert float((out - head.bias).abs().max()) > 1e-3
    assert pm.randomize_zero_layers(net, torch) == 0


def test_squeezenet_export(tmp_path):
    pytest.importorskip("torch")
    try:
        pm.import_torchvision()
    except ImportError:
        pytest.skip("torchvision is not installed")
    ort = pytest.importorskip("onnxruntime")
    import onnx

    path = pm.export("squeezenet1_1", tmp_path, log=lambda *_: None)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert {p.key: p.value for p in model.metadata_props}[pm.FAMILY_KEY] == "cnn"
    mtime = path.stat().st_mtime_ns
    assert pm.export("squeezenet1_1", tmp_path) == path and path.stat().st_mtime_ns == mtime   # cached
    (x,) = pk.model_inputs(model)
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert y.shape == (1, 1000) and np.isfinite(y).all() and y.std() > 1e-3


@pytest.mark.slow
def test_qwen2_export_records_its_vocabulary(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    import onnx

    path = pm.export("qwen2", tmp_path, log=lambda *_: None)
    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    assert int(meta[pm.INT_HIGH_KEY]) == pm.QWEN2["vocab_size"]
    (ids,) = pk.model_inputs(model)
    assert ids.shape == (1, pm.QWEN2["seq"]) and 0 <= ids.min() and ids.max() < pm.QWEN2["vocab_size"]
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
    assert y.shape == (1, pm.QWEN2["seq"], pm.QWEN2["hidden_size"])


def test_symbolic_dims_are_generated_at_the_recorded_size():
    """A decode step's cache length is benchmarked at the size its export recorded, not at 1."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["k"], ["y"])], "g",
                              [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, "past", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, "past", 4])])
    model = helper.make_model(graph)
    assert pk.model_inputs(model)[0].shape == (1, 2, 1, 4)
    entry = model.metadata_props.add()
    entry.key, entry.value = pm.SYMBOLIC_DIMS_KEY, "past=7"
    assert pk.model_inputs(model)[0].shape == (1, 2, 7, 4)


@pytest.mark.slow
def test_llama_decode_step_with_symbolic_cache_imports_compiles_and_matches(tmp_path):
    """The transformers LLaMA decode step exported with the cache length symbolic: ``past`` stays one var of
    main's signature, and one build matches onnxruntime at several cache lengths."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    import onnx
    import tvm

    import tvm_ascendfuse as af
    from tests.helpers import assert_close, run_vm
    from tvm_ascendfuse.frontend import import_onnx

    path = pm.export("llama_decode_sym", tmp_path, log=lambda *_: None)
    model = onnx.load(str(path))
    assert {p.key: p.value for p in model.metadata_props}[pm.SYMBOLIC_DIMS_KEY] == f"past={pm.DECODE_PAST}"
    mod = import_onnx(str(path))
    params = mod["main"].params
    past = params[1].ty.shape.values[2]
    assert isinstance(past, tvm.tirx.Var) and all(p.ty.shape.values[2].same_as(past) for p in params[1:])
    result = af.compile_model(mod, portable=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    for length in (1, 64, 511, 2047):
        rng = np.random.default_rng(length)
        feeds = {i.name: (rng.integers(0, pm.LLAMA["vocab_size"], (1, 1)) if i.name == "input_ids" else
                          rng.standard_normal([1, pm.LLAMA["num_key_value_heads"], length, 64]).astype("float32"))
                 for i in sess.get_inputs()}
        assert_close(run_vm(result.executable, list(feeds.values())), sess.run(None, feeds), rtol=0, atol=1e-3)


def test_quantized_variants_go_through_onnxruntimes_quantizer(tmp_path):
    """The *_qdq / *_dynamic entries: QDQ with per-channel int8 weights and int8 activations, or
    MatMulInteger; the fp32 model's metadata (family) is kept."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    assert {"resnet50_qdq", "mobilenet_v2_qdq", "bert_dynamic"} <= set(pm.MODELS)
    assert pm.MODELS["bert_dynamic"].quantize == "dynamic" and pm.MODELS["resnet50_qdq"].base == "resnet50"
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["output"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype("float32"), "w"),
         numpy_helper.from_array(rng.standard_normal((1024, 10)).astype("float32"), "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    entry = model.metadata_props.add()
    entry.key, entry.value = pm.FAMILY_KEY, "cnn"
    src = tmp_path / "f.onnx"
    onnx.save(model, str(src))
    pm.quantize(src, tmp_path / "q.onnx", "qdq")
    q = onnx.load(str(tmp_path / "q.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    weight_dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
                 and inits[n.input[0]].dtype == np.int8 and inits[n.input[0]].ndim == 4]
    assert weight_dq and inits[weight_dq[0].input[1]].shape == (16,)          # per-channel scales
    assert {p.key: p.value for p in q.metadata_props}[pm.FAMILY_KEY] == "cnn"
    pm.quantize(src, tmp_path / "d.onnx", "dynamic")
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(tmp_path / "d.onnx")).graph.node}
