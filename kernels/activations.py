"""Activation kernels: GELU (erf or tanh), bias + GELU, SwiGLU and GeGLU, forward and backward.

Public functions (each takes `provider=`): `gelu(x, approximate)`, `bias_gelu(x, bias,
approximate)`, `swiglu(a, b)` = silu(a) * b, `geglu(a, b, approximate)` = gelu(a) * b; modules
`GELU`, `BiasGELU`, `SwiGLU`, `GeGLU`.

Semantics are those of the eager references below (the truth for tests). The fused providers
compute in fp32 and round once, so for bf16/fp16 they are closer to the float64 truth than eager
(which rounds x + bias before the GELU).

Providers: "cpu" (`torch.ops.fusionlens.{act,glu}_{fwd,bwd}` from `kernels/csrc/activations.cpp`),
"triton" (`kernels/triton_activations.py`, same signatures), "aten" (`F.gelu`, the one fused ATen
op here; slower than ours on CPU, so it ranks after "cpu"). One autograd Function per shape of
op (act(x [+ bias]) and act(a) * b) drives both fused providers.

Costs (`Cost`, algorithmic bytes, e = element size, n = elements): bias_gelu reads x and writes
y (2ne) where eager also writes and re-reads x + bias (4ne); swiglu/geglu read a, b and write y
(3ne) where eager writes and re-reads act(a) (5ne); gelu alone moves 2ne either way (the gain is
compute, not bytes).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels.arguments import typed_arguments
from kernels.double_backward import eager_backward, vjp_of
from kernels.providers import provider_ops
from kernels.registry import (KERNELS, Cost, KernelSpec, Supports, dispatch, io_bytes, new_output, op_only_cost,
                              register_kernel, register_op_cost, select_provider)

# Activation codes shared with the C++ and Triton kernels.
KIND_SILU, KIND_GELU_ERF, KIND_GELU_TANH = 0, 1, 2
_GELU_KIND = {"none": KIND_GELU_ERF, "tanh": KIND_GELU_TANH}
# Approximate flops per element: erf/exp/tanh counted as one op each.
_FLOPS = {KIND_SILU: 4.0, KIND_GELU_ERF: 5.0, KIND_GELU_TANH: 9.0}


def _gelu_kind(approximate: str) -> int:
    if approximate not in _GELU_KIND:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _GELU_KIND[approximate]


# ---------------------------------------------------------------- references (the truth for tests)
def gelu_reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu (erf, or tanh when approximate='tanh')."""
    return F.gelu(x, approximate=approximate)


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias): the tail of a Linear in an MLP (bias over the last dim)."""
    return F.gelu(x + bias, approximate=approximate)


def swiglu_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b: LLaMA's MLP gate (a = gate_proj(x), b = up_proj(x))."""
    return F.silu(a) * b


