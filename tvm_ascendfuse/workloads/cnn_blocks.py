"""CNN blocks built in code, written the way torchvision's ONNX export writes them (BatchNorm after a conv
already folded into the conv's weights and bias, as ``torch.onnx.export`` does in eval mode; BatchNorm in front
of a ReLU, which cannot be folded, left as a node):

* ``squeeze_excite_block``: a MobileNetV3 / EfficientNet inverted residual with squeeze-and-excitation
  (expand 1x1 -> depthwise kxk -> global average pool -> 1x1 FC -> act -> 1x1 FC -> sigmoid/hardsigmoid ->
  channel-wise multiply -> project 1x1 (+ residual));
* ``dense_block``: DenseNet layers (concat of every earlier output -> BN -> ReLU -> 1x1 conv -> ReLU -> 3x3
  conv, each layer's output appended) and a transition (concat -> BN -> ReLU -> 1x1 conv -> 2x2 average pool);
* ``inception_block``: GoogLeNet's four branches over one input (1x1; 1x1 -> 3x3; 1x1 -> 5x5 or 3x3;
  3x3 stride-1 max-pool -> 1x1) joined by a concat, twice in a row so a concat also feeds convs;
* ``fire_block``: SqueezeNet's fire modules (squeeze 1x1 -> expand 1x1 | expand 3x3 -> concat), two of them
  with a max-pool in between;
* ``convnext_block``: ConvNeXt blocks (depthwise 7x7 -> permute to channels-last -> LayerNorm -> linear ->
  GELU -> linear -> permute back -> layer scale -> + residual), a downsample (LayerNorm over the channels ->
  2x2 stride-2 conv) and blocks at the wider stage.

Every builder takes keyword sizes; the defaults are small enough for the tests to run them end to end against
onnxruntime. ``batch`` may be a symbolic name (a string) for a dynamic batch dimension.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ..errors import ModelError
from ._graph import GraphWriter
from ._layers import batchnorm, gelu_erf, layernorm, linear


def _conv(g: GraphWriter, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
          bias: bool = True, hint: str = "conv", gain: float = 2.0) -> str:
    """Conv (+ bias: a folded BatchNorm), He-scaled so activations stay O(1) through a few blocks."""
    w = g.normal((cout, cin // group, k, k), math.sqrt(gain / (cin // group * k * k)), hint + "_w")
    ins = [x, w] + ([g.normal((cout,), 0.1, hint + "_b")] if bias else [])
    return g.op("Conv", ins, hint, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                dilations=[1, 1], group=group)


def _act(g: GraphWriter, x: str, kind: str, hint: str = "act") -> str:
    if kind == "relu":
        return g.op("Relu", [x], hint)
    if kind == "silu":
        return g.op("Mul", [x, g.op("Sigmoid", [x], hint + "_sigmoid")], hint)
    if kind == "hardswish":
        return g.op("HardSwish", [x], hint)
    raise ModelError(f"activation must be relu, silu or hardswish, not {kind!r}")


def _gate(g: GraphWriter, x: str, kind: str) -> str:
    if kind == "sigmoid":
        return g.op("Sigmoid", [x], "se_gate")
    if kind == "hardsigmoid":
        return g.op("HardSigmoid", [x], "se_gate", alpha=1.0 / 6, beta=0.5)
    raise ModelError(f"gate must be sigmoid or hardsigmoid, not {kind!r}")


def _batch(batch):
    return batch if isinstance(batch, str) else int(batch)


def _linear(g: GraphWriter, x: str, fin: int, fout: int, hint: str) -> str:
    """nn.Linear as torch exports it on 2-D rows: Gemm with a transposed weight."""
    w = g.normal((fout, fin), 1.0 / math.sqrt(fin), hint + "_w")
    return g.op("Gemm", [x, w, g.normal((fout,), 0.1, hint + "_b")], hint, alpha=1.0, beta=1.0, transB=1)


def squeeze_excite(g: GraphWriter, x: str, channels: int, squeeze: int, act: str = "relu",
                   gate: str = "sigmoid", fc: str = "conv") -> str:
    """GlobalAveragePool -> FC -> act -> FC -> gate -> Mul with ``x``; the FCs are 1x1 convs (``fc="conv"``,
    torchvision) or Linear layers on the flattened pooled vector (``fc="linear"``)."""
    s = g.op("GlobalAveragePool", [x], "se_pool")
    if fc == "conv":
        s = _act(g, _conv(g, s, channels, squeeze, 1, hint="se_fc1", gain=1.0), act, "se_act")
        s = _gate(g, _conv(g, s, squeeze, channels, 1, hint="se_fc2", gain=1.0), gate)
    elif fc == "linear":
        s = g.op("Flatten", [s], "se_flat", axis=1)
        s = _act(g, _linear(g, s, channels, squeeze, "se_fc1"), act, "se_act")
        s = _gate(g, _linear(g, s, squeeze, channels, "se_fc2"), gate)
        s = g.op("Unsqueeze", [s, g.ints([2, 3], "se_axes")], "se_unsqueeze")
    else:
        raise ModelError(f"fc must be conv or linear, not {fc!r}")
    return g.op("Mul", [s, x], "se_scale")


def squeeze_excite_block(channels: int = 24, expand: int = 4, kernel: int = 3, stride: int = 1, hw: int = 28,
                         act: str = "silu", gate: str = "sigmoid", squeeze: int | None = None, blocks: int = 2,
                         fc: str = "conv", batch=1, seed: int = 0) -> onnx.ModelProto:
    """``blocks`` inverted residuals with SE (EfficientNet: act silu, gate sigmoid; MobileNetV3: act hardswish
    or relu, gate hardsigmoid; ``fc="linear"``: the SE's FCs as Linear layers). The first block has ``stride``; later blocks keep the shape and add the
    residual. ``squeeze`` defaults to a quarter of the block's input channels (EfficientNet's ratio)."""
    if blocks < 1:
        raise ModelError("squeeze_excite_block needs at least one block")
    g = GraphWriter("squeeze_excite_block", seed)
    x = g.input("x", [_batch(batch), channels, hw, hw])
    size = hw
    for b in range(blocks):
        s = stride if b == 0 else 1
        wide = channels * expand
        y = _act(g, _conv(g, x, channels, wide, 1, hint="expand"), act, "expand_act")
        y = _act(g, _conv(g, y, wide, wide, kernel, stride=s, group=wide, hint="dw"), act, "dw_act")
        y = squeeze_excite(g, y, wide, squeeze or max(1, channels // 4), "relu" if act == "hardswish" else act,
                           gate, fc)
        y = _conv(g, y, wide, channels, 1, hint="project", gain=1.0)
        size = (size + s - 1) // s if s > 1 else size
        x = y if s != 1 else g.op("Add", [y, x], "residual")
    out = g.op("Identity", [x], out="y")
    return g.finish({out: [_batch(batch), channels, size, size]}, squeeze_excite_block.__doc__)


def dense_block(channels: int = 32, growth: int = 16, layers: int = 4, bottleneck: int = 4, hw: int = 16,
                transition: bool = True, batch=1, seed: int = 0) -> onnx.ModelProto:
    """DenseNet: ``layers`` dense layers (each: concat of all earlier outputs -> BN -> ReLU -> 1x1 conv to
    ``bottleneck * growth`` (+ folded BN) -> ReLU -> 3x3 conv to ``growth``), then, with ``transition``,
    concat -> BN -> ReLU -> 1x1 conv (halving the channels) -> AveragePool 2x2/2; else the block's concat."""
    g = GraphWriter("dense_block", seed)
    x = g.input("x", [_batch(batch), channels, hw, hw])
    features, width = [x], channels
    for i in range(layers):
        cat = g.op("Concat", features, f"layer{i}_cat", axis=1)
        y = g.op("Relu", [batchnorm(g, cat, width, hint=f"layer{i}_norm1")], f"layer{i}_relu1")
        y = g.op("Relu", [_conv(g, y, width, bottleneck * growth, 1, hint=f"layer{i}_conv1")], f"layer{i}_relu2")
        features.append(_conv(g, y, bottleneck * growth, growth, 3, bias=False, hint=f"layer{i}_conv2"))
        width += growth
    cat = g.op("Concat", features, "block_cat", axis=1)
    if not transition:
        out = g.op("Identity", [cat], out="y")
        return g.finish({out: [_batch(batch), width, hw, hw]}, dense_block.__doc__)
    y = g.op("Relu", [batchnorm(g, cat, width, hint="trans_norm")], "trans_relu")
    y = _conv(g, y, width, width // 2, 1, bias=False, hint="trans_conv")
    g.op("AveragePool", [y], out="y", kernel_shape=[2, 2], strides=[2, 2])
    return g.finish({"y": [_batch(batch), width // 2, hw // 2, hw // 2]}, dense_block.__doc__)


def _inception(g: GraphWriter, x: str, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool: int,
               k5: int) -> tuple[str, int]:
    relu = lambda t, h: g.op("Relu", [t], h)   # noqa: E731
    b1 = relu(_conv(g, x, cin, c1, 1, hint="b1"), "b1_relu")
    b2 = relu(_conv(g, relu(_conv(g, x, cin, c3r, 1, hint="b2_reduce"), "b2r_relu"), c3r, c3, 3, hint="b2"),
              "b2_relu")
    b3 = relu(_conv(g, relu(_conv(g, x, cin, c5r, 1, hint="b3_reduce"), "b3r_relu"), c5r, c5, k5, hint="b3"),
              "b3_relu")
    p = g.op("MaxPool", [x], "b4_pool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b4 = relu(_conv(g, p, cin, pool, 1, hint="b4"), "b4_relu")
    return g.op("Concat", [b1, b2, b3, b4], "inception", axis=1), c1 + c3 + c5 + pool


def inception_block(channels: int = 32, hw: int = 14, widths=(16, 16, 24, 8, 12, 8), k5: int = 5, blocks: int = 2,
                    batch=1, seed: int = 0) -> onnx.ModelProto:
    """``blocks`` GoogLeNet inception modules in a row (``widths`` = 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5,
    pool projection; ``k5`` the third branch's kernel: 5 as in the paper, 3 as torchvision has it), then a
    3x3/2 max-pool of the last concat."""
    g = GraphWriter("inception_block", seed)
    x = g.input("x", [_batch(batch), channels, hw, hw])
    cin = channels
    for _ in range(blocks):
        x, cin = _inception(g, x, cin, *widths, k5)
    out = (hw + 2 - 3) // 2 + 1
    g.op("MaxPool", [x], out="y", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return g.finish({"y": [_batch(batch), cin, out, out]}, inception_block.__doc__)


def fire_block(channels: int = 32, hw: int = 16, squeeze: int = 8, expand: int = 16, batch=1,
               seed: int = 0) -> onnx.ModelProto:
    """Two SqueezeNet fire modules (squeeze 1x1 + ReLU -> expand 1x1 + ReLU | expand 3x3 + ReLU -> concat)
    with a 3x3/2 max-pool (ceil mode off) between them, then a third fire module."""
    g = GraphWriter("fire_block", seed)
    x = g.input("x", [_batch(batch), channels, hw, hw])

    def fire(t, cin, sq, ex):
        s = g.op("Relu", [_conv(g, t, cin, sq, 1, hint="squeeze")], "squeeze_relu")
        e1 = g.op("Relu", [_conv(g, s, sq, ex, 1, hint="expand1x1")], "e1_relu")
        e3 = g.op("Relu", [_conv(g, s, sq, ex, 3, hint="expand3x3")], "e3_relu")
        return g.op("Concat", [e1, e3], "fire", axis=1)

    y = fire(x, channels, squeeze, expand)
    y = fire(y, 2 * expand, squeeze, expand)
    y = g.op("MaxPool", [y], "pool", kernel_shape=[3, 3], strides=[2, 2])
    out = (hw - 3) // 2 + 1
    fire(y, 2 * expand, squeeze * 2, expand * 2)
    g.nodes[-1].output[0] = "y"
    return g.finish({"y": [_batch(batch), 4 * expand, out, out]}, fire_block.__doc__)


def _layernorm2d(g: GraphWriter, x: str, c: int, form: str) -> str:
    """LayerNorm over the channels of an NCHW tensor: torchvision's permute -> LayerNorm -> permute
    (``"permute"``), or the channels-first reductions of other ConvNeXt code (``"reduce"``: mean and variance
    over axis 1, then the per-channel scale and shift)."""
    if form == "permute":
        t = g.op("Transpose", [x], "ln2d_in", perm=[0, 2, 3, 1])
        return g.op("Transpose", [layernorm(g, t, c, eps=1e-6, hint="ln2d")], "ln2d", perm=[0, 3, 1, 2])
    if form == "reduce":
        mean = g.op("ReduceMean", [x], "ln2d_mean", axes=[1], keepdims=1)
        d = g.op("Sub", [x, mean], "ln2d_centred")
        var = g.op("ReduceMean", [g.op("Mul", [d, d], "ln2d_sq")], "ln2d_var", axes=[1], keepdims=1)
        std = g.op("Sqrt", [g.op("Add", [var, g.const(1e-6, "eps")], "ln2d_var_eps")], "ln2d_std")
        y = g.op("Div", [d, std], "ln2d_norm")
        y = g.op("Mul", [y, g.uniform((c, 1, 1), 0.8, 1.2, "ln2d_gamma")], "ln2d_scaled")
        return g.op("Add", [y, g.normal((c, 1, 1), 0.1, "ln2d_beta")], "ln2d")
    raise ModelError(f"LayerNorm2d form must be 'permute' or 'reduce', not {form!r}")


def _convnext(g: GraphWriter, x: str, c: int, expand: int) -> str:
    t = _conv(g, x, c, c, 7, group=c, hint="dw")
    t = g.op("Transpose", [t], "to_nhwc", perm=[0, 2, 3, 1])
    t = layernorm(g, t, c, eps=1e-6, hint="ln")
    t = linear(g, gelu_erf(g, linear(g, t, c, expand * c, hint="fc1")), expand * c, c, hint="fc2")
    t = g.op("Transpose", [t], "to_nchw", perm=[0, 3, 1, 2])
    t = g.op("Mul", [g.uniform((c, 1, 1), 0.5, 1.0, "layer_scale"), t], "scaled")
    return g.op("Add", [t, x], "residual")


def convnext_block(channels: int = 24, hw: int = 14, depth: int = 2, expand: int = 4, batch=1,
                   ln2d: str = "permute", seed: int = 0) -> onnx.ModelProto:
    """``depth`` ConvNeXt blocks at ``channels``, a downsample (LayerNorm2d -> 2x2 stride-2 conv to twice
    the channels) and ``depth`` blocks at the wider stage (``hw`` even). ``ln2d``: the LayerNorm2d's form
    (``_layernorm2d``)."""
    if hw % 2:
        raise ModelError(f"convnext_block needs an even hw for its stride-2 downsample, not {hw}")
    g = GraphWriter("convnext_block", seed)
    x = g.input("x", [_batch(batch), channels, hw, hw])
    for _ in range(depth):
        x = _convnext(g, x, channels, expand)
    x = _layernorm2d(g, x, channels, ln2d)
    w = g.normal((2 * channels, channels, 2, 2), math.sqrt(1.0 / (channels * 4)), "down_w")
    x = g.op("Conv", [x, w, g.normal((2 * channels,), 0.1, "down_b")], "down", kernel_shape=[2, 2],
             strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
    for _ in range(depth):
        x = _convnext(g, x, 2 * channels, expand)
    g.nodes[-1].output[0] = "y"
    return g.finish({"y": [_batch(batch), 2 * channels, hw // 2, hw // 2]}, convnext_block.__doc__)


def _conv_silu(g: GraphWriter, x: str, cin: int, cout: int, k: int, stride: int = 1, hint: str = "conv") -> str:
    return _act(g, _conv(g, x, cin, cout, k, stride, hint=hint), "silu", hint + "_silu")


def _channels(g: GraphWriter, x: str, start: int, end: int, hint: str) -> str:
    """Channels [start, end) of an NCHW tensor, as torch's ``chunk`` exports (a Slice on axis 1)."""
    return g.op("Slice", [x, g.ints([start]), g.ints([end]), g.ints([1])], hint)


def _c2f(g: GraphWriter, x: str, cin: int, cout: int, n: int, hint: str) -> str:
    """YOLOv8's C2f: 1x1 conv -> two channel halves; ``n`` residual bottlenecks (3x3 -> 3x3 + skip) grow
    from the second half; every piece concatenated -> 1x1 conv."""
    h = cout // 2
    t = _conv_silu(g, x, cin, 2 * h, 1, hint=hint + "_cv1")
    parts = [_channels(g, t, 0, h, hint + "_a"), _channels(g, t, h, 2 * h, hint + "_b")]
    for i in range(n):
        y = _conv_silu(g, parts[-1], h, h, 3, hint=f"{hint}_m{i}a")
        y = _conv_silu(g, y, h, h, 3, hint=f"{hint}_m{i}b")
        parts.append(g.op("Add", [parts[-1], y], f"{hint}_m{i}"))
    return _conv_silu(g, g.op("Concat", parts, hint + "_cat", axis=1), (2 + n) * h, cout, 1, hint=hint + "_cv2")


def _sppf(g: GraphWriter, x: str, c: int, hint: str = "sppf") -> str:
    """Spatial pyramid pooling, fast: 1x1 conv, three chained 5x5 stride-1 max-pools, the four concatenated."""
    t = _conv_silu(g, x, c, c // 2, 1, hint=hint + "_cv1")
    pools = [t]
    for i in range(3):
        pools.append(g.op("MaxPool", [pools[-1]], f"{hint}_pool{i}", kernel_shape=[5, 5], strides=[1, 1],
                          pads=[2, 2, 2, 2]))
    return _conv_silu(g, g.op("Concat", pools, hint + "_cat", axis=1), 2 * c, c, 1, hint=hint + "_cv2")


def _anchors(hw: int, stride: int):
    """Anchor centres (x, y) of an hw x hw feature map, in feature-map cells, rows then columns."""
    ys, xs = np.meshgrid(np.arange(hw) + 0.5, np.arange(hw) + 0.5, indexing="ij")
    return np.stack([xs.ravel(), ys.ravel()]).astype("float32"), np.full((1, hw * hw), stride, "float32")


def yolo_block(channels: int = 16, hw: int = 32, classes: int = 8, reg_max: int = 8, depth: int = 1,
               seed: int = 0) -> onnx.ModelProto:
    """A YOLOv8-style detector in miniature, as ultralytics' ONNX export writes one: a stride-2 SiLU conv
    stem and C2f stage, a second stride-2 stage with SPPF, a nearest-neighbour 2x upsample concatenated with
    the first stage (the neck), and the anchor-free head on both levels: box (4 x ``reg_max`` bins) and class
    branches concatenated, flattened over the anchors, the box distribution decoded by a softmax over the bins
    and a fixed 1x1 conv (DFL), distances turned into centre/size boxes around the anchors times the stride,
    class sigmoids. One output (1, 4 + classes, anchors) with boxes in input pixels."""
    if hw % 4:
        raise ModelError(f"yolo_block needs hw divisible by 4 (two stride-2 stages), not {hw}")
    g = GraphWriter("yolo_block", seed)
    c1, c2 = channels, 2 * channels
    x = g.input("x", [1, 3, hw, hw])
    p1 = _c2f(g, _conv_silu(g, x, 3, c1, 3, 2, hint="stem"), c1, c1, depth, "c2f1")           # stride 2
    p2 = _sppf(g, _c2f(g, _conv_silu(g, p1, c1, c2, 3, 2, hint="down"), c2, c2, depth, "c2f2"), c2)
    up = g.op("Resize", [p2, "", g.const([1.0, 1.0, 2.0, 2.0], "up_scales")], "up", mode="nearest",
              coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    n1 = _c2f(g, g.op("Concat", [up, p1], "neck_cat", axis=1), c1 + c2, c1, depth, "neck")
    no = 4 * reg_max + classes
    levels, anchors, strides = [], [], []
    for i, (feat, c, stride) in enumerate(((n1, c1, 2), (p2, c2, 4))):
        box = _conv(g, _conv_silu(g, feat, c, c, 3, hint=f"box{i}"), c, 4 * reg_max, 1, hint=f"box{i}_out")
        cls = _conv(g, _conv_silu(g, feat, c, c, 3, hint=f"cls{i}"), c, classes, 1, hint=f"cls{i}_out")
        side = hw // stride
        levels.append(g.op("Reshape", [g.op("Concat", [box, cls], f"head{i}", axis=1), g.ints([1, no, -1])],
                           f"head{i}_flat"))
        a, s = _anchors(side, stride)
        anchors.append(a)
        strides.append(s)
    n = sum(a.shape[1] for a in anchors)
    y = g.op("Concat", levels, "heads", axis=2)
    box = _channels(g, y, 0, 4 * reg_max, "box")
    cls = _channels(g, y, 4 * reg_max, no, "cls")
    # DFL: the expected bin of each side's distance distribution
    t = g.op("Transpose", [g.op("Reshape", [box, g.ints([1, 4, reg_max, n])], "dfl_bins")], "dfl_t",
             perm=[0, 2, 1, 3])
    t = g.op("Softmax", [t], "dfl_softmax", axis=1)
    bins = g.const(np.arange(reg_max, dtype="float32").reshape(1, reg_max, 1, 1), "dfl_w")
    t = g.op("Conv", [t, bins], "dfl", kernel_shape=[1, 1])
    dist = g.op("Reshape", [t, g.ints([1, 4, n])], "dist")
    centres = g.const(np.concatenate(anchors, axis=1)[None], "anchors")
    x1y1 = g.op("Sub", [centres, _channels(g, dist, 0, 2, "lt")], "x1y1")
    x2y2 = g.op("Add", [centres, _channels(g, dist, 2, 4, "rb")], "x2y2")
    cxy = g.op("Div", [g.op("Add", [x1y1, x2y2], "sum_xy"), g.const(2.0, "two")], "cxy")
    wh = g.op("Sub", [x2y2, x1y1], "wh")
    boxes = g.op("Mul", [g.op("Concat", [cxy, wh], "xywh", axis=1), g.const(np.concatenate(strides, axis=1)[None],
                                                                            "strides")], "boxes")
    g.op("Concat", [boxes, g.op("Sigmoid", [cls], "scores")], out="y", axis=1)
    return g.finish({"y": [1, 4 + classes, n]}, yolo_block.__doc__)
