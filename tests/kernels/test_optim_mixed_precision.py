"""AdamW and LAMB in mixed-precision training as users write it: autocast and
`torch.amp.GradScaler`, whose unscale, inf check and skipped steps the optimizers must follow."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.optim import LAMB, AdamW

pytestmark = pytest.mark.usefixtures("cpu_provider")


@pytest.mark.parametrize("opt", ["AdamW", "LAMB"])
def test_under_grad_scaler_with_a_skipped_step(opt: str) -> None:
    """Mixed precision as users write it: autocast (bf16) and `torch.amp.GradScaler`, which
    unscales the grads, skips the step whose grads hold an inf and halves its scale. Ours takes
    the same steps as torch.optim.AdamW (LAMB: as our own LAMB stepped on the unscaled grads,
    with the inf step left out)."""
    def train(make, inf_at: int | None = 3, scaler_on: bool = True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        optimizer = make(model.parameters())
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, enabled=scaler_on)
        for i in range(8):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            if i == inf_at:
                if not scaler_on:
                    continue  # the scaler's skip, by hand
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
        return torch.cat([p.detach().flatten() for p in model.parameters()]), scaler.get_scale(), optimizer

    ours, scale, optimizer = train(lambda ps: {"AdamW": AdamW, "LAMB": LAMB}[opt](ps, lr=1e-2))
    want, _, _ = (train(lambda ps: torch.optim.AdamW(ps, lr=1e-2)) if opt == "AdamW" else
                  train(lambda ps: LAMB(ps, lr=1e-2, provider="reference"), scaler_on=False))
    assert scale == 2.0 ** 15  # halved once, at the inf step
    assert all(float(s["step"]) == 7 for s in optimizer.state.values())  # 8 steps, one skipped
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)
