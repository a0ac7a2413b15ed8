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


def decode_step(hidden: int = 32, heads: int = 4, kv_heads: int = 2, head_dim: int = 8, seed: int = 0,
                past="past") -> onnx.ModelProto:
    """One decode step of a LLaMA-style attention with an explicit KV cache, written the way the dynamo
    exporter writes ``transformers``' models with a symbolic cache length ``past`` (``past=None``: a static
    cache length of 5, for comparison).

    Inputs ``x`` (1, 1, hidden), ``past_k``/``past_v`` (1, kv_heads, past, head_dim); outputs the attention
    output (1, 1, hidden) and the new cache (1, kv_heads, past + 1, head_dim). The size arithmetic on ``past``:
    ``Shape(past_k)[2:3] -> Squeeze`` (the cache length), ``Add(arange [0], len)`` the new token's position (a
    rank-1 value TVM 0.27 makes a scalar) ``-> Unsqueeze(axes=[0, 1]) -> Cast`` into the rotary angle;
    ``Range(0, len + 1)`` the key positions and ``LessOrEqual`` the causal mask, ``Expand``ed to a shape from
    ``Concat(.., Reshape(len + 1, [-1]))``; the grouped-query repeat of K/V as ``Unsqueeze -> Expand -> Reshape``
    with shapes from ``Shape -> Gather -> Unsqueeze -> Concat``; the concat of the cache and the new K/V along
    the length axis, and the attention over it."""
    rng = np.random.default_rng(seed)
    rep = heads // kv_heads
    w = {n: numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype("float32"), n)
         for n, s in [("wq", (hidden, heads * head_dim)), ("wk", (hidden, kv_heads * head_dim)),
                      ("wv", (hidden, kv_heads * head_dim)), ("wo", (heads * head_dim, hidden))]}
    inv_freq = numpy_helper.from_array((1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim)).astype("float32"),
                                       "inv_freq")
    half = head_dim // 2
    nodes = [
        _c("zero_v", [0]), _c("one_v", [1]), _c("two_v", [2]), _c("one", 1), _c("zero", 0), _c("axes01", [0, 1]),
        _c("minus1_v", [-1]), _c("half_v", [half]), _c("hd_v", [head_dim]), _c("big_v", [2 ** 62]),
        _c("last_v", [3]), _c("kvh_v", [kv_heads]), _c("rep_v", [rep]), _c("heads_v", [heads]),
        _c("two", 2),
        # the cache length and the new token's position
        helper.make_node("Shape", ["past_k"], ["len_v"], start=2, end=3),
        helper.make_node("Squeeze", ["len_v"], ["len"]),
        helper.make_node("Add", ["zero_v", "len"], ["pos"]),                       # shape (1,)
        helper.make_node("Add", ["len", "one"], ["total"]),
        helper.make_node("Range", ["zero", "total", "one"], ["kpos"]),
        helper.make_node("Unsqueeze", ["pos", "axes01"], ["pos3"]),               # (1, 1, 1)
        helper.make_node("Unsqueeze", ["kpos", "axes01"], ["kpos3"]),
        helper.make_node("Unsqueeze", ["kpos3", "two_v"], ["kpos4"]),             # (1, 1, 1, past + 1)
        helper.make_node("LessOrEqual", ["kpos4", "pos3"], ["allowed"]),
        helper.make_node("Reshape", ["total", "minus1_v"], ["total_v"]),
        helper.make_node("Concat", ["one_v", "one_v", "one_v", "total_v"], ["mask_shape"], axis=0),
        helper.make_node("Expand", ["allowed", "mask_shape"], ["allowed4"]),
        _c("zero_f", 0.0, "float32"), _c("ninf", -3.4028234663852886e38, "float32"),
        helper.make_node("Where", ["allowed4", "zero_f", "ninf"], ["mask"]),
        # rotary angle of the position
        helper.make_node("Cast", ["pos3"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["posf", "inv_freq"], ["freqs"]),
        helper.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1),
        helper.make_node("Cos", ["emb"], ["cos3"]), helper.make_node("Sin", ["emb"], ["sin3"]),
        helper.make_node("Unsqueeze", ["cos3", "one_v"], ["cos"]),
        helper.make_node("Unsqueeze", ["sin3", "one_v"], ["sin"]),
    ]

    def heads_of(src, n_heads, name):
        nodes.extend([helper.make_node("MatMul", ["x", "w" + name], [name + "_p"]),
                      _c(name + "_shape", [1, 1, n_heads, head_dim]),
                      helper.make_node("Reshape", [name + "_p", name + "_shape"], [name + "_r"]),
                      helper.make_node("Transpose", [name + "_r"], [name + "_t"], perm=[0, 2, 1, 3])])
        return name + "_t"

    def rotary(t):
        nodes.extend([helper.make_node("Slice", [t, "zero_v", "half_v", "last_v"], [t + "_a"]),
                      helper.make_node("Slice", [t, "half_v", "big_v", "last_v"], [t + "_b"]),
                      helper.make_node("Neg", [t + "_b"], [t + "_nb"]),
                      helper.make_node("Concat", [t + "_nb", t + "_a"], [t + "_rot"], axis=-1),
                      helper.make_node("Mul", [t, "cos"], [t + "_c"]),
                      helper.make_node("Mul", [t + "_rot", "sin"], [t + "_s"]),
                      helper.make_node("Add", [t + "_c", t + "_s"], [t + "_e"])])
        return t + "_e"

    q = rotary(heads_of("x", heads, "q"))
    k = rotary(heads_of("x", kv_heads, "k"))
    v = heads_of("x", kv_heads, "v")
    nodes += [helper.make_node("Concat", ["past_k", k], ["present_k"], axis=-2),
              helper.make_node("Concat", ["past_v", v], ["present_v"], axis=-2)]
    for t in ("present_k", "present_v"):
        # grouped-query repeat: (1, kv, L, d) -> (1, kv, rep, L, d) -> (1, heads, L, d), shapes from Shape
        nodes += [helper.make_node("Shape", [t], [t + "_shape"]),
                  helper.make_node("Gather", [t + "_shape", "two"], [t + "_len"], axis=0),
                  helper.make_node("Unsqueeze", [t + "_len", "zero_v"], [t + "_len_v"]),
                  helper.make_node("Concat", ["one_v", "kvh_v", "rep_v", t + "_len_v", "hd_v"], [t + "_xs"], axis=0),
                  helper.make_node("Unsqueeze", [t, "two_v"], [t + "_u"]),
                  helper.make_node("Expand", [t + "_u", t + "_xs"], [t + "_x"]),
                  helper.make_node("Concat", ["one_v", "heads_v", t + "_len_v", "hd_v"], [t + "_rs"], axis=0),
                  helper.make_node("Reshape", [t + "_x", t + "_rs"], [t + "_all"])]
    nodes += [
        helper.make_node("Transpose", ["present_k_all"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", [q, "kt"], ["scores0"]),
        _c("scale", 1.0 / np.sqrt(head_dim), "float32"),
        helper.make_node("Mul", ["scores0", "scale"], ["scores1"]),
        helper.make_node("Add", ["scores1", "mask"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "present_v_all"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        _c("out_shape", [1, 1, -1]),
        helper.make_node("Reshape", ["ctx_t", "out_shape"], ["ctx_r"]),
        helper.make_node("MatMul", ["ctx_r", "wo"], ["y"]),
    ]
    length = 5 if past is None else past
    total = 6 if past is None else f"{past} + 1"
    cache = lambda n, L: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, kv_heads, L, head_dim])  # noqa: E731
    graph = helper.make_graph(
        nodes, "decode_step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, hidden]), cache("past_k", length),
         cache("past_v", length)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, hidden]), cache("present_k", total),
         cache("present_v", total)],
        initializer=list(w.values()) + [inv_freq])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9       # what onnxruntime takes
    onnx.checker.check_model(model)
    return model
