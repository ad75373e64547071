"""Benchmark cases for the norm kernels (contract: `benchmarks/kernels/__init__.py`).

Per kernel (layer_norm, rms_norm, add_rms_norm), shape (tokens 4096 x hidden 768 / 4096), dtype
(FL_BENCH_DTYPES, default "float32"; e.g. "float32,bfloat16") and pass (fwd under no_grad,
fwd+bwd with torch.autograd.grad so no gradient accumulation is timed), the variants are:
naive (the eager reference composition, which is what HF-style code runs), aten (F.layer_norm /
F.rms_norm), ours (provider="cpu"), and torch.compile of the reference (added by the driver).
FL_BENCH_QUICK=1 uses 1024 x 768 only.
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch
import torch.nn.functional as F

import kernels
from kernels import norms
from kernels.registry import KERNELS


@lru_cache(maxsize=None)
def _tensors(m: int, n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Inputs shared by every case of one shape/dtype: x, residual, upstream grad, weight, bias."""
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(dtype) for k in ("x", "r", "dy")}
    t["w"] = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    t["b"] = (0.1 * torch.randn(n, generator=g)).to(dtype)
    return t


def _aten_add_rms(x, r, w, eps):
    s = x + r
    return s, F.rms_norm(s, (s.shape[-1],), w, eps)


def _fns(kernel: str, n: int):
    """(naive, aten, ours, arg names) for one kernel."""
    if kernel == "layer_norm":
        return (norms.layer_norm_reference, lambda x, w, b, eps: F.layer_norm(x, (n,), w, b, eps),
                lambda x, w, b, eps: kernels.layer_norm(x, w, b, eps, provider="cpu"), ("x", "w", "b"), 1e-5)
    if kernel == "rms_norm":
        return (norms.rms_norm_reference, lambda x, w, eps: F.rms_norm(x, (n,), w, eps),
                lambda x, w, eps: kernels.rms_norm(x, w, eps, provider="cpu"), ("x", "w"), 1e-6)
    if kernel == "add_rms_norm":
        return (norms.add_rms_norm_reference, _aten_add_rms,
                lambda x, r, w, eps: kernels.add_rms_norm(x, r, w, eps, provider="cpu"), ("x", "r", "w"), 1e-6)
    raise ValueError(f"no benchmark for {kernel}")


def _step(fn, args: list, eps: float, backward: bool, dy: torch.Tensor):
    """One timed call: forward under no_grad, or forward + autograd.grad of every input."""
    if not backward:
        def fwd():
            with torch.no_grad():
                return fn(*args, eps)
        return fwd

    def fwd_bwd():
        out = fn(*args, eps)
        outs = list(out) if isinstance(out, tuple) else [out]
        return torch.autograd.grad(outs, args, [dy] * len(outs))
    return fwd_bwd


def _case(kernel: str, m: int, n: int, dtype: torch.dtype, backward: bool) -> dict:
    naive, aten, ours, names, eps = _fns(kernel, n)
    t = _tensors(m, n, dtype)
    args = [t[k].detach().clone().requires_grad_(backward) for k in names]
    cost = KERNELS[kernel].cost(*args, eps)
    e, size = m * n, t["x"].element_size()
    n_in = 2 if kernel.startswith("add_") else 1
    # backward reads dy (+ the sum's grad) and x (or the sum), writes dx: 2 + n_in tensors
    bytes_moved = cost.bytes_fused + ((2 + n_in) * e * size if backward else 0)
    variants = {name: _step(fn, args, eps, backward, t["dy"]) for name, fn in
                (("naive", naive), ("aten", aten), ("ours", ours))}
    return {
        "kernel": kernel, "pass": "fwd+bwd" if backward else "fwd", "shape": f"{m}x{n}",
        "dtype": str(dtype).replace("torch.", ""), "variants": variants,
        "compile": lambda: _step(torch.compile(naive), args, eps, backward, t["dy"]),
        "baseline": "naive", "bytes": float(bytes_moved),
        "notes": f"bytes_fused={cost.bytes_fused:.0f}; bytes_unfused={cost.bytes_unfused:.0f}",
    }


def cases(threads: int) -> list[dict]:
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    shapes = [(1024, 768)] if quick else [(4096, 768), (4096, 4096)]
    dtypes = [getattr(torch, d) for d in os.environ.get("FL_BENCH_DTYPES", "float32").split(",")]
    kernel_names = os.environ.get("FL_BENCH_NORMS", "layer_norm,rms_norm,add_rms_norm").split(",")
    return [_case(k, m, n, dt, bwd) for k in kernel_names for (m, n) in shapes for dt in dtypes
            for bwd in (False, True)]
