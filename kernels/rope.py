"""Rotary position embedding (rotate-half layout) applied to q and k, forward and backward.

`rope(q, k, cos, sin) -> (q_rot, k_rot)` with Hugging Face `apply_rotary_pos_emb` semantics:
`x * cos + rotate_half(x) * sin`, `rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`.
Module: `RotaryEmbedding` (holds nothing learned; applies given cos/sin).

Layout:
- q: [batch, heads_q, seq, head_dim], k: [batch, heads_k, seq, head_dim] (heads_k may differ:
  grouped-query attention). Any strides with a contiguous last dim are read in place, so the
  usual `proj(x).view(B, S, H, D).transpose(1, 2)` costs no copy. Outputs are contiguous.
- cos, sin: [seq, head_dim] (shared by the batch), [batch, seq, head_dim] (what HF's rotary
  module returns; unsqueezed on the head dim, as HF's unsqueeze_dim=1 does), or already
  [batch or 1, 1, seq, head_dim]. They are not learned: no gradient flows to them.
- Seq-first: q [batch, seq, heads, head_dim] with cos/sin [batch or 1, seq, 1, head_dim] (HF's
  unsqueeze_dim=2, flash-attention layouts) runs the same kernels on transposed views; outputs are
  contiguous in that layout, as eager's.
- Dtypes promote as in eager: fp32 tables with a bf16/fp16 q give fp32 outputs (q is converted
  first, so the kernel runs in fp32; a single pass still replaces eager's five).

Backward applies the transposed rotation to the incoming gradient:
grad_x1 = g1 * cos1 + g2 * sin2, grad_x2 = g2 * cos2 - g1 * sin1.

Providers: "cpu" (`torch.ops.fusionlens.rope_apply`, `kernels/csrc/rope.cpp`), "triton"
(`kernels/triton_rope.py`, same signature). No ATen op fuses this.

Cost per tensor (n elements, e bytes; q and k each): fused reads x and writes the output (2ne,
+ cos and sin once); eager runs x*cos (2ne), neg of one half (ne), cat (2ne), *sin (2ne) and +
(3ne): 10ne, + cos and sin once.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from kernels.arguments import typed_arguments
from kernels.double_backward import eager_backward
from kernels.providers import provider_ops
from kernels.registry import (FLOAT_DTYPES, Cost, KernelSpec, Supports, dispatch, io_bytes, new_output_like,
                              op_only_cost, register_kernel, register_op_cost)


# ---------------------------------------------------------------- reference (the truth for tests)
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """cat(-x2, x1) of the two halves of the last dim (HF's rotate_half)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _hf_layout(t: torch.Tensor) -> torch.Tensor:
    """cos/sin as they multiply [B, H, S, D]: [B, S, D] gets the head dim, others broadcast as is."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF apply_rotary_pos_emb: (q * cos + rotate_half(q) * sin, same for k)."""
    c, s = _hf_layout(cos), _hf_layout(sin)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


# ---------------------------------------------------------------- provider ops (C++ or Triton)
_ops = functools.partial(provider_ops, triton_module="kernels.triton_rope")


def _table(t: torch.Tensor) -> torch.Tensor:
    """cos/sin as the kernels take them: contiguous fp32 [batch or 1, seq, head_dim]."""
    if t.dim() == 2:
        t = t.unsqueeze(0)  # [S, D] -> [1, S, D]
    elif t.dim() == 4:
        t = t.squeeze(1)  # [B, 1, S, D] -> [B, S, D]
    if t.dtype != torch.float32:  # each skipped no-op call is ~1 us: a decode step's tables are tiny
        t = t.float()
    return t if t.is_contiguous() else t.contiguous()


def _rotate_back_eager(g: torch.Tensor, cos32: torch.Tensor, sin32: torch.Tensor) -> torch.Tensor:
    """The rotation's transpose from eager ops (a differentiable backward): g*cos + R^T(g*sin),
    where rotate_half is R = [[0, -I], [I, 0]] and so R^T(u) = cat(u2, -u1)."""
    c, s = cos32.unsqueeze(1), sin32.unsqueeze(1)  # [b or 1, 1, seq, d] against [b, heads, seq, d]
    u = g.float() * s
    u1, u2 = u.chunk(2, -1)
    return (g.float() * c + torch.cat((u2, -u1), -1)).to(g.dtype)


def _rotate(ops: Any, x: torch.Tensor, cos32: torch.Tensor, sin32: torch.Tensor,
            backward: bool) -> torch.Tensor:
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    out = new_output_like(x)  # x's layout, as eager's output: both are walked in memory order
    ops.rope_apply(x, cos32, sin32, out, backward)
    return out


class _RopeFn(torch.autograd.Function):
    """(q, k) -> rotated (q, k); cos/sin (fp32 tables) are constants."""

    @staticmethod
    def forward(ctx, ops, q, k, cos32, sin32):
        ctx.ops = ops
        ctx.save_for_backward(cos32, sin32)
        return _rotate(ops, q, cos32, sin32, False), _rotate(ops, k, cos32, sin32, False)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        cos32, sin32 = ctx.saved_tensors
        if eager_backward(grad_q, grad_k):  # linear in the grads: the transpose from eager ops is differentiable
            return (None, _rotate_back_eager(grad_q, cos32, sin32) if grad_q is not None and ctx.needs_input_grad[1] else None,
                    _rotate_back_eager(grad_k, cos32, sin32) if grad_k is not None and ctx.needs_input_grad[2] else None,
                    None, None)
        gq = _rotate(ctx.ops, grad_q, cos32, sin32, True) if grad_q is not None and ctx.needs_input_grad[1] else None
        gk = _rotate(ctx.ops, grad_k, cos32, sin32, True) if grad_k is not None and ctx.needs_input_grad[2] else None
        return None, gq, gk, None, None


def _out_dtype(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.dtype:
    """The dtype eager gives `x * cos + rotate_half(x) * sin`: fp32 tables promote a bf16 x."""
    return torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


def _seq_first(q: torch.Tensor, cos: torch.Tensor) -> bool:
    """cos/sin [batch or 1, seq, 1, head_dim] against q [batch, seq, heads, head_dim]: the table's
    third dim is 1 where q's (heads) is not. (Heads-first tables have seq there; at seq 1 both
    readings broadcast the same way.)"""
    return cos.dim() == 4 and q.dim() == 4 and cos.shape[2] == 1 and q.shape[2] != 1


def _heads_first(q, k, cos, sin) -> tuple:
    """The seq-first layout as [batch, heads, seq, head_dim] views (no copy); others as given."""
    if not _seq_first(q, cos):
        return q, k, cos, sin
    return tuple(t.transpose(1, 2) for t in (q, k, cos, sin))


def _provider(name: str):
    def run(q, k, cos, sin):
        ops = _ops(name)
        seq_first = _seq_first(q, cos)
        q, k, cos, sin = _heads_first(q, k, cos, sin)
        if not q.dtype == k.dtype == cos.dtype == sin.dtype:  # eager's promotion (fp32 tables, bf16 q)
            q, k = (t.to(_out_dtype(t, cos, sin)) for t in (q, k))  # no copy when the dtype is kept
        cos32, sin32 = _table(cos), _table(sin)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            out = _RopeFn.apply(ops, q, k, cos32, sin32)
        else:
            out = _rotate(ops, q, cos32, sin32, False), _rotate(ops, k, cos32, sin32, False)
        # the outputs took the views' memory order: transposed back, they are contiguous again
        return tuple(t.transpose(1, 2) for t in out) if seq_first else out
    run.__name__ = f"{name}_rope"
    return run


# ---------------------------------------------------------------- support checks and costs
def _check(q, k, cos, sin) -> str | None:
    if q.dim() != 4 or k.dim() != 4:
        return f"q and k must be [batch, heads, seq, head_dim] (got {q.dim()}-d and {k.dim()}-d)"
    q, k, cos, sin = _heads_first(q, k, cos, sin)  # seq-first: checked as the views the kernels get
    b, _, s, d = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (b, s, d):
        return f"k {tuple(k.shape)} does not match q {tuple(q.shape)} outside the head dim"
    if d % 2:
        return f"head_dim {d} is odd: rotate-half needs two equal halves"
    for t in (q, k, cos, sin):
        if t.dtype not in FLOAT_DTYPES or _out_dtype(t, cos, sin) not in FLOAT_DTYPES:
            return f"dtypes q {q.dtype}, k {k.dtype}, cos {cos.dtype}, sin {sin.dtype}: only the reference runs float64"
    if cos.requires_grad or sin.requires_grad:
        return "cos/sin require grad: only the reference differentiates them"
    if cos.shape != sin.shape:
        return f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ"
    ok = ((cos.dim() == 2 and tuple(cos.shape) == (s, d))
          or (cos.dim() == 3 and tuple(cos.shape[1:]) == (s, d) and cos.shape[0] in (1, b))
          or (cos.dim() == 4 and cos.shape[1] == 1 and tuple(cos.shape[2:]) == (s, d) and cos.shape[0] in (1, b)))
    if not ok:
        return f"cos/sin {tuple(cos.shape)} is not [seq, dim], [batch, seq, dim] or [batch, 1, seq, dim] for q {tuple(q.shape)}"
    if len({t.device for t in (q, k, cos, sin)}) != 1:
        return "q, k, cos and sin are on different devices"
    return None


def _cost(q, k, cos, sin) -> Cost:
    n, e = q.numel() + k.numel(), q.element_size()
    table = 2.0 * (cos.numel() * cos.element_size() + sin.numel() * sin.element_size())  # per q and k
    return Cost(flops=3.0 * n, bytes_fused=2.0 * n * e + table, bytes_unfused=10.0 * n * e + table)


@register_op_cost("rope_apply", "triton_rope_apply")
def _apply_op(x, cos, sin, out, backward, **_: Any) -> Cost:
    """One of q or k (forward or backward: the same rotation, sin negated): 3 FLOPs an element,
    read x and the fp32 tables, write out."""
    return op_only_cost(3.0 * x.numel(), io_bytes(x, cos, sin, out))


ROPE_SPEC = register_kernel(KernelSpec(
    name="rope", reference=rope_reference,
    providers={"cpu": _provider("cpu"), "triton": _provider("triton")},
    supports=Supports(check=_check), cost=_cost,
    description="rotate-half RoPE on q and k in one pass each, strided input read in place"))


# ---------------------------------------------------------------- public API
@typed_arguments
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         provider: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k (see the module docstring for layouts)."""
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"rope: {name} must be a floating tensor")
    return dispatch("rope", q, k, cos, sin, provider=provider)


class RotaryEmbedding(nn.Module):
    """Applies given cos/sin to (q, k): forward(q, k, cos, sin) -> (q, k)."""

    def __init__(self, provider: str | None = None) -> None:
        super().__init__()
        self.provider = provider

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(q, k, cos, sin, provider=self.provider)
