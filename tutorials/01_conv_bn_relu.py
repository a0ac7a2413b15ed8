"""Tutorial 1: compile Conv(64->128, 3x3)+BatchNorm+ReLU with the ascendfuse pipeline.

What happens:
  1. the repo builds the ONNX model itself (random weights, 1x64x56x56 input);
  2. ``ascendfuse compile`` folds BN into the conv weights (ConvBatchnormFusionPass) and fuses
     conv + bias + ReLU into one UB kernel, writing the library, the fused IR and fusion_result.json;
  3. we load the library and check it against ONNX Runtime.

Run:  .venv/bin/python tutorials/01_conv_bn_relu.py [--out DIR]
"""

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax

from tvm_ascendfuse.cli import main as ascendfuse
from tvm_ascendfuse.workloads import conv_bn_relu


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tutorial_out", help="where the model and compiled files go")
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)

    model_path = out / "conv_bn_relu.onnx"
    onnx.save(conv_bn_relu(), str(model_path))
    print(f"built {model_path}\n")

    # The same as typing: ascendfuse compile tutorial_out/conv_bn_relu.onnx --target ascend910b -o tutorial_out
    status = ascendfuse(["compile", str(model_path), "--target", "ascend910b", "-o", str(out)])
    if status != 0:
        raise SystemExit(status)

    report = json.loads((out / "fusion_result.json").read_text())
    x = np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype("float32")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / "conv_bn_relu.so")), tvm.cpu())
    ours = vm["main"](tvm.runtime.tensor(x)).numpy()

    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    # relative to the output's scale: an absolute tolerance would pass a wrong kernel on a small output
    err = float(np.max(np.abs(ours - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    print(f"\nkernels: {report['summary']['kernels_after']}, "
          f"ConvBatchnormFusionPass effect_times: {report['graph_fusion']['ConvBatchnormFusionPass']['effect_times']}")
    print(f"max |ours - onnxruntime| / max |onnxruntime| = {err:.2e}  ({'OK' if err < 1e-4 else 'MISMATCH'} at 1e-4)")
    if err >= 1e-4:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
