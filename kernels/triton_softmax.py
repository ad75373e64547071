"""Triton scaled/masked/causal softmax, forward and backward (the CUDA `triton` provider).

Launchers `softmax_fwd(x, mask, out, scale, causal)` and `softmax_bwd(grad, y, grad_x, scale,
causal)` have the signatures of the C++ ops in `kernels/csrc/softmax.cpp`. Rows up to SINGLE_MAX
are held whole in registers (one read of x, one write of y: the bandwidth-bound ideal), several
short rows to a program; longer rows take one program each and two passes over BLOCK-wide tiles
with an online max/sum.

The mask arrives expanded to x's shape (broadcast strides, often 0); it is folded to 4-D and each
row finds its mask row from the row index, so a [B, 1, 1, S] padding mask is never materialised.

-inf handling matches eager: a fully masked row is 0/0 = NaN, causal-masked positions are 0 and
get zero gradient. The online pass guards max = -inf (exp(-inf - -inf) would poison the sum).
Interpreter-safe: no methods on scalar arguments.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SINGLE_MAX = 8192
BLOCK = 2048
TILE = 2048  # elements of whole short rows per program


@triton.jit
def _logits(X, Mk, row, cols, inb, N, SQ, D1, ms0, ms1, ms2, ms3, scale,
            HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """x * scale + mask for `cols` of `row`, -inf where not `inb` or causally hidden.

    row and cols broadcast: a scalar row and [BLOCK_N] cols, or [R, 1] rows and [1, BLOCK_N] cols.
    """
    x = tl.load(X + row * N + cols, mask=inb, other=float("-inf")).to(tl.float32)
    s = x * scale
    if HAS_MASK:
        i = row % SQ
        t = row // SQ
        moff = (t // D1) * ms0 + (t % D1) * ms1 + i * ms2
        s = s + tl.load(Mk + moff + cols * ms3, mask=inb, other=0.0).to(tl.float32)
    keep = inb
    if CAUSAL:
        keep = keep & (cols <= (row % SQ) + N - SQ)
    return tl.where(keep, s, float("-inf")), keep


@triton.jit
def _fwd_kernel(X, Mk, Y, R, N, SQ, D1, ms0, ms1, ms2, ms3, scale, HAS_MASK: tl.constexpr,
                CAUSAL: tl.constexpr, SINGLE: tl.constexpr, ROWS_P: tl.constexpr, BLOCK_N: tl.constexpr):
    offs = tl.arange(0, BLOCK_N)
    if SINGLE:  # a [ROWS_P, BLOCK_N] tile of whole rows, reduced along axis 1
        rows = (tl.program_id(0).to(tl.int64) * ROWS_P + tl.arange(0, ROWS_P))[:, None]
        cols = offs[None, :]
        inb = (cols < N) & (rows < R)
        s, keep = _logits(X, Mk, rows, cols, inb, N, SQ, D1, ms0, ms1, ms2, ms3, scale, HAS_MASK, CAUSAL)
        m = tl.max(s, axis=1)[:, None]
        e = tl.exp(s - m)  # a fully -inf row: NaN everywhere, like eager
        y = e / tl.sum(tl.where(inb, e, 0.0), axis=1)[:, None]
        tl.store(Y + rows * N + cols, y.to(Y.dtype.element_ty), mask=inb)
    else:  # one long row per program, online max/sum over BLOCK_N-wide tiles
        row = tl.program_id(0).to(tl.int64)
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        for start in range(0, N, BLOCK_N):
            s, keep = _logits(X, Mk, row, start + offs, start + offs < N, N, SQ, D1, ms0, ms1, ms2, ms3,
                              scale, HAS_MASK, CAUSAL)
            m_new = tl.maximum(m, tl.max(s, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            total = total * tl.exp(m - m_safe) + tl.sum(tl.where(start + offs < N, tl.exp(s - m_safe), 0.0), axis=0)
            m = m_new
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        for start in range(0, N, BLOCK_N):
            s, keep = _logits(X, Mk, row, start + offs, start + offs < N, N, SQ, D1, ms0, ms1, ms2, ms3,
                              scale, HAS_MASK, CAUSAL)
            y = tl.exp(s - m_safe) / total
            tl.store(Y + row * N + start + offs, y.to(Y.dtype.element_ty), mask=start + offs < N)


@triton.jit
def _bwd_kernel(G, Yp, GX, R, N, SQ, scale, CAUSAL: tl.constexpr, SINGLE: tl.constexpr,
                ROWS_P: tl.constexpr, BLOCK_N: tl.constexpr):
    offs = tl.arange(0, BLOCK_N)
    if SINGLE:  # a [ROWS_P, BLOCK_N] tile of whole rows
        rows = (tl.program_id(0).to(tl.int64) * ROWS_P + tl.arange(0, ROWS_P))[:, None]
        cols = offs[None, :]
        inb = (cols < N) & (rows < R)
        g = tl.load(G + rows * N + cols, mask=inb, other=0.0).to(tl.float32)
        y = tl.load(Yp + rows * N + cols, mask=inb, other=0.0).to(tl.float32)
        dot = tl.sum(g * y, axis=1)[:, None]
        gx = scale * y * (g - dot)
        if CAUSAL:
            gx = tl.where(cols <= (rows % SQ) + N - SQ, gx, 0.0)
        tl.store(GX + rows * N + cols, gx.to(GX.dtype.element_ty), mask=inb)
    else:
        row = tl.program_id(0).to(tl.int64)
        dot = tl.zeros((), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            inb = cols < N
            g = tl.load(G + row * N + cols, mask=inb, other=0.0).to(tl.float32)
            y = tl.load(Yp + row * N + cols, mask=inb, other=0.0).to(tl.float32)
            dot += tl.sum(g * y, axis=0)
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            inb = cols < N
            g = tl.load(G + row * N + cols, mask=inb, other=0.0).to(tl.float32)
            y = tl.load(Yp + row * N + cols, mask=inb, other=0.0).to(tl.float32)
            gx = scale * y * (g - dot)
            if CAUSAL:
                gx = tl.where(cols <= (row % SQ) + N - SQ, gx, 0.0)
            tl.store(GX + row * N + cols, gx.to(GX.dtype.element_ty), mask=inb)


def _config(n: int) -> tuple[bool, int, int, int]:
    """(single pass?, rows per program, BLOCK_N, num_warps) for rows of n.

    Short rows share a program: TILE elements of whole rows (4 rows of 512 = a warp per row), so
    the reductions stay inside a warp and each thread holds 16 contiguous elements (128-bit
    loads in bf16 as in fp32); one row of 512 per 4-warp program gave 64-bit bf16 loads and a
    shared-memory round trip per reduction.
    """
    if n <= SINGLE_MAX:
        block = triton.next_power_of_2(max(n, 1))
        rows_p = max(1, min(64, TILE // block))
        return True, rows_p, block, 4 if block <= 2048 else 8 if block <= 4096 else 16
    return False, 1, BLOCK, 8


def _mask_4d(mask: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, tuple[int, ...], int]:
    """The expanded mask as 4-D (leading dims padded or folded) with its strides, and dim 1's size."""
    nd = len(shape)
    if nd <= 4:
        m4 = mask[(None,) * (4 - nd)]  # [..] -> [1, .., S_q, S_k], broadcast strides kept
    else:
        m4 = mask.reshape(-1, *shape[-3:])  # folds leading dims (copies only if it must)
    return m4, tuple(m4.stride()), m4.shape[1]


