"""Cross-entropy test helpers shared by the fused cross-entropy and the fused linear +
cross-entropy tests: class targets with ignored rows, and the fused linear + CE as a function of
(x, weight, target, bias) for `check_against_reference`."""
from __future__ import annotations

import torch

from kernels.linear_cross_entropy import fused_linear_cross_entropy


def targets(n: int, v: int, seed: int = 0, ignore_rows: tuple[int, ...] = (1,)) -> torch.Tensor:
    t = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(seed))
    for r in ignore_rows:
        if r < n and n > 2:
            t[r] = -100
    return t


def flce(provider: str, chunk_size):
    return lambda x, w, t, b, **kw: fused_linear_cross_entropy(x, w, t, b, chunk_size=chunk_size,
                                                              provider=provider, **kw)
