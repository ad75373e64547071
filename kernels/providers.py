"""Where a provider's compiled ops live, resolved lazily and cached.

`cpu`: the one C++ extension's `torch.ops.fusionlens` namespace (built on first use);
`triton`: the kernel family's Triton functions (imported on first use, so Triton stays optional),
wrapped by `kernels/profiled_ops.py` so that a profiler sees them.
"""
from __future__ import annotations

from typing import Any

import torch


_RESOLVED: dict[tuple[str, str], Any] = {}  # a plain dict: torch.compile traces a lookup in it


def cpu_ops() -> Any:
    """`torch.ops.fusionlens`, with the C++ extension built (first time) or loaded."""
    from kernels._build import load_cpu_ops

    load_cpu_ops()
    return torch.ops.fusionlens


def provider_ops(provider: str, triton_module: str) -> Any:
    """The namespace holding `provider`'s ops for a family whose Triton code is `triton_module`."""
    ops = _RESOLVED.get((provider, triton_module))
    if ops is None:
        if provider == "cpu":
            ops = cpu_ops()
        elif provider == "triton":  # the module's functions, through library ops while profiled
            from kernels import profiled_ops

            ops = profiled_ops.namespace(triton_module)
        else:
            raise ValueError(f"provider {provider!r} has no compiled ops")
        _RESOLVED[(provider, triton_module)] = ops
    return ops
