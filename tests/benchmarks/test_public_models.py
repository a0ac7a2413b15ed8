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
    assert pm.LLAMA["num_attention_heads"] % pm.LLAMA["num_key_value_heads"] == 0
    assert pm.KNOWN_TVM_FAILURES <= set(pm.MODELS)


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
