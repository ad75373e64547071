"""Triton GELU / bias + GELU / SwiGLU / GeGLU, forward and backward (the CUDA `triton` provider).

The launchers have the signatures of the C++ ops in `kernels/csrc/activations.cpp`
(`act_fwd`, `act_bwd`, `glu_fwd`, `glu_bwd`), so `kernels.activations` drives both providers.
Activation codes: 0 silu, 1 gelu (erf), 2 gelu (tanh). Math in fp32, one rounding on store.

act(x [+ bias]) runs on [M, N] tiles (N = the bias dim): each program handles BLOCK_M x BLOCK_N,
the tiles numbered along ONE grid axis (CUDA caps axes 1 and 2 at 65535 programs, which a 2-D grid
of column tiles would pass once N > 16.7M, e.g. a large 1-D input without bias), and in backward writes one fp32 partial of the bias gradient per row tile ([cdiv(M, BLOCK_M), N],
summed afterwards), so the bias gradient costs no second pass over grad_x. The gated units are
flat elementwise over contiguous a and b, and run on the same [M, N] tiles when a or b is the
row-strided half of one fused projection (`h.chunk(2, -1)`: [M, N] with its own row stride),
read in place. Memory traffic per element: act fwd 2 (+bias), bwd 3; glu fwd 3, bwd 5.

Interpreter-safe (TRITON_INTERPRET=1): no methods on scalar arguments, and GELU (tanh) written as
x * sigmoid(2u) with tl.exp (tl.math has no tanh in every Triton version; this form also needs one
exp in backward and has no 1 + tanh(u) cancellation for x < 0).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK = 16, 256, 1024


@triton.jit
def _act(x, KIND: tl.constexpr):
    if KIND == 0:
        y = x / (1.0 + tl.exp(-x))
    elif KIND == 1:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    else:
        # 0.5 (1 + tanh(u)) = sigmoid(2u): one exp, and no 1 + tanh(u) cancellation for x < 0
        y = x / (1.0 + tl.exp(-2.0 * (0.7978845608028654 * (x + 0.044715 * x * x * x))))
    return y


@triton.jit
def _sigmoid_slope(z):
    """(sigmoid(z), sigmoid(z) * sigmoid(-z)) from one exp, with no 1 - s difference: with
    e = exp(-|z|) and d = 1 / (1 + e), sigmoid(|z|) = d, sigmoid(-|z|) = e * d, and the slope is
    their product whatever the sign. 1 - s as a difference is 0 or 2^-24 wherever s rounds near 1,
    a one-signed error that row sums (a bias gradient) keep (docs/kernels.md)."""
    e = tl.exp(-tl.abs(z))
    d = 1.0 / (1.0 + e)
    small = e * d
    return tl.where(z >= 0, d, small), d * small


@triton.jit
def _act_grad(x, KIND: tl.constexpr):
    """(act(x), act'(x))."""
    if KIND == 0:
        s, slope = _sigmoid_slope(x)
        y = x * s
        dy = s + x * slope
    elif KIND == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        y = x * cdf
        dy = cdf + x * 0.3989422804014327 * tl.exp(-0.5 * x * x)
    else:
        # 0.5 (1 + tanh(u)) = sigmoid(2u) and 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u): one exp for
        # both, no cancellation
        x2 = x * x
        s, slope = _sigmoid_slope(1.5957691216057308 * (x + 0.044715 * x2 * x))  # 2u
        y = x * s
        dy = s + 2.0 * x * slope * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x2)
    return y, dy


def _grid(m: int, n: int) -> tuple[int]:
    """One program per BLOCK_M x BLOCK_N tile, all on grid axis 0 (limit 2**31 - 1)."""
    return (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N),)


@triton.jit
def _tile(N, BM: tl.constexpr, BN: tl.constexpr):
    """(row-tile index, rows, cols) of this program; tiles are numbered row-major."""
    pid = tl.program_id(0).to(tl.int64)
    tiles_n = (N + BN - 1) // BN
    pid_m = pid // tiles_n
    return pid_m, pid_m * BM + tl.arange(0, BM), (pid % tiles_n) * BN + tl.arange(0, BN)


