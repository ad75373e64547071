"""Softmax with scale and an optional additive or causal mask, forward and backward.

`softmax(x, dim=-1, scale=1.0, mask=None, causal=False)` = softmax(x * scale + mask) along `dim`,
with causal positions filled with -inf first (the attention-probability pattern written by hand:
`scores * scale + mask`, `masked_fill(triu, -inf)`, `softmax`). Module: `Softmax`.

Semantics (those of `softmax_reference`, the truth for tests):
- `mask`: an additive floating mask broadcastable to x (e.g. [B, 1, 1, S_k] padding, [S_q, S_k]);
  it is read through its broadcast strides, never materialised. Dtypes promote as in eager: an
  fp32 mask on bf16 scores gives fp32 probabilities (x is converted first and the kernel runs in
  fp32). Boolean masks are rejected with a message (turn keep-masks into 0 / -inf with
  `torch.where`).
- Under `torch.autocast` on a GPU, F.softmax's fp32 policy there: a bf16/fp16 x is up-cast and the
  probabilities are fp32, whichever provider runs (`kernels/autocast.py`).
- `causal`: over the last two dims, query i sees keys j <= i + (S_k - S_q) (aligned to the end,
  as in KV-cache decoding); needs dim = -1. A 1-D x is one query row.
- A row whose every logit is -inf (fully masked) gives NaN, like eager's softmax; NaN or +Inf in a
  row makes the row NaN. Causal-masked positions get 0 and a zero gradient (masked_fill's backward);
  a fully causal-masked row's gradient is 0, an additive -inf row's gradient is NaN, as in eager.
- dim other than the last: the dim is moved last (a copy), computed, and moved back.

Providers: "cpu" (`torch.ops.fusionlens.softmax_{fwd,bwd}`, `kernels/csrc/softmax.cpp`), "triton"
(`kernels/triton_softmax.py`, same signatures), "aten" (`torch.softmax` after the eager scale/mask:
only when there is neither, where it is the plain fused op).

Cost: the fused kernel reads x (and the mask as broadcast) and writes y: 2ne + mask bytes; eager
also writes and re-reads x * scale, + mask and the filled copy (up to 8ne).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from kernels.arguments import typed_arguments
from kernels.autocast import AutocastRule, up
from kernels.double_backward import eager_backward
from kernels.providers import provider_ops
from kernels.registry import (FLOAT_DTYPES, Cost, KernelSpec, Supports, dispatch, io_bytes, new_output,
                              op_only_cost, register_kernel, register_op_cost)


# ---------------------------------------------------------------- reference (the truth for tests)
def _causal_hidden(x: torch.Tensor) -> torch.Tensor:
    """Bool [S_q, S_k] (or [S_k] for 1-D x): True where the key is in the query's future."""
    sq = x.shape[-2] if x.dim() >= 2 else 1
    sk = x.shape[-1]
    hidden = torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(sk - sq + 1)
    return hidden if x.dim() >= 2 else hidden[0]


