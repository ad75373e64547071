"""Allocation of kernel outputs (one place, so allocation strategy is measured and tuned once)."""
from __future__ import annotations

import torch


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous tensor for a kernel output."""
    return torch.empty(shape, dtype=dtype, device=device)
