"""Triton multi-tensor AdamW and LAMB steps (CUDA; runs under TRITON_INTERPRET=1 for tests).

One launch covers every tensor of a bucket: a chunk table maps each program to (tensor, start),
and a pointer table holds each tensor's data pointers (loaded and cast to pointers in the kernel),
as apex's multi_tensor_apply does with its chunk metadata. Per-tensor scalars (bias corrections,
trust-ratio step sizes) travel as small device arrays. LAMB takes three launches: stage 1 (m, v,
and per-chunk squared norms of p and of the update), a deterministic per-tensor sum of the
partials (fp64 cumulative sums), stage 2 (recompute the update, apply lr * ratio).

Step counters stay on the host (as torch.optim keeps them for non-capturable optimizers).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements per program

_DT = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _chunk(chunk_t, chunk_s, numels, BLOCK: tl.constexpr):
    """This program's (tensor index, element offsets, in-bounds mask) from the chunk table."""
    c = tl.program_id(0)
    i = tl.load(chunk_t + c)
    offs = tl.load(chunk_s + c) + tl.arange(0, BLOCK)
    return c, i, offs, offs < tl.load(numels + i)


@triton.jit
def _slot(ptrs, i, k: tl.constexpr, DT: tl.constexpr):
    """Tensor i's k-th data pointer (0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq)."""
    return tl.load(ptrs + i * 5 + k).to(tl.pointer_type(DT))


@triton.jit
def _adamw_kernel(ptrs, numels, chunk_t, chunk_s, step_size, bc2_sqrt, decay, w1, beta2, w2, eps,
                  LERP_LOW: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
                  DT: tl.constexpr, BLOCK: tl.constexpr):
    c, i, offs, mask = _chunk(chunk_t, chunk_s, numels, BLOCK)
    p_ptr = _slot(ptrs, i, 0, DT)
    g_ptr = _slot(ptrs, i, 1, DT)
    m_ptr = _slot(ptrs, i, 2, DT)
    v_ptr = _slot(ptrs, i, 3, DT)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if MAXIMIZE:
        g = -g
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32) * decay
    m0 = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if LERP_LOW:
        m = m0 + w1 * (g - m0)
    else:
        m = g - (g - m0) * (1.0 - w1)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32) * beta2 + w2 * g * g
    vd = v
    if AMSGRAD:
        vm_ptr = _slot(ptrs, i, 4, DT)
        vd = tl.maximum(tl.load(vm_ptr + offs, mask=mask, other=0.0).to(tl.float32), v)
        tl.store(vm_ptr + offs, vd, mask=mask)
    denom = tl.sqrt(vd) / tl.load(bc2_sqrt + i) + eps
    p = p - tl.load(step_size + i) * m / denom
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


@triton.jit
def _lamb_stage1(ptrs, numels, chunk_t, chunk_s, inv_bc1, inv_bc2, part_p, part_u, b1, b2, w2, b3,
                 eps, inv_clip, l2, dec, DT: tl.constexpr, BLOCK: tl.constexpr):
    c, i, offs, mask = _chunk(chunk_t, chunk_s, numels, BLOCK)
    p_ptr = _slot(ptrs, i, 0, DT)
    g_ptr = _slot(ptrs, i, 1, DT)
    m_ptr = _slot(ptrs, i, 2, DT)
    v_ptr = _slot(ptrs, i, 3, DT)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32) * inv_clip + l2 * p
    m = b1 * tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32) + b3 * g
    v = b2 * tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32) + w2 * g * g
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    m = m.to(DT).to(tl.float32)  # the update from the stored (rounded) moments, as stage 2 sees them
    v = v.to(DT).to(tl.float32)
    u = (m * tl.load(inv_bc1 + i)) / (tl.sqrt(v * tl.load(inv_bc2 + i)) + eps) + dec * p
    u = tl.where(mask, u, 0.0)
    tl.store(part_p + c, tl.sum(p * p, axis=0))
    tl.store(part_u + c, tl.sum(u * u, axis=0))


@triton.jit
def _lamb_stage2(ptrs, numels, chunk_t, chunk_s, inv_bc1, inv_bc2, step_lr, eps, dec,
                 DT: tl.constexpr, BLOCK: tl.constexpr):
    c, i, offs, mask = _chunk(chunk_t, chunk_s, numels, BLOCK)
    p_ptr = _slot(ptrs, i, 0, DT)
    m_ptr = _slot(ptrs, i, 2, DT)
    v_ptr = _slot(ptrs, i, 3, DT)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = (m * tl.load(inv_bc1 + i)) / (tl.sqrt(v * tl.load(inv_bc2 + i)) + eps) + dec * p
    tl.store(p_ptr + offs, p - tl.load(step_lr + i) * u, mask=mask)


