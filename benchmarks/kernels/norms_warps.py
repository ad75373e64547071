"""GPU-only sweep of num_warps for the Triton norm kernels (run last by benchmarks/gpu/kernels_check.py).

Compiled ahead of time for sm_90 (tests/kernels/triton_aot.py), the norm backward at BLOCK 8192
takes 216-251 registers a thread with the heuristic's 8 warps (occupancy 8 warps/SM, no spills),
128 with 16 warps (a 60-byte spill for add_layer_norm) and ~58 with 32; at BLOCK 4096 it takes
111-151 with 8; at BLOCK 16384 every count spills (32 warps least, 120-476 bytes, the
heuristic's choice). Which runs fastest on an H200 is a measurement, not a register count: this sweep
times the launchers alone (preallocated outputs, bf16) at each warp count against the heuristic
("ours"), so one GPU run can settle `kernels/triton_norms._block`.
"""
from __future__ import annotations

import torch

WARPS = (4, 8, 16, 32)


def _ln_bwd_case(m: int, n: int, device: str) -> dict:
    from kernels import triton_norms as tn

    dt = torch.bfloat16
    x, dy = torch.randn(m, n, device=device, dtype=dt), torch.randn(m, n, device=device, dtype=dt)
    w, b = torch.randn(n, device=device), torch.randn(n, device=device)  # fp32, as the provider passes them
    y, mean, rstd = torch.empty_like(x), torch.empty(m, device=device), torch.empty(m, device=device)
    tn.layer_norm_fwd(x, None, w, b, 1e-5, y, y, mean, rstd)
    dx = torch.empty_like(x)
    dw, db = torch.empty(n, device=device), torch.empty(n, device=device)

    def run(k):
        return lambda: tn.layer_norm_bwd(dy, x, w, mean, rstd, None, dx, dw, db, num_warps=k)

    return {"kernel": "layer_norm_bwd_warps", "pass": "bwd", "shape": f"{m}x{n}", "dtype": "bfloat16",
            "variants": {"ours": run(None), **{f"warps={k}": run(k) for k in WARPS}},
            "bytes": float(3 * m * n * x.element_size()), "notes": "kernel only; dy, x read, dx written"}


def _rms_bwd_case(m: int, n: int, device: str) -> dict:
    from kernels import triton_norms as tn

    dt = torch.bfloat16
    x, dy, r = (torch.randn(m, n, device=device, dtype=dt) for _ in range(3))
    w = torch.randn(n, device=device)
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device=device)
    tn.rms_norm_fwd(x, r, w, 1e-6, True, y, s, rstd)
    da, dx, dw = torch.randn_like(x), torch.empty_like(x), torch.empty(n, device=device)

    def run(k):
        return lambda: tn.rms_norm_bwd(dy, s, w, rstd, da, True, dx, dw, num_warps=k)

    return {"kernel": "add_rms_norm_bwd_warps", "pass": "bwd", "shape": f"{m}x{n}", "dtype": "bfloat16",
            "variants": {"ours": run(None), **{f"warps={k}": run(k) for k in WARPS}},
            "bytes": float(4 * m * n * x.element_size()), "notes": "kernel only; dy, sum, dsum read, dx written"}


def _ln_fwd_case(m: int, n: int, device: str) -> dict:
    from kernels import triton_norms as tn

    dt = torch.bfloat16
    x = torch.randn(m, n, device=device, dtype=dt)
    w, b = torch.randn(n, device=device), torch.randn(n, device=device)
    y, mean, rstd = torch.empty_like(x), torch.empty(m, device=device), torch.empty(m, device=device)

    def run(k):
        return lambda: tn.layer_norm_fwd(x, None, w, b, 1e-5, y, y, mean, rstd, num_warps=k)

    return {"kernel": "layer_norm_fwd_warps", "pass": "fwd", "shape": f"{m}x{n}", "dtype": "bfloat16",
            "variants": {"ours": run(None), **{f"warps={k}": run(k) for k in WARPS}},
            "bytes": float(2 * m * n * x.element_size()), "notes": "kernel only; x read, y written"}


def cases(threads: int) -> list[dict]:
    """No CPU cases: the warp count only exists on the GPU."""
    return []


def gpu_cases(device: str = "cuda") -> list[dict]:
    """Run last, in whatever budget the GPU check has left: the three shapes the registers leave
    open first (8192-wide backward and forward, then the 16384-wide backward that spills), then
    the add_rms_norm backward and the 4096-wide one (its 8 warps hold 111-151 registers)."""
    return [_ln_bwd_case(8192, 8192, device), _ln_fwd_case(8192, 8192, device),
            _ln_bwd_case(4096, 16384, device), _rms_bwd_case(8192, 8192, device),
            _ln_bwd_case(16384, 4096, device)]
