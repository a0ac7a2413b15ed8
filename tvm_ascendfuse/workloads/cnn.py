"""Convolutional workloads: W1 conv+BN+ReLU, W2 ResNet-50 v1.5 (+ a basic block for tests), W5 YOLOv5 Focus."""

from __future__ import annotations

import onnx

from ..errors import ModelError
from ._graph import GraphWriter
from ._layers import batchnorm, conv, silu

INT64_MAX = 2**63 - 1   # what torch.onnx writes for an open slice end (x[..., ::2])


def conv_bn_relu(in_channels: int = 64, out_channels: int = 128, hw: int = 56, seed: int = 0) -> onnx.ModelProto:
    """W1: Conv 3x3 pad 1 *with bias* -> BatchNormalization -> Relu (the BN fold must absorb the bias too)."""
    g = GraphWriter("conv_bn_relu", seed)
    x = g.input("x", [1, in_channels, hw, hw])
    y = conv(g, x, in_channels, out_channels, 3, bias=True)
    g.op("Relu", [batchnorm(g, y, out_channels)], out="y")
    return g.finish({"y": [1, out_channels, hw, hw]}, conv_bn_relu.__doc__)


def resnet_basic_block(channels: int = 64, hw: int = 56, seed: int = 0) -> onnx.ModelProto:
    """ResNet basic block with identity shortcut: conv+BN+ReLU, conv+BN, + x, ReLU (fused: 2 kernels)."""
    g = GraphWriter("resnet_basic_block", seed)
    x = g.input("x", [1, channels, hw, hw])
    y = g.op("Relu", [batchnorm(g, conv(g, x, channels, channels, 3), channels)])
    y = batchnorm(g, conv(g, y, channels, channels, 3), channels, gamma=(0.2, 0.6))
    g.op("Relu", [g.op("Add", [y, x], "residual")], out="y")
    return g.finish({"y": [1, channels, hw, hw]}, resnet_basic_block.__doc__)


def _bottleneck(g: GraphWriter, x: str, cin: int, width: int, stride: int, x_ms: float) -> tuple[str, float]:
    """v1.5: the stride sits on the 3x3 conv; a 1x1 conv+BN shortcut when shape changes.

    ``x_ms`` estimates the mean square of the residual stream: BNs that read it get running variances that
    match (as in a trained net), so the stream does not grow block after block. Returns (output, its estimate).
    """
    cout = width * 4
    y = g.op("Relu", [batchnorm(g, conv(g, x, cin, width, 1), width, var_scale=2 * x_ms)])
    y = g.op("Relu", [batchnorm(g, conv(g, y, width, width, 3, stride=stride), width)])
    y = batchnorm(g, conv(g, y, width, cout, 1), cout, gamma=(0.2, 0.5))
    short, short_ms = x, x_ms
    if stride != 1 or cin != cout:
        short = batchnorm(g, conv(g, x, cin, cout, 1, stride=stride, hint="downsample"), cout,
                          var_scale=2 * x_ms, hint="downsample_bn")
        short_ms = 1.0
    return g.op("Relu", [g.op("Add", [y, short], "residual")]), short_ms + 0.15


def resnet50(image: int = 224, base_width: int = 64, layers=(3, 4, 6, 3), num_classes: int = 1000,
             seed: int = 0) -> onnx.ModelProto:
    """W2: ResNet-50 v1.5 as torchvision exports it in eval mode: Conv (no bias) + separate BatchNormalization,
    stem 7x7/2 + MaxPool 3x3/2, bottleneck stages ``layers``, GlobalAveragePool, Flatten, Gemm.
    ``base_width``/``layers``/``image`` shrink it for tests (base_width=8, layers=(1,1,1,1), image=32)."""
    g = GraphWriter("resnet50", seed)
    x = g.input("x", [1, 3, image, image])
    y = g.op("Relu", [batchnorm(g, conv(g, x, 3, base_width, 7, stride=2, pad=3, hint="stem"), base_width)])
    y = g.op("MaxPool", [y], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin, ms = base_width, 0.5
    for stage, blocks in enumerate(layers):
        width = base_width * 2**stage
        for b in range(blocks):
            y, ms = _bottleneck(g, y, cin, width, 2 if (b == 0 and stage > 0) else 1, ms)
            cin = width * 4
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y], "gap")], "flat", axis=1)
    w = g.normal((num_classes, cin), 1.0 / cin**0.5, "fc_w")
    g.op("Gemm", [y, w, g.normal((num_classes,), 0.1, "fc_b")], out="y", alpha=1.0, beta=1.0, transB=1)
    return g.finish({"y": [1, num_classes]}, resnet50.__doc__)


def focus_conv(in_channels: int = 3, out_channels: int = 32, hw: int = 640, seed: int = 0) -> onnx.ModelProto:
    """W5: YOLOv5 Focus: space-to-depth by 4 strided Slices + Concat, then Conv 3x3 + BN + SiLU (x*Sigmoid(x)).
    Equivalent to one stride-2 conv on the input, which is what FocusConvFusionPass should produce."""
    if hw % 2:
        raise ModelError(f"Focus needs an even input size, got {hw}x{hw}")
    g = GraphWriter("focus_conv", seed)
    x = g.input("x", [1, in_channels, hw, hw])
    axes, steps, ends = g.ints([2, 3], "axes"), g.ints([2, 2], "steps"), g.ints([INT64_MAX, INT64_MAX], "ends")
    parts = []
    for h0, w0 in [(0, 0), (1, 0), (0, 1), (1, 1)]:   # YOLOv5 order: x[::2,::2], x[1::2,::2], x[::2,1::2], x[1::2,1::2]
        parts.append(g.op("Slice", [x, g.ints([h0, w0], "starts"), ends, axes, steps], "focus_slice"))
    y = g.op("Concat", parts, "focus", axis=1)
    y = batchnorm(g, conv(g, y, 4 * in_channels, out_channels, 3), out_channels)
    silu(g, y, out="y")
    return g.finish({"y": [1, out_channels, hw // 2, hw // 2]}, focus_conv.__doc__)
