"""Benchmark cases for the RoPE kernel (contract: `benchmarks/kernels/__init__.py`).

q and k at [batch 4, heads 12, seq 512, head_dim 64] fp32 (FL_BENCH_QUICK=1: [2, 12, 128, 64]),
laid out as HF attention makes them (`proj(x).view(B, S, H, D).transpose(1, 2)`, non-contiguous),
cos/sin [B, S, D] from HF's rotary module; forward (no_grad) and forward+backward. A seq-first
case too: q, k contiguous [B, S, H, D] with cos/sin [B, S, 1, D] (HF's unsqueeze_dim=2).
Variants: naive = HF `apply_rotary_pos_emb` (rotate_half with slice/neg/cat; there is no ATen
fused op), ours (provider="cpu"), and torch.compile of the naive one (added by the driver).
"""
from __future__ import annotations

import importlib
import os
from functools import lru_cache

import torch

import kernels
from kernels.registry import KERNELS
rp = importlib.import_module("kernels.rope")  # the module; `kernels.rope` is the function


@lru_cache(maxsize=None)
def _tensors(b: int, h: int, s: int, d: int, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(b, s, h, d, generator=g).to(device=device, dtype=dtype) for k in ("q", "k", "dq", "dk")}
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.arange(s, dtype=torch.float32)[:, None] * inv  # [S, D/2]
    emb = torch.cat((freqs, freqs), -1).expand(b, s, d)  # [B, S, D]
    t["cos"] = emb.cos().to(device=device, dtype=dtype).contiguous()
    t["sin"] = emb.sin().to(device=device, dtype=dtype).contiguous()
    return t


def _step(fn, q, k, cos, sin, backward: bool, dq, dk):
    if not backward:
        def fwd():
            with torch.no_grad():
                return fn(q, k, cos, sin)
        return fwd

    def fwd_bwd():
        return torch.autograd.grad(fn(q, k, cos, sin), (q, k), (dq, dk))
    return fwd_bwd


def _liger() -> dict:
    """Liger-Kernel's RoPE, when installed (GPU runs)."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return {}
    return {"liger": lambda q, k, c, s_: LigerRopeFunction.apply(q, k, c, s_)}


def _case(b: int, h: int, s: int, d: int, dtype: torch.dtype, backward: bool, device: str = "cpu",
          provider: str = "cpu", seq_first: bool = False) -> dict:
    t = dict(_tensors(b, h, s, d, dtype, device))
    q, k = (t[n].detach().clone().requires_grad_(backward) for n in ("q", "k"))
    if seq_first:  # q, k [B, S, H, D] as they are, tables [B, S, 1, D]
        t["cos"], t["sin"] = t["cos"].unsqueeze(2), t["sin"].unsqueeze(2)
        dq, dk = t["dq"], t["dk"]
    else:  # HF layout: [B, S, H, D] -> [B, H, S, D] views
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        dq, dk = t["dq"].transpose(1, 2).contiguous(), t["dk"].transpose(1, 2).contiguous()
    fns = {"naive": rp.rope_reference, **(_liger() if device == "cuda" else {}),
           "ours": lambda q, k, c, s_: kernels.rope(q, k, c, s_, provider=provider)}
    cost = KERNELS["rope"].cost(q, k, t["cos"], t["sin"])
    e = 2 * q.numel() * q.element_size()
    variants = {name: _step(fn, q, k, t["cos"], t["sin"], backward, dq, dk) for name, fn in fns.items()}
    return {
        "kernel": "rope seq-first" if seq_first else "rope", "pass": "fwd+bwd" if backward else "fwd",
        "shape": f"{b}x{s}x{h}x{d} (q and k)" if seq_first else f"{b}x{h}x{s}x{d} (q and k)",
        "dtype": str(dtype).replace("torch.", ""), "variants": variants,
        "compile": lambda: _step(torch.compile(rp.rope_reference), q, k, t["cos"], t["sin"], backward, dq, dk),
        "baseline": "naive", "bytes": float(cost.bytes_fused + (2 * e if backward else 0)),
        "notes": f"bytes_fused={cost.bytes_fused:.0f}; bytes_unfused={cost.bytes_unfused:.0f}; "
                 + ("q/k [B, S, H, D], tables [B, S, 1, D]" if seq_first else "q/k transposed views"),
    }


def cases(threads: int) -> list[dict]:
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    shape = (2, 12, 128, 64) if quick else (4, 12, 512, 64)
    dtypes = [getattr(torch, d) for d in os.environ.get("FL_BENCH_DTYPES", "float32").split(",")]
    return ([_case(*shape, dt, bwd) for dt in dtypes for bwd in (False, True)]
            + [_case(*shape, dtypes[0], bwd, seq_first=True) for bwd in (False, True)])


def gpu_cases(device: str = "cuda") -> list[dict]:
    """Large CUDA cases for benchmarks/gpu/kernels_check.py (Triton provider; Liger if present)."""
    return [_case(8, 32, 2048, 128, torch.bfloat16, bwd, device, "triton") for bwd in (False, True)]


def gpu_checks(device: str = "cuda") -> list[tuple[str, object]]:
    """Correctness at real sizes on the GPU, q/k as HF's transposed views, GQA heads."""
    from tests.kernels.test_rope import check, qk, tables

    def one(dtype):
        def run():
            q, k = (t.to(device) for t in qk(4, 32, 8, 1024, 128, dtype, transposed=True))
            cos, sin = (t.to(device) for t in tables(1024, 128, dtype, batch=4))
            check("triton", q, k, cos, sin, dtype)
        return run
    return [(f"rope 4x32(8)x1024x128 {dt}", one(dt)) for dt in (torch.float32, torch.bfloat16)]