@triton.jit
def _act_fwd_kernel(X, Bias, Y, M, N, KIND: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr):
    _, rows, cols = _tile(N, BM, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x = x + tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs, _act(x, KIND).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _act_bwd_kernel(G, X, Bias, GX, P, M, N, KIND: tl.constexpr, HAS_BIAS: tl.constexpr,
                    WANT_DB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid_m, rows, cols = _tile(N, BM, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x = x + tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    _, dy = _act_grad(x, KIND)
    gx = tl.where(mask, g * dy, 0.0)
    tl.store(GX + offs, gx.to(GX.dtype.element_ty), mask=mask)
    if WANT_DB:
        tl.store(P + pid_m * N + cols, tl.sum(gx, axis=0), mask=cols < N)


@triton.jit
def _glu_fwd_kernel(A, B, Y, numel, KIND: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (_act(a, KIND) * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(G, A, B, GA, GB, numel, KIND: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    y, dy = _act_grad(a, KIND)
    tl.store(GA + offs, (g * b * dy).to(GA.dtype.element_ty), mask=mask)
    tl.store(GB + offs, (g * y).to(GB.dtype.element_ty), mask=mask)


@triton.jit
def _glu_rows_fwd_kernel(A, B, Y, M, N, SA, SB, KIND: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The row-strided form: a and b are [M, N] with row strides SA and SB; y is contiguous."""
    _, rows, cols = _tile(N, BM, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    a = tl.load(A + rows[:, None] * SA + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows[:, None] * SB + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + rows[:, None] * N + cols[None, :], (_act(a, KIND) * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _glu_rows_bwd_kernel(G, A, B, GA, GB, M, N, SA, SB, SGA, SGB, KIND: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr):
    """g contiguous; a, b, grad_a and grad_b [M, N] with row strides SA, SB, SGA and SGB (grad_a and
    grad_b may be the halves of one packed [M, 2N] gradient)."""
    _, rows, cols = _tile(N, BM, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    g = tl.load(G + rows[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + rows[:, None] * SA + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows[:, None] * SB + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y, dy = _act_grad(a, KIND)
    tl.store(GA + rows[:, None] * SGA + cols[None, :], (g * b * dy).to(GA.dtype.element_ty), mask=mask)
    tl.store(GB + rows[:, None] * SGB + cols[None, :], (g * y).to(GB.dtype.element_ty), mask=mask)


def _row_strided(*tensors: torch.Tensor) -> bool:
    """One of them is a [M, N] view with a unit last stride and its own row stride (not contiguous)."""
    return not all(t.is_contiguous() for t in tensors)


def _row_stride(t: torch.Tensor, n: int) -> int:
    return n if t.is_contiguous() else t.stride(0)


def _mn(x: torch.Tensor) -> tuple[int, int]:
    n = x.shape[-1] if x.dim() else 1
    return (x.numel() // n if n else 0), n


def act_fwd(x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, kind: int) -> None:
    """out = act(x [+ bias]); x, bias, out contiguous, one dtype."""
    m, n = _mn(x)
    if x.numel() == 0:
        return
    _act_fwd_kernel[_grid(m, n)](x, bias if bias is not None else x, out, m, n, KIND=kind,
                          HAS_BIAS=bias is not None, BM=BLOCK_M, BN=BLOCK_N)


def act_bwd(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, grad_x: torch.Tensor,
            grad_bias: torch.Tensor | None, kind: int) -> None:
    """grad_x = grad * act'(x [+ bias]); grad_bias (if given) = grad_x summed over rows."""
    m, n = _mn(x)
    if x.numel() == 0:
        if grad_bias is not None:
            grad_bias.zero_()
        return
    tiles_m = triton.cdiv(m, BLOCK_M)
    want_db = grad_bias is not None
    partial = torch.empty((tiles_m, n) if want_db else (1,), dtype=torch.float32, device=x.device)
    _act_bwd_kernel[_grid(m, n)](
        grad, x, bias if bias is not None else x, grad_x, partial, m, n, KIND=kind,
        HAS_BIAS=bias is not None, WANT_DB=want_db, BM=BLOCK_M, BN=BLOCK_N)
    if want_db:
        grad_bias.copy_(partial.sum(0))  # [tiles_m, N] -> [N], then rounded to bias's dtype


def glu_fwd(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, kind: int) -> None:
    """out = act(a) * b, of one shape and dtype; out contiguous, a and b contiguous or [M, N] rows
    with a unit last stride (the C++ op's contract)."""
    if not a.numel():
        return
    if _row_strided(a, b):
        m, n = a.shape
        _glu_rows_fwd_kernel[_grid(m, n)](a, b, out, m, n, a.stride(0), b.stride(0), KIND=kind,
                                          BM=BLOCK_M, BN=BLOCK_N)
        return
    _glu_fwd_kernel[(triton.cdiv(a.numel(), BLOCK),)](a, b, out, a.numel(), KIND=kind, BLOCK_SIZE=BLOCK)


def glu_bwd(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, grad_a: torch.Tensor,
            grad_b: torch.Tensor, kind: int) -> None:
    """grad_a = grad * b * act'(a), grad_b = grad * act(a); a, b, grad_a and grad_b as a and b
    in `glu_fwd` (contiguous or [M, N] rows), grad contiguous."""
    if not a.numel():
        return
    if _row_strided(a, b, grad_a, grad_b):
        m, n = _mn(a)
        _glu_rows_bwd_kernel[_grid(m, n)](grad, a, b, grad_a, grad_b, m, n, _row_stride(a, n), _row_stride(b, n),
                                          _row_stride(grad_a, n), _row_stride(grad_b, n),
                                          KIND=kind, BM=BLOCK_M, BN=BLOCK_N)
        return
    _glu_bwd_kernel[(triton.cdiv(a.numel(), BLOCK),)](grad, a, b, grad_a, grad_b, a.numel(),
                                                       KIND=kind, BLOCK_SIZE=BLOCK)
