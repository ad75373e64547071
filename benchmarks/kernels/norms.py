"""Benchmark cases for the norm kernels (contract: `benchmarks/kernels/__init__.py`).

Per kernel (layer_norm, rms_norm, add_rms_norm; add_layer_norm when named in FL_BENCH_NORMS), shape (tokens 4096 x hidden 768 / 4096), dtype
(FL_BENCH_DTYPES, default "float32"; e.g. "float32,bfloat16") and pass (fwd under no_grad,
fwd+bwd with torch.autograd.grad so no gradient accumulation is timed), the variants are:
naive (the eager reference composition, which is what HF-style code runs), aten (F.layer_norm /
F.rms_norm), ours (provider="cpu"), ours_prealloc (the same C++ ops called directly with outputs
allocated once: the kernel's own speed, without Python dispatch and without first-touch page
faults of fresh outputs) and torch.compile of the reference (added by the driver).
FL_BENCH_QUICK=1 uses 1024 x 768 only; FL_BENCH_SHAPES=4096x768 picks shapes. FL_BENCH_PARAM_DTYPE=float32 keeps weight and bias in fp32
with a bf16/fp16 x (mixed precision; the dtype column reads e.g. "bfloat16/float32 params"). `gpu_cases` / `gpu_checks` serve the GPU check (Triton
provider at 16384 x 4096, plus Liger-Kernel and apex when importable).
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch
import torch.nn.functional as F

import kernels
from kernels import norms
from benchmarks.kernels import shape_wanted
from kernels.registry import KERNELS


@lru_cache(maxsize=4)
def _tensors(m: int, n: int, dtype: torch.dtype, device: str = "cpu",
             param_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Inputs shared by every case of one shape/dtype: x, residual, upstream grad, weight, bias
    (the parameters in param_dtype, default dtype)."""
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(device=device, dtype=dtype) for k in ("x", "r", "dy")}
    t["w"] = (1 + 0.1 * torch.randn(n, generator=g)).to(device=device, dtype=param_dtype or dtype)
    t["b"] = (0.1 * torch.randn(n, generator=g)).to(device=device, dtype=param_dtype or dtype)
    return t


def _aten_add_rms(x, r, w, eps):
    s = x + r
    return s, F.rms_norm(s, (s.shape[-1],), w, eps)


def _aten_add_ln(x, r, w, b, eps):
    s = x + r
    return s, F.layer_norm(s, (s.shape[-1],), w, b, eps)


def _fns(kernel: str, n: int, provider: str = "cpu"):
    """(naive, aten, ours, arg names, eps) for one kernel."""
    if kernel == "layer_norm":
        return (norms.layer_norm_reference, lambda x, w, b, eps: F.layer_norm(x, (n,), w, b, eps),
                lambda x, w, b, eps: kernels.layer_norm(x, w, b, eps, provider=provider), ("x", "w", "b"), 1e-5)
    if kernel == "rms_norm":
        return (norms.rms_norm_reference, lambda x, w, eps: F.rms_norm(x, (n,), w, eps),
                lambda x, w, eps: kernels.rms_norm(x, w, eps, provider=provider), ("x", "w"), 1e-6)
    if kernel == "add_layer_norm":
        return (norms.add_layer_norm_reference, _aten_add_ln,
                lambda x, r, w, b, eps: kernels.add_layer_norm(x, r, w, b, eps, provider=provider),
                ("x", "r", "w", "b"), 1e-5)
    if kernel == "add_rms_norm":
        return (norms.add_rms_norm_reference, _aten_add_rms,
                lambda x, r, w, eps: kernels.add_rms_norm(x, r, w, eps, provider=provider), ("x", "r", "w"), 1e-6)
    raise ValueError(f"no benchmark for {kernel}")


def _third_party(kernel: str, n: int) -> dict:
    """Liger-Kernel / apex equivalents when importable (GPU only): name -> fn(*args, eps)."""
    found = {}
    try:
        from liger_kernel.transformers.functional import liger_layer_norm, liger_rms_norm

        def liger_rms(x, w, eps):
            try:  # newer Liger: keep dy intact (in_place=False), HF llama casting
                return liger_rms_norm(x, w, eps, offset=0.0, casting_mode="llama", in_place=False)
            except TypeError:
                return liger_rms_norm(x, w, eps)

        if kernel == "layer_norm":
            found["liger"] = lambda x, w, b, eps: liger_layer_norm(x, w, b, eps)
        elif kernel == "rms_norm":
            found["liger"] = liger_rms
    except ImportError:
        pass
    try:
        from apex.normalization.fused_layer_norm import fused_layer_norm_affine, fused_rms_norm_affine

        if kernel == "layer_norm":
            found["apex"] = lambda x, w, b, eps: fused_layer_norm_affine(x, w, b, (n,), eps)
        elif kernel == "rms_norm":
            found["apex"] = lambda x, w, eps: fused_rms_norm_affine(x, w, (n,), eps)
    except ImportError:
        pass
    return found


