"""Chunked fused linear + cross-entropy: the loss of `x @ W.T + b` without the [N, V] logits.

For a language-model head the logits dominate training memory: 4096 tokens x 32000 vocab is
524 MB in fp32, and eager `F.cross_entropy(x @ W.T + b, t)` keeps the logits, a log-prob tensor
of the same size, and materialises two more in backward. Following Liger-Kernel's
FusedLinearCrossEntropy, the forward pass walks the tokens in chunks; per chunk it computes the
logits [c, V], overwrites them in place with d loss / d logits (the row kernel of
`kernels.cross_entropy_rows`), and immediately turns them into dx[chunk] = G @ W and
dW += G.T @ x[chunk], db += G.sum(0). Peak extra memory is one [c, V] chunk plus dx and dW;
backward only scales the stored gradients by the upstream gradient.

Reductions "mean" and "sum" (not "none": per-row upstream gradients are unknown during forward),
`ignore_index`, `label_smoothing`. x [..., H], target [...], weight [V, H], bias [V] or None.
Without gradients (no_grad / inference) the chunks compute the loss only.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from kernels.arguments import typed_arguments
from kernels.double_backward import create_graph, refuse
from kernels.cross_entropy_rows import ROW_OPS, CrossEntropyError, cast_output, validate
from kernels.registry import FLOAT_DTYPES, Cost, KernelSpec, Supports, dispatch, has_data, new_output, register_kernel


def default_chunk_size(n_tokens: int, hidden: int, vocab: int) -> int:
    """Liger's heuristic: a chunk's logits about the size of x, rounded up to a power of two.
    (On a CPU thicker chunks run faster GEMMs, 2048 x 768 -> 32000 at 1 thread: 64-token chunks
    4.41 s fwd+bwd, 128 4.22 s, 256 3.79 s, but each doubling adds a chunk to the peak memory,
    which is the point of this kernel; pass chunk_size to trade.)"""
    ratio = max(1, math.ceil(vocab / max(hidden, 1)))
    return max(1, min(n_tokens, 1 << max(0, math.ceil(math.log2(math.ceil(n_tokens / ratio)))))) if n_tokens else 1


def _mm(a, b, bias=None, out=None):
    """a [m, k] @ b [k, n] (+ bias [n]), into `out` when given.

    A bf16 product with k = 1 on the CPU is computed as the outer product it is, in fp32 and
    rounded once, as the GEMM would round it: torch 2.13's oneDNN (v3.12) corrupts the heap when
    bf16 matmuls with k = 1 and with k > 1 run while its primitive cache evicts (a pure-torch
    repro: tests/kernels/repro_onednn_bf16_k1.py). A 1-row chunk makes dW's GEMM one of those.
    """
    if a.shape[1] == 1 and a.dtype == torch.bfloat16 and a.device.type == "cpu":
        prod = a.float() * b.float()  # [m, 1] * [1, n] -> [m, n], exact in fp32
        if bias is not None:
            prod = prod + bias.float()
        if out is None:  # row-major as the GEMM's (prod keeps a's strides, even a size-1 dim's)
            out = torch.empty(prod.shape, dtype=a.dtype, device=a.device)
        return out.copy_(prod)
    if out is not None:
        return torch.mm(a, b, out=out) if bias is None else torch.addmm(bias, a, b, out=out)
    return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)


def _chunked(x, weight, bias, target, ignore_index, eps, reduction, chunk_size, provider,
             need_dx, need_dw, need_db):
    """Loss (fp32 scalar), where needed dx [N, H], dW [V, H], db [V] for a unit upstream grad, and
    the factor those grads still need (None: already applied).

    Eager on the CPU: the mean's 1/n_valid goes into the kernel (the count is read on the host).
    Under torch.compile, for fake tensors and on GPUs the count stays a tensor: the graph does not
    break, and a GPU neither stalls its launch queue on a host read every call nor refuses a CUDA
    graph capture. The kernel then scales by 1 and the factor is applied in backward, where the
    upstream grad multiplies the grads anyway.
    """
    ops = ROW_OPS[provider]
    n, _ = x.shape
    factor = None
    if reduction != "mean":
        scale = 1.0
    elif not has_data(target) or target.device.type != "cpu":  # compile, fake tensors, GPUs
        n_valid = (target != ignore_index).sum().to(torch.float32)
        factor, scale = torch.where(n_valid > 0, 1.0 / n_valid, 0.0), 1.0
    else:
        n_valid = int((target != ignore_index).sum())
        scale = 1.0 / n_valid if n_valid else 0.0
    want_grad = need_dx or need_dw or need_db
    acc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    dx = new_output(x.shape, x) if need_dx else None  # poisonable: every chunk must write its rows
    dw = torch.zeros(weight.shape, dtype=acc, device=x.device) if need_dw else None
    db = torch.zeros(weight.shape[0], dtype=acc, device=x.device) if need_db else None
    # summed out of place: torch 2.11's Dynamo loses the grad of a Function returning a tensor it
    # mutated in place (see cast_output)
    loss_sum = torch.zeros((), dtype=torch.float32, device=x.device)
    for s in range(0, n, chunk_size):
        e = min(n, s + chunk_size)
        xc, tc = x[s:e], target[s:e]  # [c, H], [c]
        logits = _mm(xc, weight.t(), bias)
        if not want_grad:
            loss_sum = loss_sum + ops.forward(logits, tc, ignore_index, eps)[0].sum()
            continue
        loss_sum = loss_sum + ops.fused_(logits, tc, ignore_index, eps, scale).sum()  # logits -> G [c, V]
        if dx is not None:
            _mm(logits, weight, out=dx[s:e])
        if dw is not None:
            if dw.dtype == logits.dtype:
                dw.addmm_(logits.t(), xc)
            else:
                dw += _mm(logits.t(), xc).to(acc)
        if db is not None:
            db += logits.sum(0, dtype=acc)
        del logits
    if reduction != "mean":
        loss = loss_sum
    elif factor is not None:
        loss = loss_sum / n_valid  # 0 / 0 = NaN with every target ignored, as eager
    else:
        loss = loss_sum / n_valid if n_valid else torch.full_like(loss_sum, float("nan"))
    return loss, dx, dw, db, factor


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, target, ignore_index, eps, reduction, chunk_size, provider,
                loss_dtype):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [N, H]
        t2 = target.reshape(-1).to(torch.long).contiguous()  # [N]
        needs = ctx.needs_input_grad
        loss, dx, dw, db, factor = _chunked(x2, weight, bias, t2, ignore_index, eps, reduction,
                                            chunk_size, provider, needs[0], needs[1],
                                            bias is not None and needs[2])
        ctx.save_for_backward(dx, dw, db, factor)
        ctx.meta = (shape, weight.dtype, None if bias is None else bias.dtype)
        return cast_output(loss, loss_dtype or x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        if create_graph():  # the forward computed the grads: nothing here is differentiable in x
            refuse("fused_linear_cross_entropy")
        dx, dw, db, factor = ctx.saved_tensors
        shape, w_dtype, b_dtype = ctx.meta
        if factor is not None:
            grad_out = grad_out * factor
        # skip the scaling pass for the usual loss.backward(); a traced, fake or batched grad_out
        # has no one value to test on the host
        unit = factor is None and grad_out.device.type == "cpu" and has_data(grad_out) and bool(grad_out == 1)

        def scaled(g, dtype):
            if g is None:
                return None
            return (g if unit else g * grad_out.to(g.dtype)).to(dtype)

        gx = scaled(dx, dx.dtype if dx is not None else None)
        return (None if gx is None else gx.view(shape), scaled(dw, w_dtype), scaled(db, b_dtype),
                None, None, None, None, None, None, None)


def _validate(x, weight, target, bias, ignore_index, label_smoothing, reduction, chunk_size):
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise CrossEntropyError(f"fused_linear_cross_entropy: x [..., H] and weight [V, H] expected, "
                                f"got {tuple(x.shape)} and {tuple(weight.shape)}")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise CrossEntropyError(f"fused_linear_cross_entropy: target {tuple(target.shape)} must match "
                                f"x's leading dims {tuple(x.shape[:-1])}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise CrossEntropyError(f"fused_linear_cross_entropy: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    mixed = x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype)
    if mixed and not torch.is_autocast_enabled(x.device.type):  # autocast casts all three, as eager's
        raise CrossEntropyError(f"fused_linear_cross_entropy: x, weight and bias must share a dtype "
                                f"(x {x.dtype}, weight {weight.dtype})")
    if reduction == "none":
        raise CrossEntropyError("fused_linear_cross_entropy: reduction='none' is not supported "
                                "(use 'mean' or 'sum')")
    if chunk_size is not None and int(chunk_size) < 1:
        raise CrossEntropyError(f"fused_linear_cross_entropy: chunk_size must be >= 1, got {chunk_size}")
    logits_shape = torch.empty((int(math.prod(x.shape[:-1])), weight.shape[0]), device="meta")
    validate(logits_shape, target.reshape(-1), ignore_index, label_smoothing, reduction)


def _reference(x, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
               reduction="mean", chunk_size=None):
    """The unfused eager chain: full logits, then F.cross_entropy."""
    logits = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)  # [N, V]
    return F.cross_entropy(logits, target.reshape(-1), ignore_index=ignore_index,
                           label_smoothing=label_smoothing, reduction=reduction)


def _provider(provider: str):
    def run(x, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
            reduction="mean", chunk_size=None):
        n = int(math.prod(x.shape[:-1]))
        c = int(chunk_size) if chunk_size else default_chunk_size(n, weight.shape[1], weight.shape[0])
        device = x.device.type
        if torch.is_autocast_enabled(device):
            # As eager under autocast: F.linear runs in the autocast dtype, F.cross_entropy in fp32.
            # The casts are autograd's (grads come back in the leaves' dtypes); inside, autocast is
            # off, or it would recast the chunk matmuls' `out=` buffers.
            dt = torch.get_autocast_dtype(device)
            x, weight = x.to(dt), weight.to(dt)
            bias = bias.to(dt) if bias is not None else None
            with torch.autocast(device, enabled=False):
                return _FusedLinearCrossEntropy.apply(x, weight, bias, target, ignore_index, float(label_smoothing),
                                                      reduction, c, provider, torch.float32)
        return _FusedLinearCrossEntropy.apply(x, weight, bias, target, ignore_index,
                                              float(label_smoothing), reduction, c, provider, None)

    run.__name__ = f"fused_linear_cross_entropy_{provider}"
    return run


def _cost(x, weight, target, bias=None, *args, chunk_size=None, **kwargs) -> Cost:
    """Forward + backward bytes at op boundaries (a unit upstream gradient), [N, V] logits dominant.

    Fused, per chunk: logits written (mm), read and overwritten with d loss / d logits (1 + 2),
    read by the dx and dW matmuls (+ the db sum): 5 (6 with bias) passes over N x V in all, but
    never N x V at once. W is read twice per chunk and the fp32 (or fp64) dW accumulator read and
    written per chunk (below fp32 the chunk's dW is also written, cast and added). Unfused eager: logits (1), log_softmax (2), NLL (1), NLL backward (1),
    log_softmax backward (3), dx and dW matmuls (2) (+ db): 10 (11) passes over the full N x V.
    Both read x twice and write dx; eager reads W twice and writes dW once.
    """
    n, h, v = int(math.prod(x.shape[:-1])), x.shape[-1], weight.shape[0]
    es = x.element_size()
    acc = 4 if es < 4 else es
    has_b = bias is not None
    k = math.ceil(n / (int(chunk_size) if chunk_size else default_chunk_size(n, h, v))) if n else 0
    nv, nh, vh = n * v * es, n * h * es, v * h * es
    # dW per chunk: addmm_ into it (read + write), or below fp32 mm -> cast -> add_ into fp32
    dw_chunk = 2 * v * h * acc if es == acc else v * h * (2 * es + 4 * acc)
    fused = (5 + has_b) * nv + 3 * nh + 2 * k * vh + k * dw_chunk + has_b * (k * v * es + 2 * k * v * acc)
    unfused = (10 + has_b) * nv + 3 * nh + 3 * vh + has_b * 2 * v * es
    return Cost(flops=6.0 * n * h * v + 6.0 * n * v, bytes_fused=float(fused), bytes_unfused=float(unfused))


MEASURE_CHUNKS = 8  # token chunks a provider decision times (see _measure_call)


def _measure_call(args: tuple, kwargs: dict) -> tuple | None:
    """The provider decision's cheaper call: the first MEASURE_CHUNKS token chunks, at the full
    call's chunk size. Every chunk does the same work (its logits, softmax, dx rows and dW
    accumulation), so the providers rank on a few chunks as on all of them; timing the whole
    call (2048 x 768 -> 32000 on 1 CPU thread: 5 s, a warm-up and a timed call per provider)
    made a first call wait 28 s. None under 2 x MEASURE_CHUNKS chunks: the call itself is timed."""
    bound = inspect.signature(_reference).bind(*args, **kwargs)  # the dispatch arguments, by name
    bound.apply_defaults()
    call = dict(bound.arguments)
    x, weight, target = call.pop("x"), call.pop("weight"), call.pop("target")
    n, h, v = int(math.prod(x.shape[:-1])), x.shape[-1], weight.shape[0]
    c = int(call["chunk_size"]) if call["chunk_size"] else default_chunk_size(n, h, v)
    keep = MEASURE_CHUNKS * c
    if n < 2 * keep or target.numel() != n:
        return None
    small = (x.reshape(n, h)[:keep], weight, target.reshape(n)[:keep])
    note = f"timed on the first {keep} of {n} tokens ({MEASURE_CHUNKS} chunks of {c})"
    return small, {**call, "chunk_size": c}, note


SPEC = register_kernel(KernelSpec(
    name="fused_linear_cross_entropy",
    reference=_reference,
    providers={"cpu": _provider("cpu"), "triton": _provider("triton"), "aten": _provider("aten")},
    supports=Supports(dtypes=FLOAT_DTYPES),
    cost=_cost,
    description="linear + cross-entropy in token chunks; the [N, V] logits never exist",
    func_safe=(),  # its aten provider is a chunked autograd.Function too
    reference_measured=False,  # the unfused chain can be faster, but holds the [N, V] logits
    measure_call=_measure_call,
))


@typed_arguments
def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: torch.Tensor | None = None, chunk_size: int | None = None, *,
                               ignore_index: int = -100, label_smoothing: float = 0.0,
                               reduction: str = "mean", provider: str | None = None) -> torch.Tensor:
    """cross_entropy(x @ weight.T + bias, target) without materialising the logits.

    Args: x [..., H]; weight [V, H]; target [...] class indices; bias [V] or None; chunk_size:
    tokens per chunk (default: Liger's heuristic, about H/V of the tokens).
    Returns the scalar loss in x's dtype.
    """
    _validate(x, weight, target, bias, ignore_index, label_smoothing, reduction, chunk_size)
    return dispatch("fused_linear_cross_entropy", x, weight, target, bias,
                    ignore_index=ignore_index, label_smoothing=label_smoothing,
                    reduction=reduction, chunk_size=chunk_size, provider=provider)


class FusedLinearCrossEntropyLoss(nn.Module):
    """Module form: loss = module(x, weight, target, bias)."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean", chunk_size: int | None = None,
                 provider: str | None = None) -> None:
        super().__init__()
        self.kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing,
                       reduction=reduction, chunk_size=chunk_size, provider=provider)

    def forward(self, x, weight, target, bias=None):
        return fused_linear_cross_entropy(x, weight, target, bias, **self.kw)
