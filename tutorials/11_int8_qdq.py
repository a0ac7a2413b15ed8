"""Tutorial 11: an INT8 model from ONNX Runtime's quantizer, compiled, checked, and read kernel by kernel.

What happens:
  1. the repo builds a small MobileNetV2-style network as a float32 ONNX model (stem conv, an inverted residual
     block: 1x1 expansion, 3x3 depthwise, 1x1 projection with 24 channels and a residual add, ReLU6 as Clip,
     global average pool, a classifier; random weights);
  2. ONNX Runtime's ``quantize_static`` writes its QDQ form (QuantizeLinear/DequantizeLinear around every conv
     and the Gemm, per-channel int8 weights, int8 activations, calibrated on a few random inputs), as a
     deployment tool for an NPU would;
  3. ``compile_model(..., verify=True)`` compiles the QDQ model and checks it against ONNX Runtime running the
     same QDQ model: a quantized model is checked by cosine (>= 0.99) and its error in output quantization
     steps, since two runtimes may round a value on either side of a step;
  4. the report says what ran in int8: the graph passes that rewrote the QDQ convs (``Conv2DQuantFusionPass``,
     ``DepthwiseConv2DQuantFusionPass``, ``MatMulQuantFusionPass``), and per kernel its schedule rule and the
     dtypes it reads and writes in GM (uint8/int8 between the int8 kernels, an int32 accumulator inside).
     ``conv2d_int8`` is the AVX-512 VNNI dot-product rule; on a host without VNNI the generic conv rule runs
     the same int8 kernel in int32 arithmetic.

Run:  .venv/bin/python tutorials/11_int8_qdq.py [--size 224 --out int8_out]
"""

import argparse
import os
import tempfile

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tvm_ascendfuse as af  # noqa: E402
from tvm_ascendfuse.frontend import import_onnx  # noqa: E402
from tvm_ascendfuse.verify import onnxruntime_reference  # noqa: E402

INT8_PASSES = ("Conv2DQuantFusionPass", "DepthwiseConv2DQuantFusionPass", "MatMulQuantFusionPass")


def float_model(size: int, seed: int = 0) -> onnx.ModelProto:
    """Stem 3x3/2 conv (3 -> 16) + ReLU6, then expansion 1x1 (16 -> 64) + ReLU6, depthwise 3x3 + ReLU6,
    projection 1x1 (64 -> 24), a 1x1 (16 -> 24) shortcut and the residual add, pool, classifier (10)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def conv(name, x, cin, cout, k, stride=1, group=1, relu6=True):
        w = (rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))).astype("float32")
        b = (rng.standard_normal(cout) * 0.1).astype("float32")
        inits.extend([numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], kernel_shape=[k, k],
                                      pads=[k // 2] * 4, strides=[stride, stride], group=group))
        if not relu6:
            return name
        nodes.append(helper.make_node("Clip", [name, "zero", "six"], [name + "_r"]))
        return name + "_r"

    inits.extend([numpy_helper.from_array(np.array(0, "float32"), "zero"),
                  numpy_helper.from_array(np.array(6, "float32"), "six")])
    x = conv("stem", "input", 3, 16, 3, stride=2)
    e = conv("expand", x, 16, 64, 1)
    d = conv("dw", e, 64, 64, 3, group=64)
    p = conv("project", d, 64, 24, 1, relu6=False)
    s = conv("shortcut", x, 16, 24, 1, relu6=False)
    nodes += [helper.make_node("Add", [p, s], ["sum"]),
              helper.make_node("GlobalAveragePool", ["sum"], ["pool"]),
              helper.make_node("Flatten", ["pool"], ["flat"])]
    fc_w = (rng.standard_normal((10, 24)) * 0.3).astype("float32")
    inits.extend([numpy_helper.from_array(fc_w, "fc_w"), numpy_helper.from_array(np.zeros(10, "float32"), "fc_b")])
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(nodes, "tiny_mobilenet",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def quantize(model: onnx.ModelProto, size: int, workdir: str) -> onnx.ModelProto:
    """ONNX Runtime's static QDQ quantization: per-channel int8 weights, int8 activations."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.batches = iter([{"input": rng.standard_normal((1, 3, size, size)).astype("float32")}
                                 for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    src, dst = os.path.join(workdir, "float.onnx"), os.path.join(workdir, "qdq.onnx")
    onnx.save(model, src)
    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return onnx.load(dst)


def dtypes(func) -> str:
    """A kernel's GM dtypes: its inputs (constants included) -> its outputs (the last parameters)."""
    short = {"float32": "f32", "uint8": "u8", "int8": "i8", "int32": "i32"}
    types = [short.get(str(p.ty.dtype), str(p.ty.dtype)) for p in func.params if hasattr(p.ty, "dtype")]
    return f"{','.join(sorted(set(types[:-1])))} -> {types[-1]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=224, help="input height and width")
    ap.add_argument("--out", default="int8_out", help="where the QDQ model and the library go")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        qdq = quantize(float_model(args.size), args.size, tmp)
    onnx.save(qdq, os.path.join(args.out, "tiny_mobilenet_qdq.onnx"))
    ops = [n.op_type for n in qdq.graph.node]
    print(f"QDQ model: {ops.count('QuantizeLinear')} QuantizeLinear, {ops.count('DequantizeLinear')} "
          f"DequantizeLinear, {ops.count('Conv')} Conv, {ops.count('Gemm')} Gemm")

    result = af.compile_model(import_onnx(qdq), verify=True, reference=onnxruntime_reference(qdq),
                              reference_name="onnxruntime")
    result.executable.export_library(os.path.join(args.out, "tiny_mobilenet_qdq.so"))

    print("\ngraph passes that rewrote quantized ops:")
    rewritten = 0
    for name in INT8_PASSES:
        rec = result.report.get(name)
        rewritten += rec.effect_times
        print(f"   {name:32s} rewrote {rec.effect_times} of {rec.match_times}")
        for refusal in rec.not_effective:
            print(f"      kept in float: {refusal.get('failed', refusal)}")

    print("\nkernels (schedule rule, GM dtypes in -> out, ops):")
    int8_kernels = 0
    for k in result.report.kernels:
        io = dtypes(result.scheduled_module[k["name"]])
        conv_or_gemm = any(op.startswith(("conv2d", "matmul")) for op in k["ops"])
        # an int8 conv/GEMM reads 8-bit operands (its activation may be quantized inside the kernel, from
        # float, and only its weight then comes in as int8)
        int8_kernels += conv_or_gemm and bool({"u8", "i8"} & set(io.split(" -> ")[0].split(",")))
        print(f"   {k['rule']:18s} {io:22s} {'+'.join(k['ops'])[:80]}")

    out = result.verification.outputs[0]
    print(f"\nvs ONNX Runtime on the QDQ model: cosine {out.cosine:.5f}, max |ours - ort| {out.max_abs:.4f}: "
          f"{'OK' if out.ok else 'MISMATCH'}")
    ok = out.ok and rewritten == ops.count("Conv") + ops.count("Gemm") and int8_kernels >= 4
    print(f"tutorial checks: {'OK' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