def _prealloc(kernel: str, t: dict, eps: float, backward: bool):
    """One call of our C++ ops on outputs allocated once (fwd, or fwd + bwd with dy as every grad)."""
    from kernels.providers import cpu_ops

    ops = cpu_ops()
    x, r, dy = t["x"], t["r"], t["dy"]
    m, n = x.shape
    w32, b32 = t["w"].float().contiguous(), t["b"].float().contiguous()
    y, s, dx = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    mean, rstd, dw, db = (torch.empty(k, dtype=torch.float32) for k in (m, m, n, n))
    none = x.new_empty(0)

    if kernel == "layer_norm":
        def fwd():
            ops.layer_norm_fwd(x, None, w32, b32, eps, y, none, mean, rstd)

        def bwd():
            ops.layer_norm_bwd(dy, x, w32, mean, rstd, None, dx, dw, db)
    elif kernel == "add_layer_norm":  # the sum's gradient is dy too
        def fwd():
            ops.layer_norm_fwd(x, r, w32, b32, eps, y, s, mean, rstd)

        def bwd():
            ops.layer_norm_bwd(dy, s, w32, mean, rstd, dy, dx, dw, db)
    elif kernel == "rms_norm":
        def fwd():
            ops.rms_norm_fwd(x, None, w32, eps, True, y, none, rstd)

        def bwd():
            ops.rms_norm_bwd(dy, x, w32, rstd, None, True, dx, dw)
    else:  # add_rms_norm: the sum's gradient is dy too
        def fwd():
            ops.rms_norm_fwd(x, r, w32, eps, True, y, s, rstd)

        def bwd():
            ops.rms_norm_bwd(dy, s, w32, rstd, dy, True, dx, dw)

    def both():
        fwd()
        bwd()
    return both if backward else fwd


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


def _case(kernel: str, m: int, n: int, dtype: torch.dtype, backward: bool, device: str = "cpu",
          provider: str = "cpu", param_dtype: torch.dtype | None = None) -> dict:
    naive, aten, ours, names, eps = _fns(kernel, n, provider)
    mixed = param_dtype not in (None, dtype)
    t = _tensors(m, n, dtype, device, param_dtype if mixed else None)
    args = [t[k].detach().clone().requires_grad_(backward) for k in names]
    cost = KERNELS[kernel].cost(*args, eps)
    e, size = m * n, t["x"].element_size()
    n_in = 2 if kernel.startswith("add_") else 1
    # backward reads dy (+ the sum's grad) and x (or the sum), writes dx: 2 + n_in tensors
    bytes_moved = cost.bytes_fused + ((2 + n_in) * e * size if backward else 0)
    fns = {"naive": naive, "aten": aten, **(_third_party(kernel, n) if device == "cuda" else {}), "ours": ours}
    variants = {name: _step(fn, args, eps, backward, t["dy"]) for name, fn in fns.items()}
    if device == "cpu" and provider == "cpu" and not (mixed and "rms" in kernel):  # mixed llama: two ops
        variants["ours_prealloc"] = _prealloc(kernel, t, eps, backward)
    name = str(dtype).replace("torch.", "")
    return {
        "kernel": kernel, "pass": "fwd+bwd" if backward else "fwd", "shape": f"{m}x{n}",
        "dtype": f"{name}/{str(param_dtype).replace('torch.', '')} params" if mixed else name,
        "variants": variants,
        "compile": lambda: _step(torch.compile(naive), args, eps, backward, t["dy"]),
        "baseline": "naive", "bytes": float(bytes_moved),
        "notes": f"bytes_fused={cost.bytes_fused:.0f}; bytes_unfused={cost.bytes_unfused:.0f}",
    }


def cases(threads: int) -> list[dict]:
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    shapes = [(1024, 768)] if quick else [(4096, 768), (4096, 4096)]
    shapes = [(m, n) for (m, n) in shapes if shape_wanted(m, n)]
    dtypes = [getattr(torch, d) for d in os.environ.get("FL_BENCH_DTYPES", "float32").split(",")]
    kernel_names = os.environ.get("FL_BENCH_NORMS", "layer_norm,rms_norm,add_rms_norm").split(",")
    pdt = os.environ.get("FL_BENCH_PARAM_DTYPE")
    param_dtype = getattr(torch, pdt) if pdt else None
    return [_case(k, m, n, dt, bwd, param_dtype=param_dtype) for k in kernel_names for (m, n) in shapes
            for dt in dtypes for bwd in (False, True)]


def gpu_cases(device: str = "cuda") -> list[dict]:
    """Large CUDA cases for benchmarks/gpu/kernels_check.py (Triton provider; Liger/apex if present)."""
    out = [_case(k, 16384, 4096, torch.bfloat16, bwd, device, "triton")
           for k in ("layer_norm", "rms_norm", "add_rms_norm") for bwd in (False, True)]
    out += [_case(k, 16384, 4096, torch.float32, False, device, "triton") for k in ("layer_norm", "rms_norm")]
    return out


def gpu_checks(device: str = "cuda") -> list[tuple[str, object]]:
    """Correctness at real sizes on the GPU: (name, zero-arg check that raises on mismatch)."""
    from tests.kernels.norm_cases import CASES

    checks = [(f"{name} 8192x4096 {dt}", lambda c=CASES[name], dt=dt: c.check("triton", (8192, 4096), dt, device=device))
              for name in ("layer_norm", "rms_norm", "rms_norm_gemma", "add_layer_norm", "add_rms_norm")
              for dt in (torch.float32, torch.bfloat16)]
    mixed = lambda c: c.check("triton", (8192, 4096), torch.bfloat16, device=device,  # noqa: E731
                              args=c.inputs((8192, 4096), torch.bfloat16, device=device, param_dtype=torch.float32))
    checks += [(f"{name} 8192x4096 bf16, fp32 params", lambda c=CASES[name]: mixed(c))
               for name in ("layer_norm", "rms_norm", "add_rms_norm")]
    return checks
