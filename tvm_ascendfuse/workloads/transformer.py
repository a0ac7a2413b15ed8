"""Matmul-heavy workloads: W3 BERT layer, W4 LN->Linear->GELU, W6 3-layer MLP, W7 LLaMA decoder block."""

from __future__ import annotations

import numpy as np
import onnx

from ._graph import GraphWriter
from ._layers import attention, gelu_erf, layernorm, linear, rmsnorm, silu


def bert_layer(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, mask: bool = False,
               seed: int = 0) -> onnx.ModelProto:
    """W3: BERT-base encoder layer (post-LN), as HF BertLayer exports at opset 17.

    Q/K/V MatMul+Add, Reshape/Transpose to heads, Q Kᵀ, Div by sqrt(head_dim), [Add mask], Softmax, ·V,
    Transpose/Reshape back, output projection + residual + LayerNormalization, FFN with erf-GELU written op by
    op + residual + LayerNormalization. ``mask=True`` adds a constant additive padding mask (1,1,1,seq) with the
    last quarter of the positions masked out.
    """
    g = GraphWriter("bert_layer", seed)
    x = g.input("x", [1, seq, hidden])
    m = None
    if mask:
        m = np.zeros((1, 1, 1, seq), np.float32)
        m[..., seq - seq // 4:] = -10000.0   # BERT's (1 - mask) * -10000
    q, k, v = (linear(g, x, hidden, hidden, hint=n) for n in ("query", "key", "value"))
    ctx = attention(g, q, k, v, seq, heads, hidden, "div", m)
    h = layernorm(g, g.op("Add", [linear(g, ctx, hidden, hidden, hint="attn_out"), x], "residual"), hidden,
                  eps=1e-12, hint="attn_ln")
    f = linear(g, gelu_erf(g, linear(g, h, hidden, ffn, hint="intermediate")), ffn, hidden, hint="ffn_out")
    layernorm(g, g.op("Add", [f, h], "residual"), hidden, eps=1e-12, out="y", hint="ffn_ln")
    return g.finish({"y": [1, seq, hidden]}, bert_layer.__doc__)


def ln_linear_gelu(rows: int = 128, hidden: int = 768, ffn: int = 3072, seed: int = 0) -> onnx.ModelProto:
    """W4: LayerNormalization -> MatMul + Add -> erf-GELU (op by op) on a (rows, hidden) input."""
    g = GraphWriter("ln_linear_gelu", seed)
    x = g.input("x", [rows, hidden])
    gelu_erf(g, linear(g, layernorm(g, x, hidden), hidden, ffn), out="y")
    return g.finish({"y": [rows, ffn]}, ln_linear_gelu.__doc__)


def mlp3(rows: int = 64, width: int = 1024, depth: int = 3, seed: int = 0) -> onnx.ModelProto:
    """W6: (MatMul + Add + Relu) x depth on a (rows, width) input with (width, width) weights."""
    g = GraphWriter("mlp3", seed)
    y = g.input("x", [rows, width])
    for i in range(depth):
        # He-scaled so ReLU layers keep unit variance
        w = g.normal((width, width), (2.0 / width) ** 0.5, f"fc{i}_w")
        y = g.op("Add", [g.op("MatMul", [y, w], f"fc{i}"), g.normal((width,), 0.1, f"fc{i}_b")], f"fc{i}_bias")
        y = g.op("Relu", [y], f"relu{i}", out="y" if i == depth - 1 else None)
    return g.finish({"y": [rows, width]}, mlp3.__doc__)


def llama_block(seq: int = 256, hidden: int = 1024, heads: int = 16, ffn: int = 2816, rms_form: str = "div",
                seed: int = 0) -> onnx.ModelProto:
    """W7: LLaMA-style pre-norm decoder block at prefill (no KV cache).

    RMSNorm decomposed (Pow, ReduceMean, Add eps, Sqrt, Div — or Reciprocal+Mul with ``rms_form="reciprocal"``
    — Mul weight); bias-free q/k/v/o MatMuls; causal attention with a constant additive mask and the score
    scaled by Mul 1/sqrt(head_dim) (newer HF export); residual Adds; SwiGLU FFN down(silu(gate(h)) * up(h)) with
    SiLU as x*Sigmoid(x). No rotary embedding: it is elementwise work on q/k that does not change what the
    fusion passes see at the matmul/softmax boundaries.
    """
    g = GraphWriter("llama_block", seed)
    x = g.input("x", [1, seq, hidden])
    h = rmsnorm(g, x, hidden, form=rms_form, hint="attn_norm")
    q, k, v = (linear(g, h, hidden, hidden, bias=False, hint=n) for n in ("q_proj", "k_proj", "v_proj"))
    causal = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)[None, None]
    ctx = attention(g, q, k, v, seq, heads, hidden, "mul", causal)
    x = g.op("Add", [x, linear(g, ctx, hidden, hidden, bias=False, hint="o_proj")], "residual")
    h = rmsnorm(g, x, hidden, form=rms_form, hint="ffn_norm")
    gate = silu(g, linear(g, h, hidden, ffn, bias=False, hint="gate_proj"))
    up = linear(g, h, hidden, ffn, bias=False, hint="up_proj")
    down = linear(g, g.op("Mul", [gate, up], "swiglu"), ffn, hidden, bias=False, hint="down_proj")
    g.op("Add", [x, down], out="y")
    return g.finish({"y": [1, seq, hidden]}, llama_block.__doc__)
