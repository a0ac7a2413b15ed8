"""Small ONNX models for the tuning tests: a stack of Linear+bias+ReLU layers (with chained GEMMs off, each
layer is its own Matmul-rule kernel; layers of equal shape are one distinct kernel launched several times)."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

NO_CHAIN = {"ChainedGemmFusionPass": "off"}


def mlp(widths, rows=16, seed=0):
    rng = np.random.default_rng(seed)
    nodes, inits, cur = [], [], "x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        inits += [numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype("float32"), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal((b,)).astype("float32"), f"b{i}")]
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"y{i}"])]
        cur = f"y{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, widths[0]])],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [rows, widths[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
