"""Small ONNX graphs with shape computations written the way torch's exporter writes them (no torch needed).

* ``channel_shuffle()``: ShuffleNetV2's unit: ``x.chunk(2, dim=1)`` as Shape -> Gather -> Add -> Div -> Mul ->
  Slice (the bounds computed from the static shape), a branch on the second half, concat, and the channel
  shuffle (Reshape to groups, Transpose, Reshape back). TVM 0.27 imports it but cannot lower it.
* ``window_reshape()``: Swin-T's window partition: Pad whose pads are computed from Shape, then
  ``view(B, H // w, w, W // w, w, C)`` as Shape -> Gather -> Div -> Unsqueeze -> Concat -> Reshape with a -1.
  TVM 0.27's importer rejects it ("Reshape expects the input tensor to have known shape").
* ``runtime_pad()`` / ``runtime_reshape()``: the same ops with values read from a graph input, which nothing
  can fold: TVM's limitation, reported by name.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def _c(name, value, dtype="int64"):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype), name))


def channel_shuffle(channels: int = 8, hw: int = 4, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    half = channels // 2
    w = numpy_helper.from_array((rng.standard_normal((half, half, 1, 1)) * 0.5).astype("float32"), "w")
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _c("one", [1]), _c("zero", [0]), _c("two", [2]),
        helper.make_node("Gather", ["shape", "one"], ["c"], axis=0),
        helper.make_node("Add", ["c", "one"], ["c1"]),
        helper.make_node("Div", ["c1", "two"], ["half"]),
        helper.make_node("Mul", ["half", "one"], ["end0"]),
        helper.make_node("Slice", ["x", "zero", "end0", "one"], ["a"]),
        helper.make_node("Mul", ["half", "two"], ["end1"]),
        helper.make_node("Slice", ["x", "end0", "end1", "one"], ["b"]),
        helper.make_node("Conv", ["b", "w"], ["bc"]),
        helper.make_node("Relu", ["bc"], ["br"]),
        helper.make_node("Concat", ["a", "br"], ["cat"], axis=1),
        _c("groups", [1, 2, half, hw, hw]),
        helper.make_node("Reshape", ["cat", "groups"], ["g"]),
        helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3, 4]),
        _c("back", [1, channels, hw, hw]),
        helper.make_node("Reshape", ["t", "back"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, channels, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, hw, hw])],
                              initializer=[w])
    return helper.make_model(graph, opset_imports=OPSET)


def window_reshape(h: int = 6, w: int = 6, c: int = 4, window: int = 4, batch=1) -> onnx.ModelProto:
    """x (B, H, W, C) -> pad H, W up to a multiple of ``window`` (pads from Shape) -> (B, H/w, w, W/w, w, C)
    -> LayerNorm-free tail: a Relu. ``batch=None`` makes the batch dim symbolic."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _c("i1", [1]), _c("i2", [2]), _c("win", [window]), _c("zeros2", [0, 0]), _c("zeros1", [0]),
        helper.make_node("Gather", ["shape", "i1"], ["H"], axis=0),
        helper.make_node("Gather", ["shape", "i2"], ["W"], axis=0),
        # pad_b = (w - H % w) % w, same for W
        helper.make_node("Mod", ["H", "win"], ["hm"]),
        helper.make_node("Sub", ["win", "hm"], ["hp0"]),
        helper.make_node("Mod", ["hp0", "win"], ["hp"]),
        helper.make_node("Mod", ["W", "win"], ["wm"]),
        helper.make_node("Sub", ["win", "wm"], ["wp0"]),
        helper.make_node("Mod", ["wp0", "win"], ["wp"]),
        # pads for (B, H, W, C): begins 0,0,0,0 then ends 0,hp,wp,0
        helper.make_node("Concat", ["zeros2", "zeros2", "zeros1", "hp", "wp", "zeros1"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["xp"]),
        helper.make_node("Shape", ["xp"], ["pshape"]),
        helper.make_node("Gather", ["pshape", "i1"], ["PH"], axis=0),
        helper.make_node("Gather", ["pshape", "i2"], ["PW"], axis=0),
        helper.make_node("Div", ["PH", "win"], ["nh"]),
        helper.make_node("Div", ["PW", "win"], ["nw"]),
        _c("minus1", [-1]), _c("cc", [c]),
        helper.make_node("Concat", ["minus1", "nh", "win", "nw", "win", "cc"], ["vshape"], axis=0),
        helper.make_node("Reshape", ["xp", "vshape"], ["v"]),
        helper.make_node("Relu", ["v"], ["y"]),
    ]
    b = "B" if batch is None else batch
    ph, pw = -(-h // window) * window, -(-w // window) * window
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, h, w, c])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [b, ph // window, window, pw // window, window, c])])
    return helper.make_model(graph, opset_imports=OPSET)


def runtime_pad() -> onnx.ModelProto:
    """Pad whose pads are a graph input: known only at run time."""
    graph = helper.make_graph([helper.make_node("Pad", ["x", "pads"], ["y"])], "rtpad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                               helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    return helper.make_model(graph, opset_imports=OPSET)


def runtime_reshape() -> onnx.ModelProto:
    """Slice whose end is a graph input, then a Reshape with -1: the slice's shape is known only at run time."""
    nodes = [_c("s", [0]), _c("ax", [1]), _c("shp", [-1]),
             helper.make_node("Slice", ["x", "s", "e", "ax"], ["sl"]),
             helper.make_node("Reshape", ["sl", "shp"], ["y"])]
    graph = helper.make_graph(nodes, "rtreshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                               helper.make_tensor_value_info("e", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    return helper.make_model(graph, opset_imports=OPSET)


def ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