def softmax_fwd(x: torch.Tensor, mask: torch.Tensor | None, out: torch.Tensor, scale: float,
                causal: bool) -> None:
    """out = softmax(x * scale + mask) over the last dim, causal over the last two; x contiguous."""
    if x.numel() == 0:
        return
    n = x.shape[-1]
    rows, sq = x.numel() // n, (x.shape[-2] if x.dim() >= 2 else 1)
    single, rows_p, block, warps = _config(n)
    if mask is not None:
        m4, (s0, s1, s2, s3), d1 = _mask_4d(mask, x.shape)
    else:
        m4, (s0, s1, s2, s3), d1 = x, (0, 0, 0, 0), 1
    _fwd_kernel[(triton.cdiv(rows, rows_p),)](x, m4, out, rows, n, sq, d1, s0, s1, s2, s3, float(scale),
                                              HAS_MASK=mask is not None, CAUSAL=bool(causal), SINGLE=single,
                                              ROWS_P=rows_p, BLOCK_N=block, num_warps=warps)


def softmax_bwd(grad: torch.Tensor, y: torch.Tensor, grad_x: torch.Tensor, scale: float,
                causal: bool) -> None:
    """grad_x = scale * y * (grad - sum(grad * y)), zero at causally hidden keys."""
    if y.numel() == 0:
        return
    n = y.shape[-1]
    rows, sq = y.numel() // n, (y.shape[-2] if y.dim() >= 2 else 1)
    single, rows_p, block, warps = _config(n)
    _bwd_kernel[(triton.cdiv(rows, rows_p),)](grad, y, grad_x, rows, n, sq, float(scale), CAUSAL=bool(causal),
                                              SINGLE=single, ROWS_P=rows_p, BLOCK_N=block, num_warps=warps)