def geglu_reference(a: torch.Tensor, b: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(a) * b: GeGLU (T5 v1.1, Gemma with approximate='tanh')."""
    return F.gelu(a, approximate=approximate) * b


# ---------------------------------------------------------------- provider ops (C++ or Triton)
_ops = functools.partial(provider_ops, triton_module="kernels.triton_activations")


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _act_eager(x: torch.Tensor, bias: torch.Tensor | None, kind: int) -> torch.Tensor:
    """act(x [+ bias]) from eager ops, in fp32 and rounded once like the fused kernels (the
    differentiable form a backward with create_graph=True uses)."""
    z = x.float() if bias is None else x.float() + bias.float()
    y = F.silu(z) if kind == KIND_SILU else F.gelu(z, approximate="tanh" if kind == KIND_GELU_TANH else "none")
    return y.to(x.dtype)


def _glu_eager(a: torch.Tensor, b: torch.Tensor, kind: int) -> torch.Tensor:
    return (_act_eager(a, None, kind).float() * b.float()).to(a.dtype)


class _ActFn(torch.autograd.Function):
    """y = act(x [+ bias]); backward recomputes act' from x (nothing but x and bias is saved)."""

    @staticmethod
    def forward(ctx, ops, x, bias, kind):  # x, bias contiguous (made so in autograd's view: `_act`)
        ctx.save_for_backward(x, bias)  # the inputs themselves: a double backward differentiates them
        out = new_output(x.shape, x)
        ops.act_fwd(x, bias, out, kind)
        ctx.ops, ctx.kind = ops, kind
        return out

    @staticmethod
    def backward(ctx, grad):
        x, bias = ctx.saved_tensors
        if eager_backward(grad):
            return None, *vjp_of(lambda x, b: _act_eager(x, b, ctx.kind), (x, bias), ctx.needs_input_grad[1:3],
                                 (grad,)), None
        grad_x = new_output(x.shape, x)
        grad_b = new_output(bias.shape, bias) if bias is not None and ctx.needs_input_grad[2] else None
        ctx.ops.act_bwd(grad.contiguous(), x, bias, grad_x, grad_b, ctx.kind)
        return None, grad_x if ctx.needs_input_grad[1] else None, grad_b, None


class _GluFn(torch.autograd.Function):
    """y = act(a) * b; backward: grad_a = g * b * act'(a), grad_b = g * act(a), in one pass."""

    @staticmethod
    def forward(ctx, ops, a, b, kind):  # a, b contiguous or row-strided [rows, n] (`_glu`)
        ctx.save_for_backward(a, b)
        out = new_output(a.shape, a)
        ops.glu_fwd(a, b, out, kind)
        ctx.ops, ctx.kind = ops, kind
        return out

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        if eager_backward(grad):
            return None, *vjp_of(lambda a, b: _glu_eager(a, b, ctx.kind), (a, b), ctx.needs_input_grad[1:3],
                                 (grad,)), None
        grad_a, grad_b = new_output(a.shape, a), new_output(b.shape, b)
        ctx.ops.glu_bwd(grad.contiguous(), a, b, grad_a, grad_b, ctx.kind)
        return None, grad_a, grad_b, None


class _PackedGluFn(torch.autograd.Function):
    """y = act(x[:, :n]) * x[:, n:] of one packed [rows, 2n] gate/up tensor: the backward writes
    both halves' grads into one [rows, 2n] gradient, so autograd has no chunk to undo (its split
    backward would concatenate a separate pair: one more read and write of the whole gradient)."""

    @staticmethod
    def forward(ctx, ops, x, kind):
        ctx.save_for_backward(x)
        n = x.shape[1] // 2
        out = new_output((x.shape[0], n), x)
        ops.glu_fwd(x[:, :n], x[:, n:], out, kind)
        ctx.ops, ctx.kind = ops, kind
        return out

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        n = x.shape[1] // 2
        if eager_backward(grad):
            return None, *vjp_of(lambda x: _glu_eager(x[:, :n], x[:, n:], ctx.kind), (x,), ctx.needs_input_grad[1:2],
                                 (grad,)), None
        grad_x = new_output(x.shape, x)
        ctx.ops.glu_bwd(grad.contiguous(), x[:, :n], x[:, n:], grad_x[:, :n], grad_x[:, n:], ctx.kind)
        return None, grad_x, None


def packed_source(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """The packed [rows, 2n] tensor whose halves a and b are (`h.chunk(2, -1)` of a contiguous
    gate/up projection), as a view of their common base; None when they are anything else. Eager
    only: tracing has no `_base` to follow."""
    if torch.compiler.is_compiling():
        return None
    base = a._base
    if base is None or b._base is not base or not base.is_contiguous():
        return None
    n = a.shape[-1] if a.dim() else 0
    if (n == 0 or a.shape != b.shape or base.numel() != 2 * a.numel() or a.stride(-1) != 1
            or a.storage_offset() != base.storage_offset() or b.storage_offset() != base.storage_offset() + n):
        return None
    packed = base.view(*a.shape[:-1], 2 * n)  # contiguous [..., 2n]: a and b must be its two halves
    if a.stride() != packed.stride() or b.stride() != packed.stride():
        return None
    return packed.view(-1, 2 * n)


def _act(provider: str, x: torch.Tensor, bias: torch.Tensor | None, kind: int) -> torch.Tensor:
    ops = _ops(provider)
    x = x.contiguous()  # recorded by autograd when it records (see `_glu`)
    bias = bias.contiguous() if bias is not None else None
    if _needs_grad(x, bias):
        return _ActFn.apply(ops, x, bias, kind)
    out = new_output(x.shape, x)
    ops.act_fwd(x, bias, out, kind)
    return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, n] the way the glu kernels read it in place: a view with a unit last stride
    and its own row stride (`h.chunk(2, -1)` of a fused gate/up projection), else a copy."""
    n = t.shape[-1]
    if t.stride(-1) == 1 or n == 1:
        try:
            v = t.view(-1, n)
        except RuntimeError:  # the leading dims do not collapse into one row stride
            v = None
        if v is not None and (v.is_contiguous() or (v.stride(1) == 1 and v.stride(0) >= n)):
            return v
    return t.contiguous().view(-1, n)


def _glu(provider: str, a: torch.Tensor, b: torch.Tensor, kind: int) -> torch.Tensor:
    ops = _ops(provider)
    shape = a.shape
    if _needs_grad(a, b) and (packed := packed_source(a, b)) is not None:
        return _PackedGluFn.apply(ops, packed, kind).view(shape)
    # Views and copies are recorded by autograd when it records: the saved inputs stay connected
    # to the caller's for a double backward. Both providers read row-strided halves in place.
    if not (a.is_contiguous() and b.is_contiguous()):
        a, b = _rows(a), _rows(b)
    if _needs_grad(a, b):
        return _GluFn.apply(ops, a, b, kind).view(shape)
    out = new_output(a.shape, a)
    ops.glu_fwd(a, b, out, kind)
    return out.view(shape)


def _providers(kind_of, runner) -> dict[str, Any]:
    """{'cpu': fn, 'triton': fn} running `runner(provider, *args, kind)`."""
    def make(provider: str):
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            tensors, kind = kind_of(*args, **kwargs)
            return runner(provider, *tensors, kind)
        run.__name__ = f"{provider}_{runner.__name__.strip('_')}"
        return run
    return {"cpu": make("cpu"), "triton": make("triton")}


# ---------------------------------------------------------------- support checks and costs
def _check_same(*tensors: Any, **_: Any) -> str | None:
    """The fused kernels take tensors of one dtype and device (no promotion)."""
    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    for t in ts[1:]:
        if t.dtype != ts[0].dtype:
            return f"mixed dtypes ({ts[0].dtype}, {t.dtype}): the reference handles promotion"
        if t.device != ts[0].device:
            return f"tensors on different devices ({ts[0].device}, {t.device})"
    return None


def _check_bias(x: torch.Tensor, bias: Any = None, approximate: str = "none") -> str | None:
    if not isinstance(bias, torch.Tensor):
        return "bias must be a tensor"
    if x.dim() == 0 or bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        return f"bias {tuple(bias.shape)} is not a vector over x's last dim {tuple(x.shape)}"
    return _check_same(x, bias)


def _check_glu(a: torch.Tensor, b: Any = None, *_: Any, **__: Any) -> str | None:
    if not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return f"a and b must have the same shape (got {tuple(a.shape)} and {tuple(getattr(b, 'shape', ()))}); the reference broadcasts"
    return _check_same(a, b)


def _act_cost(x: torch.Tensor, bias: torch.Tensor | None, kind: int) -> Cost:
    """act(x [+ bias]) in one pass: read x (and bias), write y; eager writes and re-reads x + bias."""
    n, e = x.numel(), x.element_size()
    if bias is None:
        return Cost(flops=_FLOPS[kind] * n, bytes_fused=2.0 * n * e, bytes_unfused=2.0 * n * e)
    nb = bias.numel() * bias.element_size()
    return Cost(flops=(_FLOPS[kind] + 1.0) * n, bytes_fused=2.0 * n * e + nb, bytes_unfused=4.0 * n * e + nb)


def _gelu_cost(x: torch.Tensor, approximate: str = "none") -> Cost:
    return _act_cost(x, None, _gelu_kind(approximate))


def _bias_gelu_cost(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> Cost:
    return _act_cost(x, bias, _gelu_kind(approximate))


def _glu_kind_cost(a: torch.Tensor, kind: int) -> Cost:
    """act(a) * b in one pass: read a and b, write y; eager writes and re-reads act(a)."""
    n, e = a.numel(), a.element_size()
    return Cost(flops=(_FLOPS[kind] + 1.0) * n, bytes_fused=3.0 * n * e, bytes_unfused=5.0 * n * e)


def _glu_cost(kind: int):
    def cost(a: torch.Tensor, b: torch.Tensor, approximate: str = "none") -> Cost:
        return _glu_kind_cost(a, kind if kind == KIND_SILU else _gelu_kind(approximate))
    return cost


# The library ops as a profiler sees them (kernels/registry.py, OP_COSTS). A backward recomputes
# act(x) and its derivative (about twice the forward's FLOPs) and multiplies by the incoming grad.
@register_op_cost("act_fwd", "triton_act_fwd")
def _act_fwd_op(x, bias, out, kind, **_: Any) -> Cost:
    return _act_cost(x, bias, kind)


@register_op_cost("act_bwd", "triton_act_bwd")
def _act_bwd_op(grad, x, bias, grad_x, grad_bias, kind, **_: Any) -> Cost:
    n = x.numel()
    flops = (2.0 * _FLOPS[kind] + 1.0 + (bias is not None) + (grad_bias is not None)) * n
    return op_only_cost(flops, io_bytes(grad, x, bias, grad_x, grad_bias))


@register_op_cost("glu_fwd", "triton_glu_fwd")
def _glu_fwd_op(a, b, out, kind, **_: Any) -> Cost:
    return _glu_kind_cost(a, kind)


@register_op_cost("glu_bwd", "triton_glu_bwd")
def _glu_bwd_op(grad, a, b, grad_a, grad_b, kind, **_: Any) -> Cost:
    return op_only_cost((3.0 * _FLOPS[kind] + 3.0) * a.numel(), io_bytes(grad, a, b, grad_a, grad_b))


def _aten_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


def _aten_bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x + bias, approximate=approximate)


GELU_SPEC = register_kernel(KernelSpec(
    name="gelu", reference=gelu_reference,
    providers={**_providers(lambda x, approximate="none": ((x, None), _gelu_kind(approximate)), _act),
               "aten": _aten_gelu},
    supports=Supports(), cost=_gelu_cost,
    description="GELU (erf or tanh) in one pass, fp32 math; backward recomputes from x"))
BIAS_GELU_SPEC = register_kernel(KernelSpec(
    name="bias_gelu", reference=bias_gelu_reference,
    providers={**_providers(lambda x, bias, approximate="none": ((x, bias), _gelu_kind(approximate)), _act),
               "aten": _aten_bias_gelu},
    supports=Supports(check=_check_bias), cost=_bias_gelu_cost,
    description="gelu(x + bias) without materializing x + bias; bias grad reduced in the same pass"))
SWIGLU_SPEC = register_kernel(KernelSpec(
    name="swiglu", reference=swiglu_reference,
    providers=_providers(lambda a, b: ((a, b), KIND_SILU), _glu),
    supports=Supports(check=_check_glu), cost=_glu_cost(KIND_SILU),
    description="silu(a) * b in one pass, forward and backward"))
GEGLU_SPEC = register_kernel(KernelSpec(
    name="geglu", reference=geglu_reference,
    providers=_providers(lambda a, b, approximate="none": ((a, b), _gelu_kind(approximate)), _glu),
    supports=Supports(check=_check_glu), cost=_glu_cost(KIND_GELU_ERF),
    description="gelu(a) * b in one pass, forward and backward"))


# ---------------------------------------------------------------- public API
@typed_arguments
def gelu(x: torch.Tensor, approximate: str = "none", *, provider: str | None = None) -> torch.Tensor:
    """GELU of x (erf, or tanh with approximate='tanh')."""
    _gelu_kind(approximate)
    return dispatch("gelu", x, approximate, provider=provider)


@typed_arguments
def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", *,
              provider: str | None = None) -> torch.Tensor:
    """gelu(x + bias), bias a vector over x's last dim."""
    _gelu_kind(approximate)
    return dispatch("bias_gelu", x, bias, approximate, provider=provider)


@typed_arguments
def swiglu(a: torch.Tensor, b: torch.Tensor, *, provider: str | None = None) -> torch.Tensor:
    """silu(a) * b."""
    return dispatch("swiglu", a, b, provider=provider)


@typed_arguments
def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "none", *,
          provider: str | None = None) -> torch.Tensor:
    """gelu(a) * b."""
    _gelu_kind(approximate)
    return dispatch("geglu", a, b, approximate, provider=provider)


