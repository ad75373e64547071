"""Benchmark cases for the activation kernels (contract: `benchmarks/kernels/__init__.py`).

Per kernel at MLP shapes (tokens 4096 x intermediate 3072, and 4096 x 768 for bias_gelu), fp32
(FL_BENCH_DTYPES to change), forward (no_grad) and forward+backward (autograd.grad of every
input), the variants are:
- naive: the formula as model code writes it (GPT-2/BERT `0.5 * x * (1 + erf(x / sqrt 2))` or
  HF NewGELU's tanh form; `a * sigmoid(a) * b` for SwiGLU);
- aten: the ATen fused op where one exists (`F.gelu`, `F.silu(a) * b`), with the bias added
  eagerly in front for bias_gelu (ATen has no fused bias + GELU on CPU);
- ours: provider="cpu"; and torch.compile of the naive composition (added by the driver);
- for GELU forward also aten_out / ours_out: the two kernels writing a preallocated output;
- swiglu_halves: SwiGLU on the two halves of one [tokens, 2 x 3072] projection (`h.chunk(2, -1)`,
  a fused gate/up Linear), which ours reads in place; ours_copied makes both halves contiguous
  first, as the kernels did before 2026-12-01.
FL_BENCH_QUICK=1 uses 1024 x 768 only; FL_BENCH_ACTIVATIONS=bias_gelu,geglu and FL_BENCH_SHAPES=4096x3072
pick kernels / shapes.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache

import torch
import torch.nn.functional as F

import kernels
from kernels import activations as _activations  # noqa: F401  (registers the specs)
from benchmarks.kernels import shape_wanted
from kernels.registry import KERNELS

_C = math.sqrt(2.0 / math.pi)


def _naive_gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    if approximate == "tanh":  # HF NewGELUActivation (GPT-2)
        return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0))))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))  # BERT's gelu


def _fns(kernel: str, approximate: str, provider: str = "cpu"):
    """(naive, aten, ours) taking the kernel's tensor arguments."""
    if kernel == "gelu":
        return (lambda x: _naive_gelu(x, approximate), lambda x: F.gelu(x, approximate=approximate),
                lambda x: kernels.gelu(x, approximate, provider=provider))
    if kernel == "bias_gelu":
        return (lambda x, b: _naive_gelu(x + b, approximate), lambda x, b: F.gelu(x + b, approximate=approximate),
                lambda x, b: kernels.bias_gelu(x, b, approximate, provider=provider))
    if kernel == "swiglu":
        return (lambda a, b: a * torch.sigmoid(a) * b, lambda a, b: F.silu(a) * b,
                lambda a, b: kernels.swiglu(a, b, provider=provider))
    if kernel == "geglu":
        return (lambda a, b: _naive_gelu(a, approximate) * b, lambda a, b: F.gelu(a, approximate=approximate) * b,
                lambda a, b: kernels.geglu(a, b, approximate, provider=provider))
    raise ValueError(f"no benchmark for {kernel}")


def _liger(kernel: str, approximate: str) -> dict:
    """Liger-Kernel's equivalent, when installed (GPU runs only): its SwiGLU, and GeGLU (tanh)."""
    try:
        if kernel == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return {"liger": LigerSiLUMulFunction.apply}
        if kernel == "geglu" and approximate == "tanh":
            from liger_kernel.ops.geglu import LigerGELUMulFunction

            return {"liger": LigerGELUMulFunction.apply}
    except ImportError:
        pass
    return {}


@lru_cache(maxsize=None)
def _tensors(m: int, n: int, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(device=device, dtype=dtype) for k in ("x", "b2", "dy")}
    t["bias"] = (0.1 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)
    return t


def _step(fn, args: list, backward: bool, dy: torch.Tensor):
    if not backward:
        def fwd():
            with torch.no_grad():
                return fn(*args)
        return fwd

    def fwd_bwd():
        return torch.autograd.grad(fn(*args), args, dy)
    return fwd_bwd


def _kernel_only(x: torch.Tensor, approximate: str) -> dict:
    """GELU into a preallocated output, ours vs ATen's out= op: the kernels without the cost of a
    fresh output's page faults (which the public API pays, and ATen's op pays more: see bench_alloc)."""
    kind = _activations._gelu_kind(approximate)
    y_ours, y_aten = torch.empty_like(x), torch.empty_like(x)
    y_ours.fill_(0.0)
    y_aten.fill_(0.0)
    x = x.detach()

    def ours_out():
        torch.ops.fusionlens.act_fwd(x, None, y_ours, kind)

    def aten_out():
        torch._C._nn.gelu(x, approximate=approximate, out=y_aten)
    return {"aten_out": aten_out, "ours_out": ours_out}


