"""Benchmark cases for the softmax kernel (contract: `benchmarks/kernels/__init__.py`).

Attention probabilities at [batch 8, heads 12, 512, 512] fp32 (FL_BENCH_QUICK=1: [2, 12, 256,
256]), forward (no_grad) and forward+backward, three flavours:
- plain: naive = `exp(x - max) / sum` written out, aten = `torch.softmax` (the fused op), ours;
  forward also aten_out / ours_out: both kernels writing a preallocated output;
- causal: `softmax(x * scale).masked_fill(triu, -inf)` as hand-written attention does it: naive
  = the eager reference (mul, masked_fill, ATen softmax), ours with causal=True;
- padding: `softmax(x * scale + mask[B, 1, 1, S])`: naive = the eager reference, ours.
torch.compile of the naive composition is added by the driver.
"""
from __future__ import annotations

import importlib
import os
from functools import lru_cache

import torch

import kernels
from kernels.registry import KERNELS
sm = importlib.import_module("kernels.softmax")  # the module; `kernels.softmax` is the function

SCALE = 0.125  # 1 / sqrt(head_dim 64)


def _naive_plain(x: torch.Tensor) -> torch.Tensor:
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


@lru_cache(maxsize=None)
def _tensors(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(shape, generator=g).to(device=device, dtype=dtype) for k in ("x", "dy")}
    mask = torch.zeros(shape[0], 1, 1, shape[-1])
    for b in range(shape[0]):
        mask[b, ..., shape[-1] - 17 * b:] = float("-inf")  # padded tails of different lengths
    t["mask"] = mask.to(device=device, dtype=dtype)
    return t


def _step(fn, x: torch.Tensor, backward: bool, dy: torch.Tensor):
    if not backward:
        def fwd():
            with torch.no_grad():
                return fn(x)
        return fwd

    def fwd_bwd():
        return torch.autograd.grad(fn(x), (x,), dy)
    return fwd_bwd


def _liger() -> dict:
    """Liger-Kernel's softmax (plain only), when installed (GPU runs)."""
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except ImportError:
        return {}
    return {"liger": LigerSoftmaxFunction.apply}


def _case(flavour: str, shape: tuple[int, ...], dtype: torch.dtype, backward: bool,
          device: str = "cpu", provider: str = "cpu") -> dict:
    t = _tensors(shape, dtype, device)
    x = t["x"].detach().clone().requires_grad_(backward)
    if flavour == "plain":
        kw: dict = {}
        fns = {"naive": _naive_plain, "aten": lambda x: torch.softmax(x, -1),
               **(_liger() if device == "cuda" else {})}
    else:
        kw = dict(scale=SCALE, causal=flavour == "causal", mask=t["mask"] if flavour == "padding" else None)
        fns = {"naive": lambda x: sm.softmax_reference(x, **kw)}
    fns["ours"] = lambda x: kernels.softmax(x, provider=provider, **kw)
    if flavour == "plain" and not backward and device == "cpu":
        y_ours, y_aten = torch.empty_like(x), torch.empty_like(x)
        y_ours.fill_(0.0)
        y_aten.fill_(0.0)
        xd = x.detach()
        extra = {"aten_out": lambda: torch._softmax(xd, -1, False, out=y_aten),
                 "ours_out": lambda: torch.ops.fusionlens.softmax_fwd(xd, None, y_ours, 1.0, False)}
    else:
        extra = {}
    cost = KERNELS["softmax"].cost(x, -1, kw.get("scale", 1.0), kw.get("mask"), kw.get("causal", False))
    e = x.numel() * x.element_size()
    variants = {name: _step(fn, x, backward, t["dy"]) for name, fn in fns.items()}
    variants.update(extra)  # kernels into a preallocated output (no fresh-output page faults)
    return {
        "kernel": f"softmax_{flavour}", "pass": "fwd+bwd" if backward else "fwd",
        "shape": "x".join(map(str, shape)), "dtype": str(dtype).replace("torch.", ""),
        "variants": variants,
        "compile": lambda: _step(torch.compile(fns["naive"]), x, backward, t["dy"]),
        "baseline": "naive",
        # backward reads dy and y, writes dx
        "bytes": float(cost.bytes_fused + (3 * e if backward else 0)),
        "notes": f"bytes_fused={cost.bytes_fused:.0f}; bytes_unfused={cost.bytes_unfused:.0f}",
    }


def cases(threads: int) -> list[dict]:
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    shape = (2, 12, 256, 256) if quick else (8, 12, 512, 512)
    dtypes = [getattr(torch, d) for d in os.environ.get("FL_BENCH_DTYPES", "float32").split(",")]
    flavours = os.environ.get("FL_BENCH_SOFTMAX", "plain,causal,padding").split(",")
    return [_case(f, shape, dt, bwd) for f in flavours for dt in dtypes for bwd in (False, True)]


def gpu_cases(device: str = "cuda") -> list[dict]:
    """Large CUDA cases for benchmarks/gpu/kernels_check.py (Triton provider; Liger if present)."""
    return [_case(f, (8, 16, 1024, 1024), torch.bfloat16, bwd, device, "triton")
            for f in ("plain", "causal", "padding") for bwd in (False, True)]


def gpu_checks(device: str = "cuda") -> list[tuple[str, object]]:
    """Correctness at real sizes on the GPU (both the one-tile and the long-row online paths)."""
    from tests.kernels.numerics import make
    from tests.kernels.test_softmax import check, padding_mask

    def one(shape, dtype, pad=False, **kw):
        def run():  # re-runnable: nothing in the closure is mutated
            x = make(shape, dtype, seed=1, scale=3.0).to(device)
            args = [x, padding_mask(shape[0], shape[-1], dtype).to(device)] if pad else [x]
            check("triton", args, dtype, **kw)
        return run
    out = []
    for dt in (torch.float32, torch.bfloat16):
        out += [(f"softmax causal 4x12x1024x1024 {dt}", one((4, 12, 1024, 1024), dt, causal=True, scale=0.125)),
                (f"softmax padding 4x12x512x512 {dt}", one((4, 12, 512, 512), dt, pad=True, scale=0.125)),
                (f"softmax long rows 2x4x8x70000 {dt}", one((2, 4, 8, 70000), dt, pad=True, causal=True))]
    return out
