"""Sub-graphs written the way PyTorch's ONNX exporter writes them (the forms our fusion passes must recognise).

Weights are scaled so activations stay O(1) through deep stacks: He-initialised convs, BatchNorm running
statistics close to the real ones, 1/sqrt(fan_in) linear weights. Otherwise a random ResNet-50 overflows or
collapses to zeros and comparing two compilers' numbers says nothing.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from ._graph import GraphWriter


def conv(g: GraphWriter, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
         bias: bool = False, hint: str = "conv") -> str:
    pad = k // 2 if pad is None else pad
    w = g.normal((cout, cin, k, k), math.sqrt(2.0 / (cin * k * k)), hint + "_w")
    ins = [x, w] + ([g.normal((cout,), 0.1, hint + "_b")] if bias else [])
    return g.op("Conv", ins, hint, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                dilations=[1, 1], group=1)


def batchnorm(g: GraphWriter, x: str, c: int, gamma=(0.5, 1.5), var_scale: float = 1.0, eps: float = 1e-5,
              hint: str = "bn") -> str:
    """Inference BatchNormalization (PyTorch eval export: separate node, running statistics as initializers).
    ``var_scale`` is the expected variance of ``x`` so the running variance roughly matches it."""
    scale = g.uniform((c,), *gamma, hint + "_gamma")
    shift = g.normal((c,), 0.1, hint + "_beta")
    mean = g.normal((c,), 0.1, hint + "_mean")
    var = g.uniform((c,), 0.5 * var_scale, 1.5 * var_scale, hint + "_var")
    return g.op("BatchNormalization", [x, scale, shift, mean, var], hint, epsilon=eps, momentum=0.9)


def linear(g: GraphWriter, x: str, fin: int, fout: int, bias: bool = True, hint: str = "fc") -> str:
    """MatMul with a (fin, fout) initializer, then Add bias: the exporter's nn.Linear on 2-D/3-D inputs."""
    y = g.op("MatMul", [x, g.normal((fin, fout), 1.0 / math.sqrt(fin), hint + "_w")], hint)
    if bias:
        y = g.op("Add", [y, g.normal((fout,), 0.1, hint + "_b")], hint + "_bias")
    return y


def layernorm(g: GraphWriter, x: str, hidden: int, eps: float = 1e-5, out: str | None = None,
              hint: str = "ln") -> str:
    scale = g.uniform((hidden,), 0.8, 1.2, hint + "_gamma")
    shift = g.normal((hidden,), 0.1, hint + "_beta")
    return g.op("LayerNormalization", [x, scale, shift], hint, out=out, axis=-1, epsilon=eps)


def gelu_erf(g: GraphWriter, x: str, out: str | None = None) -> str:
    """Exact GELU as exported from nn.GELU()/BERT: x * 0.5 * (1 + erf(x / sqrt(2))), op by op."""
    t = g.op("Div", [x, g.const(math.sqrt(2.0), "sqrt2")], "gelu_div")
    t = g.op("Erf", [t], "gelu_erf")
    t = g.op("Add", [t, g.const(1.0, "one")], "gelu_add")
    t = g.op("Mul", [x, t], "gelu_mul")
    return g.op("Mul", [t, g.const(0.5, "half")], "gelu", out=out)


def silu(g: GraphWriter, x: str, out: str | None = None) -> str:
    """SiLU as exported before opset 22: x * Sigmoid(x)."""
    return g.op("Mul", [x, g.op("Sigmoid", [x], "sigmoid")], "silu", out=out)


def rmsnorm(g: GraphWriter, x: str, hidden: int, eps: float = 1e-6, form: str = "div", hint: str = "rms") -> str:
    """LLaMA RMSNorm decomposed: x / sqrt(mean(x^2) + eps) * w.

    ``form="div"`` divides by the root; ``form="reciprocal"`` is HF's ``x * torch.rsqrt(...)`` export
    (Sqrt, Reciprocal, Mul).
    """
    sq = g.op("Pow", [x, g.const(2.0, "two")], hint + "_pow")
    ms = g.op("ReduceMean", [sq], hint + "_mean", axes=[-1], keepdims=1)
    root = g.op("Sqrt", [g.op("Add", [ms, g.const(eps, "rms_eps")], hint + "_add")], hint + "_sqrt")
    if form == "div":
        y = g.op("Div", [x, root], hint + "_div")
    elif form == "reciprocal":
        y = g.op("Mul", [x, g.op("Reciprocal", [root], hint + "_rcp")], hint + "_norm")
    else:
        raise ModelError(f"rms_form must be 'div' or 'reciprocal', not {form!r}")
    return g.op("Mul", [y, g.uniform((hidden,), 0.8, 1.2, hint + "_w")], hint)


def split_heads(g: GraphWriter, x: str, seq: int, heads: int, head_dim: int, key: bool = False) -> str:
    """(1, seq, heads*head_dim) -> (1, heads, seq, head_dim), or (1, heads, head_dim, seq) for keys."""
    r = g.op("Reshape", [x, g.ints([1, seq, heads, head_dim])], "heads")
    return g.op("Transpose", [r], "k_t" if key else "heads_t", perm=[0, 2, 3, 1] if key else [0, 2, 1, 3])


def merge_heads(g: GraphWriter, x: str, seq: int, hidden: int) -> str:
    t = g.op("Transpose", [x], "merge_t", perm=[0, 2, 1, 3])
    return g.op("Reshape", [t, g.ints([1, seq, hidden])], "merge")


def attention(g: GraphWriter, q: str, k: str, v: str, seq: int, heads: int, hidden: int, scale_op: str,
              mask: np.ndarray | None) -> str:
    """softmax(Q Kᵀ scaled (+ additive mask)) V on (1, seq, hidden) projections; returns (1, seq, hidden)."""
    if hidden % heads:
        raise ModelError(f"hidden size {hidden} is not a multiple of the head count {heads}")
    hd = hidden // heads
    qh, kt, vh = split_heads(g, q, seq, heads, hd), split_heads(g, k, seq, heads, hd, key=True), \
        split_heads(g, v, seq, heads, hd)
    s = g.op("MatMul", [qh, kt], "scores")
    if scale_op == "div":
        s = g.op("Div", [s, g.const(math.sqrt(hd), "sqrt_hd")], "scaled")
    else:
        s = g.op("Mul", [s, g.const(1.0 / math.sqrt(hd), "inv_sqrt_hd")], "scaled")
    if mask is not None:
        s = g.op("Add", [s, g.const(mask, "mask")], "masked")
    p = g.op("Softmax", [s], "probs", axis=-1)
    return merge_heads(g, g.op("MatMul", [p, vh], "context"), seq, hidden)