class _Tables:
    """Chunk table of a list of tensors: per program (tensor index, start) and per tensor numel."""

    def __init__(self, tensors: list[torch.Tensor], device: torch.device) -> None:
        numels = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
        counts = (numels + BLOCK - 1) // BLOCK  # chunks per tensor
        self.n_chunks = int(counts.sum())
        chunk_t = torch.repeat_interleave(torch.arange(len(tensors)), counts)  # [n_chunks]
        first = torch.cumsum(counts, 0) - counts  # first chunk of each tensor
        chunk_s = (torch.arange(self.n_chunks) - first[chunk_t]) * BLOCK
        self.last = (first + counts - 1).to(device)  # last chunk of each tensor
        self.first = first.to(device)
        self.numels = numels.to(device)
        self.chunk_t = chunk_t.to(torch.int32).to(device)
        self.chunk_s = chunk_s.to(device)

    @staticmethod
    def pointers(lists: list[list[torch.Tensor]], device: torch.device) -> torch.Tensor:
        """[n_tensors, 5] int64 data pointers (p, g, m, v, vmax; 0 where a list is empty)."""
        n = len(lists[0])
        cols = [[t.data_ptr() for t in lst] if lst else [0] * n for lst in lists]
        cols += [[0] * n] * (5 - len(cols))
        return torch.tensor(list(zip(*cols)), dtype=torch.int64).to(device)


def _steps(steps: list[torch.Tensor]) -> list[float]:
    torch._foreach_add_(steps, 1)
    return [float(s) for s in steps]


def _per_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(device)


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1,
               beta2, eps, weight_decay, amsgrad, maximize) -> None:
    """One AdamW step over lists of same-dtype tensors on one device (one launch)."""
    if not params:
        return
    dev, dt = params[0].device, params[0].dtype
    tab = _Tables(params, dev)
    ptrs = _Tables.pointers([params, grads, exp_avgs, exp_avg_sqs,
                             max_exp_avg_sqs if amsgrad else []], dev)
    st = _steps(steps)
    step_size = _per_tensor([lr / (1 - beta1 ** s) for s in st], dev)
    bc2_sqrt = _per_tensor([math.sqrt(1 - beta2 ** s) for s in st], dev)
    _adamw_kernel[(tab.n_chunks,)](
        ptrs, tab.numels, tab.chunk_t, tab.chunk_s, step_size, bc2_sqrt,
        1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, eps,
        LERP_LOW=(1 - beta1) < 0.5, AMSGRAD=amsgrad, MAXIMIZE=maximize, DT=_DT[dt], BLOCK=BLOCK)


def lamb_step(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps,
              weight_decay, grad_divisor, bias_correction, adam_w_mode, grad_averaging,
              use_nvlamb) -> None:
    """One LAMB step over lists of same-dtype tensors on one device (three launches)."""
    if not params:
        return
    dev, dt = params[0].device, params[0].dtype
    tab = _Tables(params, dev)
    ptrs = _Tables.pointers([params, grads, exp_avgs, exp_avg_sqs], dev)
    st = _steps(steps)
    inv_bc1 = _per_tensor([1 / (1 - beta1 ** s) if bias_correction else 1.0 for s in st], dev)
    inv_bc2 = _per_tensor([1 / (1 - beta2 ** s) if bias_correction else 1.0 for s in st], dev)
    part_p = torch.empty(tab.n_chunks, dtype=torch.float32, device=dev)
    part_u = torch.empty_like(part_p)
    l2, dec = (0.0, weight_decay) if adam_w_mode else (weight_decay, 0.0)
    grid = (tab.n_chunks,)
    _lamb_stage1[grid](ptrs, tab.numels, tab.chunk_t, tab.chunk_s, inv_bc1, inv_bc2, part_p, part_u,
                       beta1, beta2, 1 - beta2, (1 - beta1) if grad_averaging else 1.0, eps,
                       1.0 / grad_divisor, l2, dec, DT=_DT[dt], BLOCK=BLOCK)
    norms = []
    for part in (part_p, part_u):  # per-tensor sums of consecutive chunks, deterministic, fp64
        cs = torch.cumsum(part.double(), 0)
        before = torch.where(tab.first > 0, cs[(tab.first - 1).clamp(min=0)], torch.zeros_like(cs[:1]))
        norms.append((cs[tab.last] - before).clamp(min=0).sqrt())
    pn, un = norms
    trust = (pn > 0) & (un > 0) & bool(use_nvlamb or weight_decay != 0)
    step_lr = (lr * torch.where(trust, pn / torch.where(trust, un, torch.ones_like(un)),
                                torch.ones_like(pn))).float()
    _lamb_stage2[grid](ptrs, tab.numels, tab.chunk_t, tab.chunk_s, inv_bc1, inv_bc2, step_lr, eps,
                       dec, DT=_DT[dt], BLOCK=BLOCK)
