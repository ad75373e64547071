"""FusionLens fused kernels: C++ on CPU, Triton on NVIDIA GPUs, with autograd.

Public API (stable names; each function takes an optional `provider=` keyword):
layer_norm, rms_norm, add_layer_norm, add_rms_norm, bias_gelu, gelu, swiglu, geglu, softmax,
rope, cross_entropy, fused_linear_cross_entropy, AdamW, LAMB, KERNELS, available_providers.

Names resolve lazily (PEP 562), so `import kernels` compiles nothing and imports no kernel
family until it is used.
"""
from __future__ import annotations

import importlib
from typing import Any

from kernels.registry import KERNELS, available_providers

_LAZY: dict[str, str] = {
    "layer_norm": "kernels.norms",
    "rms_norm": "kernels.norms",
    "add_layer_norm": "kernels.norms",
    "add_rms_norm": "kernels.norms",
    "bias_gelu": "kernels.activations",
    "gelu": "kernels.activations",
    "swiglu": "kernels.activations",
    "geglu": "kernels.activations",
    "softmax": "kernels.softmax",
    "rope": "kernels.rope",
    "cross_entropy": "kernels.cross_entropy",
    "fused_linear_cross_entropy": "kernels.cross_entropy",
    "AdamW": "kernels.optim",
    "LAMB": "kernels.optim",
}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(_LAZY.values()))

__all__ = sorted([*_LAZY, "KERNELS", "available_providers", "load_all"])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def load_all() -> dict:
    """Import every kernel family so that KERNELS is complete; returns KERNELS."""
    for module in FAMILIES:
        importlib.import_module(module)
    return KERNELS
