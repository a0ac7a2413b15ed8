"""Small QDQ models (ONNX QuantizeLinear/DequantizeLinear around a conv or matmul, as ORT's static QDQ
quantizer writes them) and their comparison with onnxruntime in quantization steps."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.graph_fusion.common import onnx_model

ONNX_INT = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}


def _act_params(dtype: str, scale: float, rng) -> tuple[np.ndarray, np.ndarray]:
    zp = rng.integers(-20, 20) if dtype == "int8" else rng.integers(100, 150)
    return np.array(scale, "float32"), np.array(zp, dtype)


def qdq_model(op="conv", act="int8", per_channel=True, bias=True, relu=False, residual=False, requant=True,
              cin=16, cout=24, size=8, kernel=3, stride=1, pad=1, rows=6, seed=0):
    """``Q(x) -> DQ -> op(., DQ(W_q)) [+ b] [relu] [+ DQ(Q(x))-shaped residual] [-> Q -> DQ]``.

    ``op``: "conv" (NCHW, ``kernel`` x ``kernel``), "depthwise" (the conv with one input channel per output
    channel: ``cin`` is ``cout``), "matmul" (x: rows x cin) or "gemm" (transB weight)."""
    if op == "depthwise":
        cin = cout
    rng = np.random.default_rng(seed)
    inits, nodes = {}, []
    sx, zx = _act_params(act, 0.04, rng)
    inits.update(sx=sx, zx=zx)
    nodes += [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
              helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"])]
    if op in ("conv", "depthwise"):
        wshape = (cout, 1 if op == "depthwise" else cin, kernel, kernel)
        axis = 0
    elif op == "gemm":
        wshape, axis = (cout, cin), 0
    else:
        wshape, axis = (cin, cout), 1
    wq = rng.integers(-127, 128, wshape).astype("int8")
    ws = (rng.uniform(0.5, 1.5, cout) * 0.01 / np.sqrt(wshape[1])).astype("float32")   # fan-in over channels
    inits.update(wq=wq, ws=ws if per_channel else np.array(ws[0], "float32"),
                 wz=np.zeros(cout if per_channel else (), "int8"))
    nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=axis))
    ins = ["xd", "wd"] + (["b"] if bias and op != "matmul" else [])
    if bias:
        inits["b"] = rng.standard_normal(cout).astype("float32") * 0.1
    if op in ("conv", "depthwise"):
        nodes.append(helper.make_node("Conv", ins, ["y0"], kernel_shape=[kernel, kernel], pads=[pad] * 4,
                                      strides=[stride, stride], group=cout if op == "depthwise" else 1))
        xshape = (1, cin, size, size)
        osz = (size + 2 * pad - kernel) // stride + 1
        yshape = (1, cout, osz, osz)
    else:
        if op == "gemm":
            nodes.append(helper.make_node("Gemm", ins, ["y0"], transB=1))
        else:
            nodes.append(helper.make_node("MatMul", ins, ["y0"]))
            if bias:
                nodes.append(helper.make_node("Add", ["y0", "b"], ["y0b"]))
        xshape, yshape = (rows, cin), (rows, cout)
    last = "y0b" if op == "matmul" and bias else "y0"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["yr"]))
        last = "yr"
    if residual:   # a second quantized input of the output's shape, added in float (ResNet's skip)
        sr, zr = _act_params(act, 0.05, rng)
        inits.update(sr=sr, zr=zr)
        nodes += [helper.make_node("QuantizeLinear", ["r", "sr", "zr"], ["rq"]),
                  helper.make_node("DequantizeLinear", ["rq", "sr", "zr"], ["rd"]),
                  helper.make_node("Add", [last, "rd"], ["ya"])]
        last = "ya"
    if requant:
        so, zo = _act_params(act, 0.03, rng)
        inits.update(so=so, zo=zo)
        nodes += [helper.make_node("QuantizeLinear", [last, "so", "zo"], ["yq"]),
                  helper.make_node("DequantizeLinear", ["yq", "so", "zo"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    inputs = {"x": xshape}
    if residual:
        inputs["r"] = yshape
    return onnx_model(nodes, inputs, {"y": yshape}, inits)


def output_step(model) -> float | None:
    """The output's quantization step (scale of its last QuantizeLinear), None for a float output."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    qs = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.output[0] == "yq"]
    return float(inits[qs[0].input[1]]) if qs else None


def agreement(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(cosine, max |ours - ref|)."""
    a, b = np.asarray(ours, "float64").ravel(), np.asarray(ref, "float64").ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)), float(np.abs(a - b).max())
