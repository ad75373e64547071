"""Complex parameters in the multi-tensor optimizers: stepped as their real views, as torch.optim
does. AdamW against torch.optim.AdamW on the same complex params (its complex support is the
truth), LAMB against LAMB on the equivalent real params; state dicts keep complex tensors and
load in either direction; amsgrad switched on mid-run."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.optim import LAMB, AdamW

pytestmark = pytest.mark.usefixtures("cpu_provider")

SHAPES = ((), (1,), (7, 3), (257,), (16, 17))
STEPS = 60


def complex_params(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.complex128).to(dtype) for s in SHAPES]


def complex_grads(dtype: torch.dtype, steps: int = STEPS, seed: int = 1) -> list[list[torch.Tensor]]:
    """Per step, one grad per shape; the (16, 17) one is made transposed (non-contiguous)."""
    g = torch.Generator().manual_seed(seed)
    seq = []
    for _ in range(steps):
        grads = []
        for s in SHAPES:
            if s == (16, 17):
                grads.append(torch.randn((17, 16), generator=g, dtype=torch.complex128).t().to(dtype))
            else:
                grads.append(torch.randn(s, generator=g, dtype=torch.complex128).to(dtype))
        seq.append(grads)
    return seq


def run(make_opt, params0, seq) -> list[torch.Tensor]:
    params = [nn.Parameter(p.clone()) for p in params0]
    opt = make_opt(params)
    for grads in seq:
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("provider", ["cpu", "aten", "reference"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("amsgrad, maximize", [(False, False), (True, True)])
def test_adamw_complex_matches_torch(dtype, provider, amsgrad, maximize) -> None:
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, amsgrad=amsgrad, maximize=maximize)
    p0, seq = complex_params(dtype), complex_grads(dtype)
    ours = run(lambda ps: AdamW(ps, provider=provider, **hp), p0, seq)
    eager = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq)
    eps = torch.finfo(torch.float32 if dtype == torch.complex64 else torch.float64).eps
    for s, o, e, start in zip(SHAPES, ours, eager, p0):
        assert o.dtype == dtype and o.shape == start.shape
        assert torch.allclose(o, e, rtol=0, atol=64 * eps * max(1.0, float(e.abs().max()))), s
        assert not torch.equal(o, start), s  # it moved


def test_adamw_complex_next_to_real_and_non_dense() -> None:
    """A group of complex64, float32 and a complex param with holes (every other column)."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 10, generator=g, dtype=torch.complex64)

    def make():
        return [nn.Parameter(torch.randn(5, 4, generator=torch.Generator().manual_seed(4), dtype=torch.complex64)),
                nn.Parameter(torch.randn(9, generator=torch.Generator().manual_seed(5))),
                nn.Parameter(base.clone()[:, ::2])]

    ps, qs = make(), make()
    ours, eager = AdamW(ps, lr=3e-2), torch.optim.AdamW(qs, lr=3e-2, foreach=False)
    for _ in range(20):
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            q.grad = p.grad.clone()
        ours.step()
        eager.step()
    for p, q in zip(ps, qs):
        assert torch.allclose(p, q, rtol=0, atol=1e-6)
    assert not ps[2].is_contiguous() and set(ours.providers_used().values()) == {"cpu"}


@pytest.mark.parametrize("provider", ["cpu", "reference"])
@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_lamb_complex_equals_lamb_on_the_real_view(provider, use_nvlamb) -> None:
    """A complex param's trajectory is the [..., 2] real param's, bit for bit: same elements, same
    per-tensor norms (trust ratio) and the same global clipping norm."""
    p0, seq = complex_params(torch.complex64), complex_grads(torch.complex64, steps=40)
    hp = dict(lr=1e-2, weight_decay=0.01, max_grad_norm=1.0, use_nvlamb=use_nvlamb, provider=provider)
    as_complex = run(lambda ps: LAMB(ps, **hp), p0, seq)
    real0 = [torch.view_as_real(p).clone() for p in p0]
    real_seq = [[torch.view_as_real(gr) for gr in grads] for grads in seq]
    as_real = run(lambda ps: LAMB(ps, **hp), real0, real_seq)
    for s, c, r, start in zip(SHAPES, as_complex, as_real, p0):
        assert c.dtype == torch.complex64
        assert torch.equal(torch.view_as_real(c), r), s
        assert not torch.equal(c, start), s


def test_complex_state_dicts_load_both_ways() -> None:
    """The state holds complex moments (as torch's): ours -> torch.optim.AdamW -> ours continues the
    trajectory of ten uninterrupted torch steps."""
    p0, seq = complex_params(torch.complex64), complex_grads(torch.complex64, steps=15)
    straight = run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), p0, seq)
    params = [nn.Parameter(p.clone()) for p in p0]
    opts = [AdamW(params, lr=1e-2), torch.optim.AdamW(params, lr=1e-2, foreach=False), AdamW(params, lr=1e-2)]
    for i, grads in enumerate(seq):
        if i in (5, 10):
            saved = opts[i // 5 - 1].state_dict()
            assert all(st["exp_avg"].is_complex() for st in saved["state"].values())
            opts[i // 5].load_state_dict(saved)
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opts[i // 5].step()
    for p, s in zip(params, straight):
        assert torch.allclose(p, s, rtol=0, atol=1e-6)


def test_amsgrad_switched_on_mid_run_starts_its_max_then() -> None:
    """Five plain steps, then amsgrad: max_exp_avg_sq appears (in p's dtype, in the state dict) and
    is the running max of exp_avg_sq over the amsgrad steps only, also for a complex param."""
    ps = [nn.Parameter(torch.ones(4)), nn.Parameter(torch.ones(3, dtype=torch.complex64))]
    opt = AdamW(ps, lr=1e-2)
    g = torch.Generator().manual_seed(6)
    seen = {id(p): [] for p in ps}
    for i in range(8):
        if i == 5:
            opt.param_groups[0]["amsgrad"] = True
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        opt.step()
        for p in ps:
            if i >= 5:
                v = opt.state[p]["exp_avg_sq"]
                seen[id(p)].append((torch.view_as_real(v) if p.is_complex() else v).clone())
            else:
                assert "max_exp_avg_sq" not in opt.state[p]
    for p in ps:
        st = opt.state[p]
        assert st["max_exp_avg_sq"].dtype == p.dtype and float(st["step"]) == 8
        got = torch.view_as_real(st["max_exp_avg_sq"]) if p.is_complex() else st["max_exp_avg_sq"]
        assert torch.equal(got, torch.stack(seen[id(p)]).amax(0))
