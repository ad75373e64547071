"""Benchmark cases for the multi-tensor optimizers (contract: `benchmarks/kernels/__init__.py`).

Parameter set: a GPT-2-small-shaped model cut to 4 layers and a 8192-token vocabulary
(wte 8192x768, wpe 1024x768, per layer 2 LayerNorms, c_attn 768x2304, attn c_proj 768x768,
c_fc 768x3072, mlp c_proj 3072x768 with biases; ln_f): 52 tensors, 35.4M fp32 params, sizes from
768 to 6.3M elements. All variants get the same gradient tensors; each has its own params/state.
(FL_BENCH_QUICK=1: 1 layer.)

- adamw_step: naive = torch.optim.AdamW(foreach=False) (the default on CPU), foreach =
  (foreach=True), aten = (fused=True, ATen's fused CPU kernel), ours = kernels.AdamW; plus
  torch.compile of the foreach=False step (by the driver).
- lamb_step: naive = a per-parameter loop of eager ops (kernels.LAMB(provider="reference")),
  foreach = the same algorithm with torch._foreach_* ops (written below), ours = kernels.LAMB.
Bytes per step (fp32): AdamW 28 B/param (read g, p, m, v; write p, m, v); LAMB 44 B/param
(+ the global grad-norm pass, and stage 2 rereads m, v, p and writes p).
"""
from __future__ import annotations

import math
import os

import torch

from kernels.optim import LAMB, AdamW

LAYER = (("ln_1.weight", (768,)), ("ln_1.bias", (768,)), ("attn.c_attn.weight", (768, 2304)),
         ("attn.c_attn.bias", (2304,)), ("attn.c_proj.weight", (768, 768)), ("attn.c_proj.bias", (768,)),
         ("ln_2.weight", (768,)), ("ln_2.bias", (768,)), ("mlp.c_fc.weight", (768, 3072)),
         ("mlp.c_fc.bias", (3072,)), ("mlp.c_proj.weight", (3072, 768)), ("mlp.c_proj.bias", (768,)))


def param_shapes(layers: int) -> list[tuple[int, ...]]:
    shapes = [(8192, 768), (1024, 768)]
    shapes += [s for _ in range(layers) for _, s in LAYER]
    return shapes + [(768,), (768,)]


def _make(shapes, grads, seed: int = 0) -> list[torch.nn.Parameter]:
    """Params in the grads' device and dtype, with those grads attached."""
    g = torch.Generator().manual_seed(seed)
    dev, dt = grads[0].device, grads[0].dtype
    ps = [torch.nn.Parameter((0.02 * torch.randn(s, generator=g)).to(dev, dt)) for s in shapes]
    for p, gr in zip(ps, grads):
        p.grad = gr
    return ps


def _foreach_lamb(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                  max_grad_norm=1.0):
    """LAMB with torch._foreach_* ops (apex semantics, adam_w_mode), as a step closure."""
    b1, b2 = betas
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    state = {"step": 0}

    @torch.no_grad()
    def step():
        state["step"] += 1
        k = state["step"]
        grads = [p.grad for p in params]
        gnorm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
        div = gnorm / max_grad_norm if gnorm > max_grad_norm else 1.0
        g = torch._foreach_div(grads, div)
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        denom = torch._foreach_div(v, 1 - b2 ** k)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, eps)
        u = torch._foreach_div(m, 1 - b1 ** k)
        torch._foreach_div_(u, denom)
        torch._foreach_add_(u, params, alpha=weight_decay)
        pn, un = torch._foreach_norm(params), torch._foreach_norm(u)
        ratios = [torch.where((a > 0) & (b > 0), a / b, torch.ones_like(a)) for a, b in zip(pn, un)]
        torch._foreach_mul_(u, ratios)
        torch._foreach_add_(params, u, alpha=-lr)

    return step


def cases(threads: int) -> list[dict]:
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    shapes = param_shapes(1 if quick else 4)
    return _cases(shapes, "cpu", "cpu") + _variant_cases(shapes)


def _setup(shapes, device: str) -> tuple[int, list[torch.Tensor], dict, str]:
    """(param count, fp32 grads on device, hyperparameters, shape label) every case shares."""
    n = sum(math.prod(s) for s in shapes)
    g = torch.Generator().manual_seed(1)
    grads = [(1e-3 * torch.randn(s, generator=g)).to(device) for s in shapes]
    return n, grads, dict(lr=1e-4, weight_decay=0.01), f"{len(shapes)} tensors, {n / 1e6:.1f}M params"


def _variant_cases(shapes) -> list[dict]:
    """bf16 params (AdamW, LAMB) and fp32 AMSGrad on the CPU: each of these ran a scalar loop in
    every ISA copy until 2026-12-03 (2.4-5.5x slower; docs/kernels.md), unseen while the bench
    timed fp32 without AMSGrad only."""
    n, grads32, hp, shape = _setup(shapes, "cpu")
    grads16 = [x.to(torch.bfloat16) for x in grads32]
    out = []
    for dtype, grads, extra, tag in (("bfloat16", grads16, {}, "bf16 params and states"),
                                     ("float32", grads32, {"amsgrad": True}, "amsgrad=True")):
        width = 2 if dtype == "bfloat16" else 4
        adamw = {"naive": torch.optim.AdamW(_make(shapes, grads), foreach=False, **hp, **extra),
                 "aten": torch.optim.AdamW(_make(shapes, grads), fused=True, **hp, **extra),
                 "ours": AdamW(_make(shapes, grads), provider="cpu", **hp, **extra)}
        per_param = (7 + (2 if extra else 0)) * width  # read g, p, m, v (+vmax); write p, m, v (+vmax)
        out.append(dict(kernel="adamw_step", **{"pass": "step"}, shape=shape + (", amsgrad" if extra else ""),
                        dtype=dtype, variants={k: o.step for k, o in adamw.items()}, baseline="naive", compile=None,
                        bytes=float(per_param) * n, notes=f"GPT-2-small-shaped, {tag}"))
    lamb = {"naive": LAMB(_make(shapes, grads16), provider="reference", **hp).step,
            "ours": LAMB(_make(shapes, grads16), provider="cpu", **hp).step}
    out.append(dict(kernel="lamb_step", **{"pass": "step"}, shape=shape, dtype="bfloat16",
                    variants=lamb, baseline="naive", compile=None, bytes=22.0 * n,
                    notes="apex FusedLAMB semantics, max_grad_norm=1, bf16 params and states"))
    return out + _small_tensor_cases()


