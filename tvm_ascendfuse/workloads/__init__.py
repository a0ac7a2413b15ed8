"""Benchmark workloads as ONNX models built in code (seeded random fp32 weights, batch 1, opset 17, no downloads).

``WORKLOADS`` maps the benchmark name to ``(builder, description)``; every builder takes keyword sizes whose
defaults are the benchmark sizes, so tests build the same graph small::

    model = WORKLOADS["bert_layer"][0](seq=16, hidden=64, heads=4, ffn=128)
"""

from __future__ import annotations

from .cnn import conv_bn_relu, focus_conv, resnet50, resnet_basic_block
from .transformer import bert_layer, llama_block, ln_linear_gelu, mlp3

WORKLOADS = {
    "conv_bn_relu": (conv_bn_relu, "W1 Conv3x3(64->128,+bias)+BN+ReLU, 1x64x56x56"),
    "resnet50": (resnet50, "W2 ResNet-50 v1.5 (Conv+BN unfolded), 1x3x224x224"),
    "bert_layer": (bert_layer, "W3 BERT-base encoder layer, seq 128, erf-GELU decomposed, post-LN"),
    "ln_linear_gelu": (ln_linear_gelu, "W4 LayerNorm(768)->MatMul 768x3072+Add->GELU(erf), 128x768"),
    "focus_conv": (focus_conv, "W5 YOLOv5 Focus (4 Slices+Concat)->Conv3x3(12->32)+BN+SiLU, 1x3x640x640"),
    "mlp3": (mlp3, "W6 (MatMul+Add+ReLU)x3, 64x1024, 1024x1024 weights"),
    "llama_block": (llama_block, "W7 LLaMA decoder block, hidden 1024, 16 heads, seq 256, RMSNorm, SwiGLU 2816"),
}

# Short ids used by the benchmark CLI (--workloads W1,W4).
WORKLOAD_IDS = {f"W{i}": name for i, name in enumerate(WORKLOADS, start=1)}

__all__ = ["WORKLOADS", "WORKLOAD_IDS", "bert_layer", "conv_bn_relu", "focus_conv", "llama_block",
           "ln_linear_gelu", "mlp3", "resnet50", "resnet_basic_block"]