def softmax_reference(x: torch.Tensor, dim: int = -1, scale: float = 1.0,
                      mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """softmax(x * scale + mask) along dim, causal positions filled with -inf (eager ops)."""
    s = x * scale if scale != 1.0 else x
    if mask is not None:
        s = s + mask
    if causal:
        s = s.masked_fill(_causal_hidden(s), float("-inf"))
    return torch.softmax(s, dim)


# ---------------------------------------------------------------- provider ops (C++ or Triton)
_ops = functools.partial(provider_ops, triton_module="kernels.triton_softmax")


def _expanded_mask(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The mask as a broadcast view of x's shape whose last dim is contiguous (the kernels' input)."""
    m = mask.expand(shape)  # stride 0 on broadcast dims: no copy
    if m.stride(-1) == 1:
        return m
    if m.shape[-1] <= 1 or m.numel() == 0:  # one element a row, or none at all: any stride reads it,
        return m.as_strided(m.shape, (*m.stride()[:-1], 1))  # but torch calls such a view contiguous
    return m.contiguous()


class _SoftmaxFn(torch.autograd.Function):
    """y = softmax(x * scale + mask, -1) with causal fill; saves y only."""

    @staticmethod
    def forward(ctx, ops, x, mask, scale, causal):
        x = x.contiguous()
        y = new_output(x.shape, x)
        ops.softmax_fwd(x, _expanded_mask(mask, x.shape) if mask is not None else None, y, scale, causal)
        ctx.save_for_backward(y)
        ctx.ops, ctx.scale, ctx.causal = ops, scale, causal
        ctx.mask_shape = mask.shape if mask is not None else None
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        want_mask = ctx.needs_input_grad[2]
        if eager_backward(grad):  # eager ops on the saved output (whose grad_fn is this node): differentiable
            yf = y.float()
            grad_s = (yf * (grad.float() - (grad.float() * yf).sum(-1, keepdim=True))).to(y.dtype)
            grad_mask = grad_s.sum_to_size(ctx.mask_shape) if want_mask else None
            return None, grad_s * ctx.scale if ctx.needs_input_grad[1] else None, grad_mask, None, None
        grad_x = new_output(y.shape, y)
        # grad wrt the logits s = x * scale + mask is grad_x / scale: get it unscaled when needed.
        ctx.ops.softmax_bwd(grad.contiguous(), y, grad_x, 1.0 if want_mask else ctx.scale, ctx.causal)
        grad_mask = grad_x.sum_to_size(ctx.mask_shape) if want_mask else None
        if want_mask and ctx.scale != 1.0:
            grad_x = grad_x * ctx.scale
        return None, grad_x if ctx.needs_input_grad[1] else None, grad_mask, None, None


def _run(provider: str, x: torch.Tensor, dim: int = -1, scale: float = 1.0,
         mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    d = dim % x.dim() if x.dim() else 0
    if d != x.dim() - 1:  # move the softmax dim last (a copy), run, move it back (a view)
        xm = x.movedim(d, -1)
        mm = mask.expand(x.shape).movedim(d, -1) if mask is not None else None
        return _run(provider, xm, -1, scale, mm, causal).movedim(-1, d)
    ops = _ops(provider)
    scale = float(scale)
    if torch.is_grad_enabled() and (x.requires_grad or (mask is not None and mask.requires_grad)):
        return _SoftmaxFn.apply(ops, x, mask, scale, causal)
    x = x.contiguous()
    y = new_output(x.shape, x)
    ops.softmax_fwd(x, _expanded_mask(mask, x.shape) if mask is not None else None, y, scale, causal)
    return y


def _provider(name: str):
    def run(x, dim=-1, scale=1.0, mask=None, causal=False):
        if mask is not None and mask.dtype != x.dtype:  # eager promotes x * scale + mask: run in that dtype
            dt = torch.promote_types(x.dtype, mask.dtype)
            x, mask = x.to(dt), mask.to(dt)
        return _run(name, x, dim, scale, mask, causal)
    run.__name__ = f"{name}_softmax"
    return run


def _aten(x, dim=-1, scale=1.0, mask=None, causal=False):
    return torch.softmax(x, dim)


# ---------------------------------------------------------------- support checks and costs
def _check(x, dim=-1, scale=1.0, mask=None, causal=False) -> str | None:
    if x.dim() == 0:
        return "softmax of a 0-d tensor"
    if mask is not None:
        if torch.promote_types(mask.dtype, x.dtype) not in FLOAT_DTYPES:
            return f"mask dtype {mask.dtype} with x {x.dtype} promotes to float64: only the reference runs it"
        if mask.device != x.device:
            return f"mask on {mask.device}, x on {x.device}"
        try:
            torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            return f"mask {tuple(mask.shape)} does not broadcast to x {tuple(x.shape)}"
        if torch.broadcast_shapes(mask.shape, x.shape) != x.shape:
            return f"mask {tuple(mask.shape)} would broadcast x {tuple(x.shape)} to a larger shape"
    return None


def _aten_only_plain(x, dim=-1, scale=1.0, mask=None, causal=False) -> str | None:
    if scale != 1.0 or mask is not None or causal:
        return "ATen's softmax has no scale or mask: that is the unfused chain"
    return None


def _cost(x, dim=-1, scale=1.0, mask=None, causal=False) -> Cost:
    n, e = x.numel(), x.element_size()
    mask_bytes = mask.numel() * mask.element_size() if mask is not None else 0.0
    passes = 1 + (scale != 1.0) + (mask is not None) + bool(causal)  # eager ops, each read + write
    return Cost(flops=5.0 * n + 2.0 * n * (mask is not None),
                bytes_fused=2.0 * n * e + mask_bytes,
                bytes_unfused=2.0 * n * e * passes + mask_bytes)


@register_op_cost("softmax_fwd", "triton_softmax_fwd")
def _fwd_op(x, mask, out, scale, causal, **_: Any) -> Cost:
    """The KernelSpec's cost; the mask arrives as a broadcast view of x (`_expanded_mask`), so its
    bytes are its distinct elements, as the kernel reads them."""
    spec = _cost(x, scale=scale, mask=mask, causal=causal)
    return Cost(flops=spec.flops, bytes_fused=io_bytes(x, mask, out), bytes_unfused=spec.bytes_unfused)


@register_op_cost("softmax_bwd", "triton_softmax_bwd")
def _bwd_op(grad, y, grad_x, scale, causal, **_: Any) -> Cost:
    """dx = scale * y * (g - sum(g * y)): read g and y, write dx."""
    n = y.numel()
    return op_only_cost((4.0 + (scale != 1.0)) * n, io_bytes(grad, y, grad_x))


def _autocast(x, dim=-1, scale=1.0, mask=None, causal=False, provider=None):
    """Under a GPU autocast region: F.softmax's fp32 policy (x up-cast, fp32 probabilities; a
    bf16/fp16 mask too: the fp32 kernel would promote it anyway)."""
    return dispatch("softmax", up(x), dim, scale, up(mask), causal, provider=provider)


SOFTMAX_SPEC = register_kernel(KernelSpec(
    name="softmax", reference=softmax_reference,
    providers={"cpu": _provider("cpu"), "triton": _provider("triton"), "aten": _aten},
    supports=Supports(check=_check), cost=_cost,
    description="softmax(x * scale + mask) with causal fill in one pass; backward from y alone",
    provider_checks={"aten": _aten_only_plain},
    autocast=AutocastRule("softmax", _autocast)))


# ---------------------------------------------------------------- public API
def _validate(x: torch.Tensor, dim: int, mask: torch.Tensor | None, causal: bool) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("softmax: x must be a floating tensor")
    if mask is not None and not mask.is_floating_point():
        raise TypeError("softmax: mask must be additive and floating (0 / -inf); convert a boolean "
                        "keep-mask with torch.where(keep, 0.0, float('-inf'))")
    if x.dim() and not -x.dim() <= dim < x.dim():
        raise IndexError(f"softmax: dim {dim} out of range for a {x.dim()}-d tensor")
    if causal and x.dim() and dim % x.dim() != x.dim() - 1:
        raise ValueError("softmax: causal masking runs over the last two dims and needs dim=-1")


@typed_arguments
def softmax(x: torch.Tensor, dim: int = -1, scale: float = 1.0, mask: torch.Tensor | None = None,
            causal: bool = False, *, provider: str | None = None) -> torch.Tensor:
    """softmax(x * scale + mask) along dim, optionally causal (see the module docstring)."""
    _validate(x, dim, mask, causal)
    return dispatch("softmax", x, dim, scale, mask, causal, provider=provider)


class Softmax(nn.Module):
    """Scaled, masked softmax: forward(x, mask=None)."""

    def __init__(self, dim: int = -1, scale: float = 1.0, causal: bool = False,
                 provider: str | None = None) -> None:
        super().__init__()
        self.dim, self.scale, self.causal, self.provider = dim, scale, causal, provider

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return softmax(x, self.dim, self.scale, mask, self.causal, provider=self.provider)