def _case(kernel: str, approximate: str, m: int, n: int, dtype: torch.dtype, backward: bool,
          device: str = "cpu", provider: str = "cpu") -> dict:
    naive, aten, ours = _fns(kernel, approximate, provider)
    t = _tensors(m, n, dtype, device)
    names = {"gelu": ("x",), "bias_gelu": ("x", "bias"), "swiglu": ("x", "b2"), "geglu": ("x", "b2")}[kernel]
    args = [t[k].detach().clone().requires_grad_(backward) for k in names]
    extra = () if kernel == "swiglu" else (approximate,)
    cost = KERNELS[kernel].cost(*args, *extra)
    e = m * n * t["x"].element_size()
    # backward reads dy and the inputs, writes their grads: act 3 tensors, gated 5
    bwd_bytes = (5 if kernel in ("swiglu", "geglu") else 3) * e
    fns = {"naive": naive, "aten": aten, **(_liger(kernel, approximate) if device == "cuda" else {}), "ours": ours}
    variants = {name: _step(fn, args, backward, t["dy"]) for name, fn in fns.items()}
    if kernel == "gelu" and not backward and device == "cpu":
        variants.update(_kernel_only(args[0], approximate))
    label = kernel + ("_tanh" if approximate == "tanh" and kernel != "swiglu" else "")
    return {
        "kernel": label, "pass": "fwd+bwd" if backward else "fwd", "shape": f"{m}x{n}",
        "dtype": str(dtype).replace("torch.", ""), "variants": variants,
        "compile": lambda: _step(torch.compile(naive), args, backward, t["dy"]),
        "baseline": "naive", "bytes": float(cost.bytes_fused + (bwd_bytes if backward else 0)),
        "notes": f"bytes_fused={cost.bytes_fused:.0f}; bytes_unfused={cost.bytes_unfused:.0f}",
    }


def _halves_case(m: int, n: int, dtype: torch.dtype, backward: bool, device: str = "cpu",
                 provider: str = "cpu") -> dict:
    """swiglu(*h.chunk(2, -1)) for one [m, 2n] h; grads are taken with respect to h."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(m, 2 * n, generator=g).to(device=device, dtype=dtype).requires_grad_(backward)
    dy = _tensors(m, n, dtype, device)["dy"]

    def variant(fn):
        def run(h):
            a, b = h.chunk(2, -1)
            return fn(a, b)
        return _step(run, [h], backward, dy)
    naive, aten, ours = _fns("swiglu", "none", provider)
    copied = lambda a, b: kernels.swiglu(a.contiguous(), b.contiguous(), provider=provider)  # noqa: E731
    e = m * n * h.element_size()
    return {
        "kernel": "swiglu_halves", "pass": "fwd+bwd" if backward else "fwd", "shape": f"{m}x{n}",
        "dtype": str(dtype).replace("torch.", ""),
        "variants": {"naive": variant(naive), "aten": variant(aten), "ours_copied": variant(copied),
                     "ours": variant(ours)},
        "compile": lambda: variant(torch.compile(naive)), "baseline": "naive",
        "bytes": float(3 * e + (5 * e if backward else 0)), "notes": "a, b = h.chunk(2, -1) of one [m, 2n] h",
    }


def cases(threads: int) -> list[dict]:
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    dtypes = [getattr(torch, d) for d in os.environ.get("FL_BENCH_DTYPES", "float32").split(",")]
    if quick:
        plan = [("bias_gelu", "none", 1024, 768), ("swiglu", "none", 1024, 768)]
    else:
        plan = [("gelu", "none", 4096, 3072), ("bias_gelu", "none", 4096, 768),
                ("bias_gelu", "none", 4096, 3072), ("bias_gelu", "tanh", 4096, 3072),
                ("swiglu", "none", 4096, 3072), ("geglu", "tanh", 4096, 3072)]
    wanted = os.environ.get("FL_BENCH_ACTIVATIONS")
    if wanted:
        plan = [p for p in plan if p[0] in wanted.split(",")]
    plan = [p for p in plan if shape_wanted(p[2], p[3])]
    out = [_case(k, a, m, n, dt, bwd) for (k, a, m, n) in plan for dt in dtypes for bwd in (False, True)]
    if not quick and (not wanted or "swiglu_halves" in wanted.split(",")) and shape_wanted(4096, 3072):
        out += [_halves_case(4096, 3072, dt, bwd) for dt in dtypes for bwd in (False, True)]
    return out


def gpu_cases(device: str = "cuda") -> list[dict]:
    """Large CUDA cases for benchmarks/gpu/kernels_check.py (Triton provider; Liger if present)."""
    plan = [("bias_gelu", "none"), ("swiglu", "none"), ("geglu", "tanh")]
    return ([_case(k, a, 16384, 4096, torch.bfloat16, bwd, device, "triton") for (k, a) in plan for bwd in (False, True)]
            + [_halves_case(16384, 4096, torch.bfloat16, bwd, device, "triton") for bwd in (False, True)])


def gpu_checks(device: str = "cuda", m: int = 8192, n: int = 4096) -> list[tuple[str, object]]:
    """Correctness at real sizes on the GPU: (name, zero-arg check that raises on a mismatch)."""
    from tests.kernels.test_activations import CASES, check, inputs

    def one(case: str, dtype: torch.dtype):
        return lambda: check(case, "triton", [a.to(device) for a in inputs(case, (m, n), dtype)], dtype)
    return [(f"{case} {m}x{n} {dt}", one(case, dt)) for case in sorted(CASES)
            for dt in (torch.float32, torch.bfloat16)]
