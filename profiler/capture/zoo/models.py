"""Zoo models: GPT-2 (naive and native ops), LLaMA-style, BERT-style, ViT, CNN and MLP.

Each model registers a config dataclass (sizes; presets "tiny" for tests, "small", the default,
which steps in well under a second on a laptop-class CPU, and "medium" for overhead benchmarks) and a builder returning
`(model, inputs)`. Transformer inputs include targets so `forward` returns a 0-dim loss, the same
contract a user spec follows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from profiler.capture.zoo.layers import (ConvBNReLU, FusedAttention, NaiveAttention, NaiveGELU,
                                         NaiveLayerNorm, NaiveRMSNorm, PostNormBlock, SwiGLU,
                                         TransformerBlock, gpt_mlp)
from profiler.capture.zoo.registry import register_zoo


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a small transformer (vocab V, sequence T, width C, heads H, layers L, batch B)."""

    vocab: int = 2048
    seq_len: int = 64
    dim: int = 128
    heads: int = 4
    layers: int = 2
    batch: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab", "seq_len", "dim", "heads", "layers", "batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.heads} heads of even size")


TRANSFORMER_PRESETS = {"tiny": dict(vocab=64, seq_len=8, dim=16, heads=2, layers=1, batch=2),
                       "small": {},
                       "medium": dict(vocab=4096, seq_len=128, dim=256, heads=4, layers=4, batch=4)}


class TokenLM(nn.Module):
    """Embedding -> blocks -> final norm -> tied LM head; returns loss when targets are given."""

    def __init__(self, cfg: TransformerConfig, blocks: list[nn.Module], final_norm: nn.Module,
                 learned_pos: bool = True):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq_len, cfg.dim) if learned_pos else None
        self.blocks = nn.ModuleList(blocks)
        self.norm = final_norm
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as GPT-2

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok(idx)  # (B, T, C)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))  # (B*T, V)


def _token_inputs(cfg: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len))
    return idx, torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len))


@register_zoo("gpt2-naive", TransformerConfig, TRANSFORMER_PRESETS)
def gpt2_naive(cfg: TransformerConfig):
    """GPT-2 decoder from primitive ops: NaiveLayerNorm, NaiveGELU, NaiveAttention."""
    blocks = [TransformerBlock(NaiveLayerNorm(cfg.dim), NaiveAttention(cfg.dim, cfg.heads, cfg.seq_len),
                               NaiveLayerNorm(cfg.dim), gpt_mlp(cfg.dim, NaiveGELU()))
              for _ in range(cfg.layers)]
    return TokenLM(cfg, blocks, NaiveLayerNorm(cfg.dim)), _token_inputs(cfg)


@register_zoo("gpt2", TransformerConfig, TRANSFORMER_PRESETS)
def gpt2_native(cfg: TransformerConfig):
    """The same GPT-2 with native fused ops: nn.LayerNorm, tanh GELU, scaled_dot_product_attention."""
    blocks = [TransformerBlock(nn.LayerNorm(cfg.dim), FusedAttention(cfg.dim, cfg.heads, cfg.seq_len),
                               nn.LayerNorm(cfg.dim), gpt_mlp(cfg.dim, nn.GELU(approximate="tanh")))
              for _ in range(cfg.layers)]
    return TokenLM(cfg, blocks, nn.LayerNorm(cfg.dim)), _token_inputs(cfg)


@register_zoo("llama", TransformerConfig, TRANSFORMER_PRESETS)
def llama(cfg: TransformerConfig):
    """LLaMA-style decoder: NaiveRMSNorm, SwiGLU, rotate-half RoPE, naive causal attention, no biases."""
    hidden = 8 * cfg.dim // 3
    blocks = [TransformerBlock(NaiveRMSNorm(cfg.dim),
                               NaiveAttention(cfg.dim, cfg.heads, cfg.seq_len, rope=True, bias=False),
                               NaiveRMSNorm(cfg.dim), SwiGLU(cfg.dim, hidden))
              for _ in range(cfg.layers)]
    return TokenLM(cfg, blocks, NaiveRMSNorm(cfg.dim), learned_pos=False), _token_inputs(cfg)


@register_zoo("bert", TransformerConfig, TRANSFORMER_PRESETS)
def bert(cfg: TransformerConfig):
    """BERT-style encoder: post-norm blocks, bidirectional naive attention, erf GELU, token loss."""
    blocks = [PostNormBlock(nn.LayerNorm(cfg.dim), NaiveAttention(cfg.dim, cfg.heads, cfg.seq_len, causal=False),
                            nn.LayerNorm(cfg.dim), gpt_mlp(cfg.dim, nn.GELU()))
              for _ in range(cfg.layers)]
    return TokenLM(cfg, blocks, nn.LayerNorm(cfg.dim)), _token_inputs(cfg)


