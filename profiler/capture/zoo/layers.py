"""Building blocks of the zoo: naive (primitive-op) modules and their native counterparts.

The naive modules are written with primitive ops on purpose (mean/var/rsqrt layer norm, tanh-GELU
spelled out, hand-written masked-softmax attention): they are what the fusion advisor matches and
replaces, so each is its own small `nn.Module` with a plain class name. Shape comments follow
nanoGPT: B batch, T sequence, C channels, H heads, D head dim.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class NaiveLayerNorm(nn.Module):
    """LayerNorm from primitives: mean, variance, rsqrt, scale and shift (5+ kernels unfused)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class NaiveRMSNorm(nn.Module):
    """RMSNorm (LLaMA) from primitives: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class NaiveGELU(nn.Module):
    """tanh-approximate GELU written out: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class SwiGLU(nn.Module):
    """LLaMA feed-forward: down(silu(gate(x)) * up(x)), with silu written as x * sigmoid(x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x)
        return self.down(g * torch.sigmoid(g) * self.up(x))


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (GPT-NeoX / LLaMA style) applied to q and k of shape (B, H, T, D)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))  # (D/2,)
        freqs = torch.outer(torch.arange(max_len).float(), inv_freq)  # (max_len, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_len, D)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = q.shape[-2]
        cos, sin = self.cos[:t].to(q.dtype), self.sin[:t].to(q.dtype)  # (T, D)
        return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin


class NaiveAttention(nn.Module):
    """Multi-head self-attention with a hand-written (optionally causal) masked softmax."""

    def __init__(self, dim: int, heads: int, max_len: int, causal: bool = True,
                 rope: bool = False, bias: bool = True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.rope = RotaryEmbedding(dim // heads, max_len) if rope else None
        if causal:
            mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_len, max_len), persistent=False)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, H, T, D)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.rope is not None:
            q, k = self.rope(q, k)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))  # (B, H, T, T)
        if self.causal:
            att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        att = torch.exp(att - att.amax(dim=-1, keepdim=True))
        att = att / att.sum(dim=-1, keepdim=True)
        return att @ v  # (B, H, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        y = self.attend(*self.split_heads(x))
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))  # (B, T, C)


class FusedAttention(NaiveAttention):
    """The same attention through F.scaled_dot_product_attention (fused kernel where available)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)); x + mlp(norm2(x)). Parts are injected by the model."""

    def __init__(self, norm1: nn.Module, attn: nn.Module, norm2: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PostNormBlock(TransformerBlock):
    """BERT's post-norm block: norm1(x + attn(x)); norm2(x + mlp(x))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


def gpt_mlp(dim: int, act: nn.Module) -> nn.Sequential:
    """GPT-2 feed-forward: Linear(C, 4C) -> act -> Linear(4C, C)."""
    return nn.Sequential(nn.Linear(dim, 4 * dim), act, nn.Linear(4 * dim, dim))


class ConvBNReLU(nn.Sequential):
    """conv3x3 -> BatchNorm2d -> ReLU: the classic inference-time conv+BN folding candidate."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True))
