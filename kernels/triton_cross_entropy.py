"""Triton cross-entropy row kernels (CUDA; runs under TRITON_INTERPRET=1 for tests).

One program per row of logits [N, V] (unit stride along V), looping over V in BLOCK-wide tiles:
- forward: online max / sum-of-exp (and sum of x for label smoothing) -> loss, log-sum-exp;
- backward: g * (softmax - (1 - eps) onehot - eps / V) from the logits and the saved pair
  (max, log sum exp(x - max)) [N, 2] (softmax = exp(x - max) / sum: one fp32 lse would round at
  its own magnitude); an ignored row gets 0, or NaN where its softmax is NaN (eager's);
- fused_: forward then the gradient written over the logits (the chunked linear + CE).
Traffic per row: forward reads V elements; backward reads V and writes V; fused reads 2V and
writes V. All math in fp32. Targets must be in [0, V) or ignore_index: checking them on the host
would synchronise the GPU, and `tl.device_assert` compiles to nothing outside Triton's debug mode,
so a row whose target is outside that range reads nothing out of bounds and gets a NaN loss and a
NaN gradient row instead (eager's CUDA kernel stops the process with a device-side assert).

When V is not a multiple of 16 (GPT-2's 50257), rows start off 16-byte boundaries and the compiler
can only emit scalar loads; then (PEEL, decided on the host for aligned buffers) each row's few
elements before its boundary go first, whole tiles follow unmasked from an alignment-hinted
pointer (128-bit loads), and the tail is masked.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.registry import triton_interpreted


@triton.jit
def _online(x, mask, m, s, sum_x):
    """One tile of the online softmax: the running max m, sum of exp s, and sum of x (valid lanes)."""
    new_m = tl.maximum(m, tl.max(tl.where(mask, x, float("-inf")), axis=0))
    finite = new_m != float("-inf")
    alpha = tl.where(finite, tl.exp(m - new_m), 1.0)
    e = tl.where(mask, tl.exp(x - new_m), 0.0)
    e = tl.where(finite, e, 0.0)
    return new_m, s * alpha + tl.sum(e, axis=0), sum_x + tl.sum(tl.where(mask, x, 0.0), axis=0)


@triton.jit
def _head(row_off, V, VEC: tl.constexpr):
    """Elements before the row's first 16-byte boundary (the row starts row_off elements into a
    16-byte-aligned buffer; VEC elements make 16 bytes)."""
    return tl.minimum((VEC - row_off % VEC) % VEC, V)


@triton.jit
def _row_stats(x_row, row_off, V, t, eps, BLOCK: tl.constexpr, PEEL: tl.constexpr, VEC: tl.constexpr):
    """(max, log_sum, loss) of one row: online softmax over BLOCK-wide tiles.

    PEEL (rows not 16-byte aligned, e.g. GPT-2's 50257 columns): the few elements before the
    row's first 16-byte boundary go first, then whole tiles from that boundary without a mask
    (the compiler is told the alignment: 128-bit loads), then the masked tail. Without it a row
    that is not provably aligned is read with scalar loads."""
    m = float("-inf")
    s = 0.0
    sum_x = 0.0
    if PEEL:
        head = _head(row_off, V, VEC)
        hoffs = tl.arange(0, VEC)
        hmask = hoffs < head
        m, s, sum_x = _online(tl.load(x_row + hoffs, mask=hmask, other=float("-inf")).to(tl.float32), hmask,
                              m, s, sum_x)
        body = tl.multiple_of(x_row + head, 16)
        n_body = V - head
        full = (n_body // BLOCK) * BLOCK
        every = tl.full([BLOCK], 1, tl.int1)
        for start in range(0, full, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(body + offs).to(tl.float32)
            m, s, sum_x = _online(x, every, m, s, sum_x)
        offs = full + tl.arange(0, BLOCK)
        mask = offs < n_body
        m, s, sum_x = _online(tl.load(body + offs, mask=mask, other=float("-inf")).to(tl.float32), mask,
                              m, s, sum_x)
    else:
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
            m, s, sum_x = _online(x, mask, m, s, sum_x)
    log_sum = tl.log(s)
    xt = tl.load(x_row + t, mask=(t >= 0) & (t < V), other=float("nan")).to(tl.float32)  # bad target: NaN
    loss = (m - xt) + log_sum + eps * (xt - sum_x / V)  # no term rounded at lse's magnitude
    return m, log_sum, loss


@triton.jit
def _ignored_fill(m, log_sum):
    """An ignored row's gradient: 0, or NaN when its softmax is NaN (eager's softmax * 0)."""
    bad = (m != m) | (log_sum != log_sum) | (tl.abs(m) == float("inf")) | (tl.abs(log_sum) == float("inf"))
    return tl.where(bad, float("nan"), 0.0)


@triton.jit
def _ce_forward_kernel(x_ptr, stride_row, t_ptr, loss_ptr, lse_ptr, V, ignore_index, eps,
                       BLOCK: tl.constexpr, PEEL: tl.constexpr, VEC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ignored = t == ignore_index
    m, log_sum, loss = _row_stats(x_ptr + row * stride_row, row * stride_row, V, tl.where(ignored, 0, t), eps,
                                  BLOCK, PEEL, VEC)
    tl.store(lse_ptr + 2 * row, m)
    tl.store(lse_ptr + 2 * row + 1, log_sum)
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))


@triton.jit
def _grad_tile(x_row, out_row, offs, mask, V, t, m, log_sum, eps, g, ignored, fill, MASKED: tl.constexpr):
    if MASKED:
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.load(x_row + offs).to(tl.float32)
    grad = (g * tl.exp(-log_sum)) * tl.exp(x - m) - g * eps / V - tl.where(offs == t, g * (1.0 - eps), 0.0)
    grad = tl.where(ignored, fill, grad)
    if MASKED:
        tl.store(out_row + offs, grad, mask=mask)
    else:
        tl.store(out_row + offs, grad)


@triton.jit
def _row_grad(x_row, out_row, row_off, V, t, m, log_sum, eps, g, ignored, BLOCK: tl.constexpr,
              PEEL: tl.constexpr, VEC: tl.constexpr):
    """The gradient of one row. PEEL as in `_row_stats`; x and out rows share their alignment
    (the host peels only contiguous logits whose gradient has the same layout)."""
    fill = _ignored_fill(m, log_sum)
    if PEEL:
        head = _head(row_off, V, VEC)
        hoffs = tl.arange(0, VEC)
        _grad_tile(x_row, out_row, hoffs, hoffs < head, V, t, m, log_sum, eps, g, ignored, fill, True)
        xb = tl.multiple_of(x_row + head, 16)
        ob = tl.multiple_of(out_row + head, 16)
        n_body = V - head
        full = (n_body // BLOCK) * BLOCK
        for start in range(0, full, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            _grad_tile(xb, ob, offs, offs < n_body, V, t - head, m, log_sum, eps, g, ignored, fill, False)
        offs = full + tl.arange(0, BLOCK)
        _grad_tile(xb, ob, offs, offs < n_body, V, t - head, m, log_sum, eps, g, ignored, fill, True)
    else:
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            _grad_tile(x_row, out_row, offs, offs < V, V, t, m, log_sum, eps, g, ignored, fill, True)


@triton.jit
def _ce_backward_kernel(x_ptr, stride_row, t_ptr, lse_ptr, g_ptr, out_ptr, V, ignore_index, eps,
                        BLOCK: tl.constexpr, PEEL: tl.constexpr, VEC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ignored = t == ignore_index
    g = tl.where((t >= 0) & (t < V), tl.load(g_ptr + row), float("nan"))  # a bad target's row: NaN
    _row_grad(x_ptr + row * stride_row, out_ptr + row * V, row * V, V, t, tl.load(lse_ptr + 2 * row),
              tl.load(lse_ptr + 2 * row + 1), eps, g, ignored, BLOCK, PEEL, VEC)


@triton.jit
def _ce_fused_kernel(x_ptr, t_ptr, loss_ptr, V, ignore_index, eps, scale, BLOCK: tl.constexpr,
                     PEEL: tl.constexpr, VEC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    ignored = t == ignore_index
    x_row = x_ptr + row * V
    m, log_sum, loss = _row_stats(x_row, row * V, V, tl.where(ignored, 0, t), eps, BLOCK, PEEL, VEC)
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))
    g = tl.where((t >= 0) & (t < V), scale, float("nan"))  # a bad target's row: NaN
    _row_grad(x_row, x_row, row * V, V, t, m, log_sum, eps, g, ignored, BLOCK, PEEL, VEC)


def _launch_args(v: int) -> dict:
    block = min(triton.next_power_of_2(max(v, 1)), 64 if triton_interpreted() else 8192)
    return {"BLOCK": block} if triton_interpreted() else {"BLOCK": block, "num_warps": 16 if block >= 4096 else 4}


def _peel(v: int, *tensors, rows_match: bool = True) -> dict:
    """PEEL / VEC for rows of v: peel when v is not a multiple of 16 (Triton marks an int argument
    aligned only at 16), every buffer starts on a 16-byte boundary, and the buffers' rows share
    their offsets (rows_match), so each row's boundary is found from its offset alone."""
    vec = 16 // tensors[0].element_size()
    peel = rows_match and v % 16 != 0 and all(t.data_ptr() % 16 == 0 for t in tensors)
    return {"PEEL": peel, "VEC": vec}


def forward(logits, target, ignore_index, eps, loss_rows, lse) -> None:
    n, v = logits.shape
    _ce_forward_kernel[(n,)](logits, logits.stride(0), target, loss_rows, lse, v, ignore_index,
                             float(eps), **_launch_args(v), **_peel(v, logits))


def backward(logits, target, lse, grad_rows, ignore_index, eps, grad) -> None:
    n, v = logits.shape
    # The rows of grad (contiguous, stride v) share the logits rows' offsets only when the logits
    # are contiguous too.
    _ce_backward_kernel[(n,)](logits, logits.stride(0), target, lse, grad_rows, grad, v,
                              ignore_index, float(eps), **_launch_args(v),
                              **_peel(v, logits, grad, rows_match=logits.stride(0) == v))


def fused_(logits, target, ignore_index, eps, scale, loss_rows) -> None:
    n, v = logits.shape
    if not logits.is_contiguous():
        raise ValueError("triton cross_entropy fused_: logits chunk must be contiguous")
    _ce_fused_kernel[(n,)](logits, target, loss_rows, v, ignore_index, float(eps), float(scale),
                           **_launch_args(v), **_peel(v, logits))
