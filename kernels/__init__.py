"""FusionLens fused kernels: C++ on CPU, Triton on NVIDIA GPUs, with autograd.

Public API (stable names; each function takes an optional `provider=` keyword):
layer_norm, rms_norm, add_layer_norm, add_rms_norm, bias_gelu, gelu, swiglu, geglu, softmax,
rope, cross_entropy, fused_linear_cross_entropy, AdamW, LAMB, KERNELS, available_providers,
provider_choice (which provider a call gets, chosen by measurement: see kernels/tuning.py),
output_pool_stats / empty_output_pool (the pool that large CPU outputs come from: kernels/_alloc.py),
op_cost (FLOPs and bytes of one call of a `torch.ops.fusionlens.*` op, for profilers).
The nn.Module forms, drop-ins for torch's and HF's: LayerNorm, RMSNorm, AddLayerNorm, AddRMSNorm,
GELU, BiasGELU, SwiGLU, GeGLU, Softmax, RotaryEmbedding, CrossEntropyLoss,
FusedLinearCrossEntropyLoss.

Importing the package imports every kernel family module (they import only torch and the
registry) but compiles nothing and queries no device: the C++ extension is built on the first
call of a `cpu` provider and Triton is imported on the first `triton` call. The names are bound
here after the submodules are imported, so `kernels.softmax` is the function even though a
submodule of that name exists.
"""
from __future__ import annotations

from kernels.registry import KERNELS, available_providers, op_cost
from kernels.norms import AddLayerNorm, AddRMSNorm, LayerNorm, RMSNorm, add_layer_norm, add_rms_norm, layer_norm, rms_norm
from kernels.activations import GELU, BiasGELU, GeGLU, SwiGLU, bias_gelu, geglu, gelu, swiglu
from kernels.softmax import Softmax, softmax
from kernels.rope import RotaryEmbedding, rope
from kernels.cross_entropy import CrossEntropyLoss, cross_entropy, fused_linear_cross_entropy
from kernels.linear_cross_entropy import FusedLinearCrossEntropyLoss
from kernels.optim import LAMB, AdamW
from kernels.tuning import provider_choice
from kernels._alloc import empty_output_pool, output_pool_stats

FAMILIES: tuple[str, ...] = ("kernels.norms", "kernels.activations", "kernels.softmax",
                             "kernels.rope", "kernels.cross_entropy", "kernels.optim")

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "bias_gelu", "gelu",
           "swiglu", "geglu", "softmax", "rope", "cross_entropy", "fused_linear_cross_entropy",
           "AdamW", "LAMB", "KERNELS", "available_providers", "provider_choice", "load_all",
           "output_pool_stats", "empty_output_pool", "op_cost",
           "LayerNorm", "RMSNorm", "AddLayerNorm", "AddRMSNorm", "GELU", "BiasGELU", "SwiGLU", "GeGLU",
           "Softmax", "RotaryEmbedding", "CrossEntropyLoss", "FusedLinearCrossEntropyLoss"]


def load_all() -> dict:
    """Every kernel family is registered on import; returns KERNELS (kept for callers)."""
    return KERNELS