class GELU(nn.Module):
    """Drop-in for nn.GELU."""

    def __init__(self, approximate: str = "none", provider: str | None = None) -> None:
        super().__init__()
        _gelu_kind(approximate)
        self.approximate, self.provider = approximate, provider

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, self.approximate, provider=self.provider)

    def extra_repr(self) -> str:  # as nn.GELU's, plus the provider
        return f"approximate={self.approximate!r}, provider={self.provider}"


class BiasGELU(nn.Module):
    """gelu(x + bias) with a learned bias of size `features` (pair with a bias-free Linear)."""

    def __init__(self, features: int, approximate: str = "none", provider: str | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        _gelu_kind(approximate)
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))
        self.approximate, self.provider = approximate, provider

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu(x, self.bias, self.approximate, provider=self.provider)

    def extra_repr(self) -> str:
        return f"features={self.bias.shape[0]}, approximate={self.approximate!r}, provider={self.provider}"


def gated_halves(name: str, x: torch.Tensor, approximate: str = "none", provider: str | None = None) -> torch.Tensor:
    """act(a) * b of the halves a, b of one packed [..., 2h] x (the module forms). With grad on a
    contiguous x and a fused provider chosen, the packed Function runs on x itself, so the backward
    writes one gradient; unlike `packed_source`, this also holds while torch.compile traces."""
    a, b = x.chunk(2, dim=-1)  # [..., 2h] -> two [..., h] views
    args = (a, b) if name == "swiglu" else (a, b, approximate)
    if a.shape == b.shape and x.is_contiguous() and x.numel() and _needs_grad(x):
        chosen, _ = select_provider(KERNELS[name], args, {}, provider, by_measurement=provider is None)
        if chosen in ("cpu", "triton"):
            kind = KIND_SILU if name == "swiglu" else _gelu_kind(approximate)
            return _PackedGluFn.apply(_ops(chosen), x.view(-1, x.shape[-1]), kind).view(a.shape)
    return dispatch(name, *args, provider=provider)


class SwiGLU(nn.Module):
    """silu(a) * b of the two halves of the last dim (a packed gate/up projection)."""

    def __init__(self, provider: str | None = None) -> None:
        super().__init__()
        self.provider = provider

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_halves("swiglu", x, provider=self.provider)


class GeGLU(nn.Module):
    """gelu(a) * b of the two halves of the last dim (a packed gate/up projection)."""

    def __init__(self, approximate: str = "none", provider: str | None = None) -> None:
        super().__init__()
        _gelu_kind(approximate)
        self.approximate, self.provider = approximate, provider

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_halves("geglu", x, self.approximate, provider=self.provider)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, provider={self.provider}"