@dataclass(frozen=True)
class ImageConfig:
    """Image classifier sizes: image side, channels (width), classes, depth, batch."""

    image: int = 32
    width: int = 32
    classes: int = 10
    depth: int = 2
    batch: int = 8

    def __post_init__(self) -> None:
        for name in ("image", "width", "classes", "depth", "batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(frozen=True)
class ViTConfig(ImageConfig):
    """ImageConfig plus the ViT's patch side and heads (model width = width x heads)."""

    patch: int = 4
    heads: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("patch", "heads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.image % self.patch:
            raise ValueError(f"image {self.image} must be a multiple of patch {self.patch}")


CNN_PRESETS = {"tiny": dict(image=8, width=8, classes=4, depth=1, batch=2),
               "small": {},
               "medium": dict(image=32, width=64, depth=3, batch=16)}
VIT_PRESETS = {"tiny": dict(CNN_PRESETS["tiny"], patch=4, heads=2),
               "small": {},
               "medium": dict(CNN_PRESETS["medium"], patch=4, heads=4)}


class SmallCNN(nn.Module):
    """conv-BN-ReLU stages (stride 2 after the first), global average pool, linear classifier."""

    def __init__(self, cfg: ImageConfig):
        super().__init__()
        stages = [ConvBNReLU(3, cfg.width)]
        stages += [ConvBNReLU(cfg.width, cfg.width, stride=2) for _ in range(cfg.depth)]
        self.features = nn.Sequential(*stages)
        self.fc = nn.Linear(cfg.width, cfg.classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.fc(self.features(x).mean(dim=(2, 3)))  # (B, classes)
        return logits if labels is None else F.cross_entropy(logits, labels)


def _image_inputs(cfg: ImageConfig) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(cfg.batch, 3, cfg.image, cfg.image), torch.randint(0, cfg.classes, (cfg.batch,))


@register_zoo("cnn", ImageConfig, CNN_PRESETS)
def cnn(cfg: ImageConfig):
    """Small CNN of conv-BN-ReLU blocks (conv+BN folding candidates in inference)."""
    return SmallCNN(cfg), _image_inputs(cfg)


class ViT(nn.Module):
    """Vision transformer: conv patch embedding, pre-norm blocks with fused attention, mean pool."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        dim, n = cfg.width * cfg.heads, (cfg.image // cfg.patch) ** 2
        self.embed = nn.Conv2d(3, dim, cfg.patch, cfg.patch)
        self.pos = nn.Parameter(torch.zeros(1, n, dim))
        self.blocks = nn.Sequential(*[TransformerBlock(nn.LayerNorm(dim), FusedAttention(dim, cfg.heads, n, causal=False),
                                                       nn.LayerNorm(dim), gpt_mlp(dim, nn.GELU()))
                                      for _ in range(cfg.depth)])
        self.head = nn.Linear(dim, cfg.classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos  # (B, C, h, w) -> (B, N, C)
        logits = self.head(self.blocks(x).mean(dim=1))  # (B, classes)
        return logits if labels is None else F.cross_entropy(logits, labels)


@register_zoo("vit", ViTConfig, VIT_PRESETS)
def vit(cfg: ViTConfig):
    """Small ViT (patch embedding + native transformer blocks)."""
    return ViT(cfg), _image_inputs(cfg)


@dataclass(frozen=True)
class MLPConfig:
    """MLP sizes: input features, hidden width, depth (hidden layers), outputs, batch."""

    features: int = 256
    hidden: int = 512
    depth: int = 3
    outputs: int = 10
    batch: int = 64

    def __post_init__(self) -> None:
        for name in ("features", "hidden", "depth", "outputs", "batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")


@register_zoo("mlp", MLPConfig, {"tiny": dict(features=8, hidden=16, depth=1, outputs=4, batch=4), "small": {},
                            "medium": dict(features=512, hidden=1024, depth=4, batch=128)})
def mlp(cfg: MLPConfig):
    """MLP of Linear+ReLU layers; returns logits (the runner's loss is their mean)."""
    layers: list[nn.Module] = []
    width = cfg.features
    for _ in range(cfg.depth):
        layers += [nn.Linear(width, cfg.hidden), nn.ReLU()]
        width = cfg.hidden
    layers.append(nn.Linear(width, cfg.outputs))
    return nn.Sequential(*layers), (torch.randn(cfg.batch, cfg.features),)
