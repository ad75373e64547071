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


def check_bad_target_rows(vocab: int, dtype: torch.dtype, device: str = "cpu") -> None:
    """Triton cross-entropy over 4 rows whose targets are in range, past the end, negative and
    ignored: rows 1-2 get a NaN loss and gradient (nothing read out of bounds), row 0 a finite
    one, row 3 zero."""
    from kernels.registry import dispatch
    from tests.kernels.numerics import make

    x = make((4, vocab), dtype, 1).to(device).requires_grad_()
    t = torch.tensor([3, vocab, -1, -100], device=device)
    loss = dispatch("cross_entropy", x, t, reduction="none", provider="triton")
    (g,) = torch.autograd.grad(loss.nan_to_num().sum() + 0 * loss.sum(), x)  # every row's gradient
    assert loss[0].isfinite() and loss[1:3].isnan().all() and loss[3] == 0, loss
    assert g[0].isfinite().all() and g[1:3].isnan().all() and (g[3] == 0).all(), g
