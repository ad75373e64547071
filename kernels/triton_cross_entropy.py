"""Triton cross-entropy row kernels (CUDA; runs under TRITON_INTERPRET=1 for tests).

One program per row of logits [N, V] (unit stride along V), looping over V in BLOCK-wide tiles:
- forward: online max / sum-of-exp (and sum of x for label smoothing) -> loss, log-sum-exp;
- backward: g * (softmax - (1 - eps) onehot - eps / V) from the logits and the saved lse;
- fused_: forward then the gradient written over the logits (the chunked linear + CE).
Traffic per row: forward reads V elements; backward reads V and writes V; fused reads 2V and
writes V. All math in fp32. Targets must be in [0, V) or ignore_index (not checked on the GPU).
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.registry import triton_interpreted


@triton.jit
def _row_stats(x_row, V, t, eps, BLOCK: tl.constexpr):
    """(lse, loss) of one row: online softmax over BLOCK-wide tiles."""
    m = float("-inf")
    s = 0.0
    sum_x = 0.0
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        finite = new_m != float("-inf")
        alpha = tl.where(finite, tl.exp(m - new_m), 1.0)
        e = tl.where(mask, tl.exp(x - new_m), 0.0)
        e = tl.where(finite, e, 0.0)
        s = s * alpha + tl.sum(e, axis=0)
        sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
        m = new_m
    lse = m + tl.log(s)
    xt = tl.load(x_row + t).to(tl.float32)
    loss = lse - (1.0 - eps) * xt - eps * (sum_x / V)
    return lse, loss


@triton.jit
def _ce_forward_kernel(x_ptr, stride_row, t_ptr, loss_ptr, lse_ptr, V, ignore_index, eps,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ignored = t == ignore_index
    lse, loss = _row_stats(x_ptr + row * stride_row, V, tl.where(ignored, 0, t), eps, BLOCK)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))


@triton.jit
def _row_grad(x_row, out_row, V, t, lse, eps, g, ignored, BLOCK: tl.constexpr):
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        grad = g * (tl.exp(x - lse) - eps / V) - tl.where(offs == t, g * (1.0 - eps), 0.0)
        grad = tl.where(ignored, 0.0, grad)
        tl.store(out_row + offs, grad, mask=mask)


@triton.jit
def _ce_backward_kernel(x_ptr, stride_row, t_ptr, lse_ptr, g_ptr, out_ptr, V, ignore_index, eps,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ignored = t == ignore_index
    _row_grad(x_ptr + row * stride_row, out_ptr + row * V, V, t, tl.load(lse_ptr + row), eps,
              tl.load(g_ptr + row), ignored, BLOCK)


@triton.jit
def _ce_fused_kernel(x_ptr, t_ptr, loss_ptr, V, ignore_index, eps, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ignored = t == ignore_index
    x_row = x_ptr + row * V
    lse, loss = _row_stats(x_row, V, tl.where(ignored, 0, t), eps, BLOCK)
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))
    _row_grad(x_row, x_row, V, t, lse, eps, scale, ignored, BLOCK)


def _launch_args(v: int) -> dict:
    block = min(triton.next_power_of_2(max(v, 1)), 64 if triton_interpreted() else 8192)
    return {"BLOCK": block} if triton_interpreted() else {"BLOCK": block, "num_warps": 16 if block >= 4096 else 4}


def forward(logits, target, ignore_index, eps, loss_rows, lse) -> None:
    n, v = logits.shape
    _ce_forward_kernel[(n,)](logits, logits.stride(0), target, loss_rows, lse, v, ignore_index,
                             float(eps), **_launch_args(v))


def backward(logits, target, lse, grad_rows, ignore_index, eps, grad) -> None:
    n, v = logits.shape
    _ce_backward_kernel[(n,)](logits, logits.stride(0), target, lse, grad_rows, grad, v,
                              ignore_index, float(eps), **_launch_args(v))


def fused_(logits, target, ignore_index, eps, scale, loss_rows) -> None:
    n, v = logits.shape
    if not logits.is_contiguous():
        raise ValueError("triton cross_entropy fused_: logits chunk must be contiguous")
    _ce_fused_kernel[(n,)](logits, target, loss_rows, v, ignore_index, float(eps), float(scale),
                           **_launch_args(v))

