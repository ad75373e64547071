"""Where a provider's compiled ops live, resolved lazily and cached.

`cpu`: the one C++ extension's `torch.ops.fusionlens` namespace (built on first use);
`triton`: the kernel family's Triton functions (imported on first use, so Triton stays optional),
wrapped by `kernels/profiled_ops.py` so that a profiler sees them.
"""
from __future__ import annotations

from typing import Any

import torch

from kernels import profiled_ops


_CPU_OPS: Any = None  # torch.ops.fusionlens once the extension is loaded (the cpu probe sets it)


def cpu_ops() -> Any:
    """`torch.ops.fusionlens`, with the C++ extension built (first time) or loaded."""
    global _CPU_OPS
    if _CPU_OPS is None:
        from kernels._build import load_cpu_ops

        load_cpu_ops()
        _CPU_OPS = torch.ops.fusionlens
    return _CPU_OPS


def provider_ops(provider: str, triton_module: str) -> Any:
    """The namespace holding `provider`'s ops for a family whose Triton code is `triton_module`.

    Everything it reads is filled before a torch.compile trace can meet it: the cpu probe calls
    `cpu_ops()` and the triton probe builds the entry points (profiled_ops.prepare), and the
    probes run outside any trace. A trace that filled a cache would change what the next call's
    guards see and compile the model again."""
    if provider == "cpu":
        return cpu_ops()
    if provider == "triton":  # the module's functions, through library ops while profiled
        return profiled_ops.namespace(triton_module)
    raise ValueError(f"provider {provider!r} has no compiled ops")
