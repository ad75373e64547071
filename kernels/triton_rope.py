"""Triton rotate-half RoPE, forward and backward (the CUDA `triton` provider).

`rope_apply(x, cos, sin, out, backward)` has the signature of the C++ op in
`kernels/csrc/rope.cpp`: x is [B, H, S, D] with any strides (last one 1), cos/sin are contiguous
fp32 [B or 1, S, D], out is [B, H, S, D] with its own strides (last one 1; kernels/rope.py gives
it x's layout, as eager does). One program rotates a tile of consecutive
(b, h, s) rows, reading each half of the head dim once: 2 * D elements of traffic per row plus
the (cached) cos/sin rows. backward=True applies the transposed rotation to a gradient.
The tile holds TILE elements of each half (32 rows of a 64-wide head), so each of the 128 threads
owns 8 contiguous elements and sm_90 gets 128-bit loads; with 4 rows a program every thread held
one or two elements and the loads were 32/64-bit (compiled ahead of time: tests/kernels/triton_aot.py).
Interpreter-safe: no methods on scalar arguments.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 1024  # elements of each half-row tile per program


@triton.jit
def _rope_kernel(X, C, Sn, Y, n_rows, H, S, sb, sh, ss, ob, oh, os, cb, HALF,
                 BACKWARD: tl.constexpr, ROWS_P: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS_P + tl.arange(0, ROWS_P)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < HALF)
    s_i = rows % S
    bh = rows // S
    h_i = bh % H
    b_i = bh // H
    xoff = (b_i * sb + h_i * sh + s_i * ss)[:, None] + cols[None, :]
    toff = (b_i * cb + s_i * 2 * HALF)[:, None] + cols[None, :]
    x1 = tl.load(X + xoff, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + xoff + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(C + toff, mask=mask, other=0.0)
    c2 = tl.load(C + toff + HALF, mask=mask, other=0.0)
    s1 = tl.load(Sn + toff, mask=mask, other=0.0)
    s2 = tl.load(Sn + toff + HALF, mask=mask, other=0.0)
    if BACKWARD:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    yoff = (b_i * ob + h_i * oh + s_i * os)[:, None] + cols[None, :]
    tl.store(Y + yoff, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + yoff + HALF, y2.to(Y.dtype.element_ty), mask=mask)


def rope_apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor,
               backward: bool) -> None:
    """out = x * cos + rotate_half(x) * sin (or the transposed rotation when backward)."""
    if x.numel() == 0:
        return
    b, h, s, d = x.shape
    n_rows = b * h * s
    cb = 0 if cos.shape[0] == 1 else s * d  # cos/sin batch stride (0: shared by the batch)
    block_h = triton.next_power_of_2(max(d // 2, 1))
    rows_p = max(1, min(64, TILE // block_h))
    _rope_kernel[(triton.cdiv(n_rows, rows_p),)](
        x, cos, sin, out, n_rows, h, s, x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2), cb, d // 2,
        BACKWARD=bool(backward), ROWS_P=rows_p, BLOCK_H=block_h)
