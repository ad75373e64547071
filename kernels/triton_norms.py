"""Triton LayerNorm / RMSNorm (optionally fused with a residual add), forward and backward.

The launchers have the same signatures as the C++ ops in `kernels/csrc/norms.cpp`, so
`kernels.norms._FusedNorm` drives both providers. One program normalizes one row held whole in
registers (BLOCK = next power of two >= N, so N <= MAX_N). Backward: each of G programs walks a
contiguous block of rows, accumulates its weight/bias gradient partial in fp32 registers and
writes one [N] partial; the partials are then summed over G (a [G, N] reduction, G ~ SM count).

Memory traffic per forward row (the roofline number, see norms._norm_cost): read x (and the
residual), write y (and the sum), plus 8 bytes of stats. Backward: read dy, x (and the sum's
gradient), write dx, plus G*N*4 bytes of partials.

Interpreter-safe (TRITON_INTERPRET=1): no methods are called on scalar arguments, loops use masks
instead of data-dependent bounds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_N = 65536


def _block(n: int, backward: bool = False) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of n elements.

    The backward holds five row-long fp32 values a thread (x, dy, w, two weight-grad sums): at
    BLOCK 16384 with 16 warps sm_90 spills 1.7-2.0 KB a thread inside the row loop, with 32 warps
    120-476 bytes (compiled ahead of time, tests/kernels/triton_aot.py), so it takes 32 there.
    Below that nothing aligned spills; which warp count runs fastest is measured by the GPU
    check's sweep (benchmarks/kernels/norms_warps.py).
    """
    if n > MAX_N:
        raise ValueError(f"triton norms hold one row in registers: last dim {n} > {MAX_N}")
    block = triton.next_power_of_2(max(n, 1))
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16 if block <= 32768 else 32
    if backward and block >= 16384:
        warps = 32
    return block, warps


