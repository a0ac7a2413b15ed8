"""The conv block, BERT-style layer and LLaMA-style block of the benchmarks as PyTorch modules (needs torch).

Written the way PyTorch code usually is (``nn.Linear``, ``nn.LayerNorm``, ``F.gelu``,
``F.scaled_dot_product_attention``, a hand-written RMSNorm), not as copies of the ONNX graphs: they check
that the PyTorch frontend reaches the same kernels as the ONNX one. Seeded random weights, BatchNorm with
non-trivial running statistics; each builder returns ``(module in eval mode, example inputs)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvBlock(nn.Module):
    """Conv 3x3 (with bias) -> BatchNorm -> ReLU."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=True)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _heads(t, heads):
    b, n, d = t.shape
    return t.view(b, n, heads, d // heads).transpose(1, 2)


def _merge(t):
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


class BertLayer(nn.Module):
    """Post-LN encoder layer: SDPA self-attention, output projection + residual + LayerNorm, GELU FFN."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(hidden, hidden) for _ in range(4))
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        q, k, v = (_heads(p(x), self.heads) for p in (self.query, self.key, self.value))
        h = self.attn_norm(self.out(_merge(F.scaled_dot_product_attention(q, k, v))) + x)
        return self.ffn_norm(self.down(F.gelu(self.up(h))) + h)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, bias-free projections, causal SDPA, residuals, SwiGLU FFN."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.ffn_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False)
                                                              for _ in range(4))
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        h = self.attn_norm(x)
        q, k, v = (_heads(p(h), self.heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        x = x + self.o_proj(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        h = self.ffn_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / max(1, p.shape[-1]) ** 0.5))
        for m in module.modules():
            if isinstance(m, (nn.LayerNorm, RMSNorm)):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                if getattr(m, "bias", None) is not None:
                    m.bias.uniform_(-0.2, 0.2, generator=gen)
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.5, 0.5, generator=gen)
                m.running_mean.uniform_(-0.5, 0.5, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
    return module.eval()


def _input(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1))


def conv_block(in_channels: int = 64, out_channels: int = 128, hw: int = 56, seed: int = 0):
    return _randomize(ConvBlock(in_channels, out_channels), seed), (_input((1, in_channels, hw, hw), seed),)


def bert_layer(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, seed: int = 0):
    return _randomize(BertLayer(hidden, heads, ffn), seed), (_input((1, seq, hidden), seed),)


def llama_block(seq: int = 256, hidden: int = 1024, heads: int = 16, ffn: int = 2816, seed: int = 0):
    return _randomize(LlamaBlock(hidden, heads, ffn), seed), (_input((1, seq, hidden), seed),)


TORCH_MODELS = {"conv_block": conv_block, "bert_layer": bert_layer, "llama_block": llama_block}


class KVCacheStep(nn.Module):
    """A Hugging Face decoder with its KV cache as explicit tensors, the form a serving loop exports.

    ``forward(input_ids, *past)``: ``past`` holds each layer's keys and values (batch, kv_heads, length,
    head_dim), in layer order, K before V; none at all is a prefill. The wrapper fills a transformers
    ``DynamicCache`` with them, so the model's own cache handling runs (RoPE positions from the cache length,
    the causal mask over cache + new tokens, GQA repeat), and returns the last position's logits (batch,
    vocab) for a model with a language-model head, else the last hidden state, then the cache after the
    call, K/V per layer. The logits of the last position only: a generation loop reads nothing else, and
    the full (tokens x vocab) product of a prefill would be most of its time."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, input_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        if hasattr(self.inner, "lm_head"):
            base = getattr(self.inner, self.inner.base_model_prefix)
            out = base(input_ids=input_ids, past_key_values=cache, use_cache=True)
            first, layers = self.inner.lm_head(out.last_hidden_state[:, -1, :]), out.past_key_values.layers
        else:
            out = self.inner(input_ids=input_ids, past_key_values=cache, use_cache=True)
            first, layers = out.last_hidden_state, out.past_key_values.layers
        present = []
        for layer in layers:
            present += [layer.keys, layer.values]
        return (first, *present)


def kv_cache_layout(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers decoder config."""
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return layers, kv_heads, head_dim


def kv_cache_names(layers: int, prefix: str) -> list[str]:
    """``<prefix>_k0, <prefix>_v0, <prefix>_k1, ...``: the cache tensors' names, in ``KVCacheStep``'s order."""
    return [f"{prefix}_{k}{i}" for i in range(layers) for k in "kv"]
