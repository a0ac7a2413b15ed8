"""A small ONNX graph writer for the workload builders.

``onnx.helper`` wants every node, initializer and value_info spelled out by hand; this keeps the builders
readable (one line per exported op) and gives every model the same opset, IR version and seeded weights.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# onnx 1.23 writes IR version 14 by default, which onnxruntime 1.31 refuses ("Unsupported model IR version").
IR_VERSION = 9


class GraphWriter:
    """Collects nodes and fp32 initializers; ``op`` returns the output name so calls nest like the math."""

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._count: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        n = self._count.get(hint, 0)
        self._count[hint] = n + 1
        return f"{hint}_{n}" if n else hint

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def const(self, value, hint: str = "c", dtype=np.float32) -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def ints(self, values, hint: str = "shape") -> str:
        return self.const(np.asarray(values, dtype=np.int64), hint, dtype=np.int64)

    def op(self, op_type: str, inputs, hint: str | None = None, out: str | None = None, **attrs) -> str:
        """Append one node; ``out`` fixes the result name (use it for graph outputs)."""
        outs = [out or self.fresh(hint or op_type.lower())]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh("n_" + op_type), **attrs))
        return outs[0]

    # -- seeded weights ------------------------------------------------------------------------------------
    def normal(self, shape, std: float, hint: str) -> str:
        return self.const(self.rng.standard_normal(shape) * std, hint)

    def uniform(self, shape, low: float, high: float, hint: str) -> str:
        return self.const(self.rng.uniform(low, high, shape), hint)

    def finish(self, outputs: dict[str, list[int]], doc: str = "") -> onnx.ModelProto:
        """Declare the graph outputs (names made with ``op(..., out=name)``) and build a checked model."""
        outs = []
        for name, shape in outputs.items():
            outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        graph = helper.make_graph(self.nodes, self.name, self.inputs, outs, self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="tvm_ascendfuse.workloads")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model