def _programs(m: int, device: torch.device) -> int:
    """Programs for the backward row walk: a few per SM on CUDA, a handful when interpreted."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(m, 4 * sms))
    return max(1, min(m, 4))


@triton.jit
def _ln_fwd(X, R, S, Y, W, B, Mean, Rstd, N, eps, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
            HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(S.dtype.element_ty)  # the rounded sum: an output, and what the norm reads
        tl.store(S + row * N + cols, s, mask=mask)
        x = s.to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    d = tl.where(mask, x - mean, 0.0)
    # The mean in two parts, mean + c (as the C++ kernels): x - mean is exact near the mean, and
    # the rest c = sum(d) / N is subtracted after the scaling instead of rounded into the mean
    # (at a large common offset that rounding was the whole of the error of y, dx and dw).
    c = tl.sum(d, axis=0) / N
    var = tl.sum(d * d, axis=0) / N - c * c
    var = tl.where(var < 0.0, 0.0, var)  # a NaN stays NaN
    rstd = 1.0 / tl.sqrt(var + eps)
    y = d * rstd - c * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean + c)
    tl.store(Rstd + row, rstd)


@triton.jit
def _ln_bwd(DY, X, W, Mean, Rstd, DA, DX, DWp, DBp, M, N, ROWS, HAS_W: tl.constexpr,
            HAS_DA: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0) if HAS_W else tl.full([BLOCK], 1.0, tl.float32)
    dw_acc = tl.zeros([BLOCK], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, ROWS):
        row = pid * ROWS + i
        live = row < M
        mask = cmask & live
        x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + row, mask=live, other=0.0)
        rstd = tl.load(Rstd + row, mask=live, other=0.0)
        xm = tl.where(mask, x - mean, 0.0)
        c = tl.sum(xm, axis=0) / N  # the saved mean's own rounding, kept apart (see _ln_fwd)
        xhat = tl.where(mask, xm * rstd - c * rstd, 0.0)
        g = dy * w
        c1 = tl.sum(g * xhat, axis=0) / N
        c2 = tl.sum(g, axis=0) / N
        dx = (g - c2 - xhat * c1) * rstd
        if HAS_DA:
            dx = dx + tl.load(DA + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    if NEED_DW:
        tl.store(DWp + pid * N + cols, dw_acc, mask=cmask)
    if NEED_DB:
        tl.store(DBp + pid * N + cols, db_acc, mask=cmask)


@triton.jit
def _rms_fwd(X, R, S, Y, W, Rstd, N, eps, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
             LLAMA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(S.dtype.element_ty)
        tl.store(S + row * N + cols, s, mask=mask)
        x = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    y = x * rstd
    if LLAMA:  # HF Llama: cast the normalized value to the input dtype before the weight (Y may
        y = y.to(X.dtype.element_ty).to(tl.float32)  # be fp32: an fp32 weight promotes)
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def _rms_bwd(DY, X, W, Rstd, DA, DX, DWp, M, N, ROWS, HAS_W: tl.constexpr, HAS_DA: tl.constexpr,
             NEED_DW: tl.constexpr, LLAMA: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0) if HAS_W else tl.full([BLOCK], 1.0, tl.float32)
    dw_acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, ROWS):
        row = pid * ROWS + i
        live = row < M
        mask = cmask & live
        x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row, mask=live, other=0.0)
        g = dy * w
        c1 = tl.sum(g * x, axis=0) * rstd * rstd / N
        dx = (g - x * c1) * rstd
        if HAS_DA:
            dx = dx + tl.load(DA + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=mask)
        nhat = x * rstd
        if LLAMA:
            nhat = nhat.to(DX.dtype.element_ty).to(tl.float32)
        dw_acc += dy * nhat
    if NEED_DW:
        tl.store(DWp + pid * N + cols, dw_acc, mask=cmask)


def _reduce_partials(part: torch.Tensor, out: torch.Tensor) -> None:
    torch.sum(part, dim=0, out=out)


def layer_norm_fwd(x, residual, weight, bias, eps, y, sum_out, mean, rstd, num_warps=None) -> None:
    """Same contract as torch.ops.fusionlens.layer_norm_fwd (x, residual, y, sum_out: [M, N]).

    num_warps overrides the heuristic (for the GPU check's sweep; None: `_block`'s choice)."""
    m, n = x.shape
    block, warps = _block(n)
    warps = num_warps or warps
    _ln_fwd[(m,)](x, residual if residual is not None else x, sum_out if residual is not None else y, y,
                  weight if weight is not None else x, bias if bias is not None else x, mean, rstd,
                  n, eps, HAS_RES=residual is not None, HAS_W=weight is not None,
                  HAS_B=bias is not None, BLOCK=block, num_warps=warps)


def layer_norm_bwd(dy, x, weight, mean, rstd, dadd, dx, dw, db, num_warps=None) -> None:
    """Same contract as torch.ops.fusionlens.layer_norm_bwd (dw, db: fp32 [N] or empty)."""
    m, n = x.shape
    block, warps = _block(n, backward=True)
    warps = num_warps or warps
    g = _programs(m, x.device)
    rows = triton.cdiv(m, g)
    need_dw, need_db = dw.numel() > 0, db.numel() > 0
    dwp = torch.empty((g, n) if need_dw else (0,), dtype=torch.float32, device=x.device)
    dbp = torch.empty((g, n) if need_db else (0,), dtype=torch.float32, device=x.device)
    _ln_bwd[(g,)](dy, x, weight if weight is not None else x, mean, rstd,
                  dadd if dadd is not None else dy, dx, dwp if need_dw else dx, dbp if need_db else dx,
                  m, n, rows, HAS_W=weight is not None, HAS_DA=dadd is not None,
                  NEED_DW=need_dw, NEED_DB=need_db, BLOCK=block, num_warps=warps)
    if need_dw:
        _reduce_partials(dwp, dw)
    if need_db:
        _reduce_partials(dbp, db)


def rms_norm_fwd(x, residual, weight, eps, llama_cast, y, sum_out, rstd, num_warps=None) -> None:
    """Same contract as torch.ops.fusionlens.rms_norm_fwd."""
    m, n = x.shape
    block, warps = _block(n)
    warps = num_warps or warps
    _rms_fwd[(m,)](x, residual if residual is not None else x, sum_out if residual is not None else y, y,
                   weight if weight is not None else x, rstd, n, eps, HAS_RES=residual is not None,
                   HAS_W=weight is not None, LLAMA=bool(llama_cast), BLOCK=block, num_warps=warps)


def rms_norm_bwd(dy, x, weight, rstd, dadd, llama_cast, dx, dw, num_warps=None) -> None:
    """Same contract as torch.ops.fusionlens.rms_norm_bwd."""
    m, n = x.shape
    block, warps = _block(n, backward=True)
    warps = num_warps or warps
    g = _programs(m, x.device)
    rows = triton.cdiv(m, g)
    need_dw = dw.numel() > 0
    dwp = torch.empty((g, n) if need_dw else (0,), dtype=torch.float32, device=x.device)
    _rms_bwd[(g,)](dy, x, weight if weight is not None else x, rstd, dadd if dadd is not None else dy,
                   dx, dwp if need_dw else dx, m, n, rows, HAS_W=weight is not None,
                   HAS_DA=dadd is not None, NEED_DW=need_dw, LLAMA=bool(llama_cast), BLOCK=block,
                   num_warps=warps)
    if need_dw:
        _reduce_partials(dwp, dw)