def _small_tensor_cases(count: int = 1024, size: int = 768) -> list[dict]:
    """Many small fp32 tensors (a deep model's norm weights and biases): the per-tensor Python
    cost of gathering a step (state lookup, layout checks) against fused=True's own."""
    shapes = [(size,)] * count
    n, grads, hp, shape = _setup(shapes, "cpu")
    adamw = {"naive": torch.optim.AdamW(_make(shapes, grads), foreach=False, **hp),
             "aten": torch.optim.AdamW(_make(shapes, grads), fused=True, **hp),
             "ours": AdamW(_make(shapes, grads), provider="cpu", **hp)}
    lamb = {"naive": LAMB(_make(shapes, grads), provider="reference", **hp).step,
            "ours": LAMB(_make(shapes, grads), provider="cpu", **hp).step}
    note = f"{count} tensors of {size}: per-tensor overhead"
    return [dict(kernel="adamw_step", **{"pass": "step"}, shape=shape, dtype="float32",
                 variants={k: o.step for k, o in adamw.items()}, baseline="naive", compile=None,
                 bytes=28.0 * n, notes=note),
            dict(kernel="lamb_step", **{"pass": "step"}, shape=shape, dtype="float32", variants=lamb,
                 baseline="naive", compile=None, bytes=44.0 * n, notes=note)]


def gpu_cases(device: str = "cuda") -> list[dict]:
    """GPT-2-small's full 124M-parameter set (vocab 50257, 12 layers) on the GPU, Triton provider."""
    shapes = [(50257, 768), (1024, 768)] + [s for _ in range(12) for _, s in LAYER] + [(768,), (768,)]
    return _cases(shapes, device, "triton")


def gpu_checks(device: str = "cuda") -> list[tuple[str, object]]:
    """20 steps of the Triton optimizers vs torch.optim.AdamW / the per-parameter LAMB, fp32."""
    shapes = [(), (1,), (7, 3), (100003,), (768, 2304)]

    def check(make_ours, make_ref):
        g = torch.Generator().manual_seed(2)
        seq = [[torch.randn(s, generator=g).to(device) for s in shapes] for _ in range(20)]
        a, b = _make(shapes, seq[0]), _make(shapes, seq[0])
        oa, ob = make_ours(a), make_ref(b)
        for grads in seq:
            for p, q, gr in zip(a, b, grads):
                p.grad, q.grad = gr.clone(), gr.clone()
            oa.step()
            ob.step()
        err = max(float((p - q).abs().max()) for p, q in zip(a, b))
        if err > 1e-5:
            raise AssertionError(f"max |ours - reference| = {err:.3g} after 20 steps")

    return [("adamw_step triton vs torch.optim.AdamW (20 steps)",
             lambda: check(lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1, provider="triton"),
                           lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False))),
            ("lamb_step triton vs per-parameter LAMB (20 steps)",
             lambda: check(lambda ps: LAMB(ps, lr=1e-2, provider="triton"),
                           lambda ps: LAMB(ps, lr=1e-2, provider="reference")))]


def _cases(shapes, device: str, provider: str) -> list[dict]:
    n, grads, hp, shape = _setup(shapes, device)
    adamw = {
        "naive": torch.optim.AdamW(_make(shapes, grads), foreach=False, **hp),
        "foreach": torch.optim.AdamW(_make(shapes, grads), foreach=True, **hp),
        "aten": torch.optim.AdamW(_make(shapes, grads), fused=True, **hp),
        "ours": AdamW(_make(shapes, grads), provider=provider, **hp),
    }

    def compiled_step():
        opt = torch.optim.AdamW(_make(shapes, grads), foreach=False, **hp)
        return torch.compile(opt.step)

    lamb = {
        "naive": LAMB(_make(shapes, grads), provider="reference", **hp).step,
        "foreach": _foreach_lamb(_make(shapes, grads), **hp),
        "ours": LAMB(_make(shapes, grads), provider=provider, **hp).step,
    }
    return [
        dict(kernel="adamw_step", **{"pass": "step"}, shape=shape, dtype="float32",
             variants={k: o.step for k, o in adamw.items()}, baseline="naive",
             compile=compiled_step, bytes=28.0 * n, notes="GPT-2-small-shaped, 4 layers, vocab 8192"),
        dict(kernel="lamb_step", **{"pass": "step"}, shape=shape, dtype="float32",
             variants=lamb, baseline="naive", compile=None, bytes=44.0 * n,
             notes="apex FusedLAMB semantics, max_grad_norm=1"),
    ]
