"""Where a provider's compiled ops live, resolved lazily and cached.

`cpu`: the one C++ extension's `torch.ops.fusionlens` namespace (built on first use);
`triton`: the kernel family's Triton functions (imported on first use, so Triton stays optional),
wrapped by `kernels/profiled_ops.py` so that a profiler sees them.
"""
from __future__ import annotations

import functools
from typing import Any

import torch


@functools.cache
def provider_ops(provider: str, triton_module: str) -> Any:
    """The namespace holding `provider`'s ops for a family whose Triton code is `triton_module`."""
    if provider == "cpu":
        from kernels._build import load_cpu_ops

        load_cpu_ops()
        return torch.ops.fusionlens
    if provider == "triton":  # the module's functions, through library ops while profiled
        from kernels import profiled_ops

        return profiled_ops.namespace(triton_module)
    raise ValueError(f"provider {provider!r} has no compiled ops")
