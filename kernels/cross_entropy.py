"""Fused cross-entropy (log-softmax + NLL in one pass over the logits), forward and backward.

`cross_entropy(logits, target)` with logits [N, V] (class dim last, the language-model layout)
and int targets [N]. Supported: reduction "mean" (default), "sum", "none"; `ignore_index`
(default -100; ignored rows add nothing and are not counted in the mean); `label_smoothing`
(PyTorch's definition). Not supported by the function: class weights, probability targets, the
class dim at 1 of a >2-D input (flatten to [tokens, vocab] first); the module `CrossEntropyLoss`
takes all of nn.CrossEntropyLoss's inputs (see its docstring). float32/bfloat16/float16; the math
is fp32.

Providers: `cpu` (C++, kernels/csrc/cross_entropy.cpp), `triton` (CUDA), `aten`
(`F.cross_entropy`), and the eager `reference` (log_softmax, gather, mean). The fused kernels
keep only the per-row log-sum-exp for backward; the gradient softmax - onehot is recomputed
from the logits in one read + one write.

`fused_linear_cross_entropy` (the chunked linear + cross-entropy) is re-exported from
`kernels.linear_cross_entropy`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.arguments import typed_arguments
from kernels.autocast import LOW_PRECISION
from kernels.cross_entropy_rows import REDUCTIONS, ROW_OPS, CrossEntropyError, cast_output, validate
from kernels.double_backward import eager_backward, vjp_of
from kernels.registry import (FLOAT_DTYPES, Cost, KernelSpec, Supports, dispatch, io_bytes, op_only_cost,
                              register_kernel, register_op_cost)

def reduce_rows(loss_rows: torch.Tensor, valid: torch.Tensor, reduction: str,
                dtype: torch.dtype) -> torch.Tensor:
    """fp32 per-row losses -> the requested reduction, in `dtype` (mean over valid rows)."""
    if reduction == "none":
        out = loss_rows
    elif reduction == "sum":
        out = loss_rows.sum()
    else:
        out = loss_rows.sum() / valid.sum()  # 0 valid rows -> nan, like F.cross_entropy
    return cast_output(out, dtype)


def grad_rows_for(grad_out: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-row scale of d loss / d loss_row for the reduction (fp32 [N]; 0 on ignored rows)."""
    g = grad_out.float()
    if reduction == "mean":
        g = g / valid.sum()
    return torch.where(valid, g.expand(valid.shape), torch.zeros((), dtype=torch.float32, device=g.device))


class _CrossEntropyFunction(torch.autograd.Function):
    """Forward keeps the logits and each row's log-sum-exp (as the provider's backward reads it);
    backward recomputes the softmax."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, reduction, provider, out_dtype):
        ops = ROW_OPS[provider]  # logits have a unit last stride (`_fused`)
        t = target.to(torch.long).contiguous()
        loss_rows, lse = ops.forward(logits, t, ignore_index, float(label_smoothing))
        valid = t != ignore_index
        ctx.save_for_backward(logits, t, lse, valid)
        ctx.args = (ignore_index, float(label_smoothing), reduction, provider, out_dtype)
        return reduce_rows(loss_rows, valid, reduction, out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, t, lse, valid = ctx.saved_tensors
        ignore_index, eps, reduction, provider, out_dtype = ctx.args
        if eager_backward(grad_out):  # the reference's gradient, from eager ops: differentiable, batchable
            def loss(logits):
                return _reference(logits.float(), t, ignore_index, eps, reduction).to(out_dtype)
            return vjp_of(loss, (x,), (True,), (grad_out,))[0], None, None, None, None, None, None
        grad_rows = grad_rows_for(grad_out, valid, reduction).contiguous()
        grad = ROW_OPS[provider].backward(x, t, lse, grad_rows, ignore_index, eps)
        return grad, None, None, None, None, None, None


def loss_dtype(logits: torch.Tensor) -> torch.dtype:
    """The logits' dtype, or float32 inside an autocast region for their device: autocast runs
    F.cross_entropy in fp32 (its loss is fp32 there); the fused kernels already compute in fp32,
    so they only keep the result at that precision (no fp32 copy of the logits)."""
    if logits.dtype in LOW_PRECISION and torch.is_autocast_enabled(logits.device.type):
        return torch.float32
    return logits.dtype


def _reference(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Eager composition: log_softmax, gather the target, smoothing term, masked reduction (in
    fp32 inside autocast, as autocast runs F.cross_entropy)."""
    if loss_dtype(logits) != logits.dtype:
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)  # [N, V]
    valid = target != ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target))
    rows = -logp.gather(1, safe_t[:, None]).squeeze(1)  # [N]
    if label_smoothing:
        rows = (1.0 - label_smoothing) * rows - label_smoothing * logp.mean(dim=-1)
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    if reduction == "none":
        return rows
    return rows.sum() if reduction == "sum" else rows.sum() / valid.sum()


def _aten(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return F.cross_entropy(logits, target, ignore_index=ignore_index,
                           label_smoothing=label_smoothing, reduction=reduction)


def _fused(provider: str):
    def run(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
        if logits.stride(-1) != 1:  # a copy autograd records: the saved logits stay connected
            # (clone, not .contiguous(): that returns a [1, 1] or empty view with stride 2 as it is)
            logits = logits.clone(memory_format=torch.contiguous_format)
        return _CrossEntropyFunction.apply(logits, target, ignore_index, label_smoothing,
                                           reduction, provider, loss_dtype(logits))

    run.__name__ = f"cross_entropy_{provider}"
    return run


def _cost(logits, target, *args, **kwargs) -> Cost:
    """Forward: fused reads the logits once; eager writes and re-reads an [N, V] log-prob tensor."""
    n, v = logits.shape
    es = logits.element_size()
    small = n * (target.element_size() + 8)  # per row: the target, the fp32 loss and lse
    return Cost(flops=4.0 * n * v, bytes_fused=float(n * v * es + small + 4 * n),  # lse as a (max, log_sum) pair
                bytes_unfused=float(3 * n * v * es + small))


# The row ops as a profiler sees them (OP_COSTS): the forward is the KernelSpec's cost; the
# backward reads the logits once more (x - lse, exp, minus the target's share, times the row's
# grad: 3 FLOPs an element) and writes the gradient; ce_fused_ does both, in place.
@register_op_cost("ce_forward", "triton_ce_forward")
def _forward_op(logits, target, ignore_index, label_smoothing, loss_rows, lse, **_) -> Cost:
    return _cost(logits, target)


@register_op_cost("ce_backward", "triton_ce_backward")
def _backward_op(logits, target, lse, grad_rows, ignore_index, label_smoothing, grad, **_) -> Cost:
    return op_only_cost(3.0 * logits.numel(), io_bytes(logits, target, lse, grad_rows, grad))


@register_op_cost("ce_fused_", "triton_ce_fused_")
def _fused_op(logits, target, ignore_index, label_smoothing, grad_scale, loss_rows, **_) -> Cost:
    return op_only_cost(7.0 * logits.numel(), io_bytes(logits, logits, target, loss_rows))


SPEC = register_kernel(KernelSpec(
    name="cross_entropy",
    reference=_reference,
    providers={"cpu": _fused("cpu"), "triton": _fused("triton"), "aten": _aten},
    supports=Supports(dtypes=FLOAT_DTYPES),
    cost=_cost,
    description="log-softmax + NLL (+ label smoothing, ignore_index) fused, fwd and bwd",
))


@typed_arguments
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean",
                  provider: str | None = None) -> torch.Tensor:
    """Cross-entropy of logits [N, V] against class indices [N] (see the module docstring).

    Returns the loss in the logits' dtype: a scalar, or [N] for reduction="none".
    """
    validate(logits, target, ignore_index, label_smoothing, reduction)
    return dispatch("cross_entropy", logits, target, ignore_index=ignore_index,
                    label_smoothing=label_smoothing, reduction=reduction, provider=provider)


class CrossEntropyLoss(nn.Module):
    """Drop-in for nn.CrossEntropyLoss: its arguments in its order (the legacy size_average/reduce
    too), its `weight` buffer, and its inputs. Class-index targets run the fused `cross_entropy`:
    logits [N, C], [C] (one sample) or [N, C, d1, ...] (the class dim is moved last first, one
    copy; the "none" loss comes back as [N, d1, ...]). Class weights and probability targets run
    F.cross_entropy (the fused kernels take neither); asking for a fused provider then raises."""

    def __init__(self, weight: torch.Tensor | None = None, size_average=None, ignore_index: int = -100,
                 reduce=None, reduction: str = "mean", label_smoothing: float = 0.0, *,
                 provider: str | None = None) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = nn._reduction.legacy_get_string(size_average, reduce)
        self.register_buffer("weight", weight)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self.reduction, self.provider = reduction, provider

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        kw = dict(ignore_index=self.ignore_index, label_smoothing=self.label_smoothing, reduction=self.reduction)
        if self.weight is not None or target.is_floating_point():
            if self.provider not in (None, "aten", "reference"):
                raise CrossEntropyError(f"cross_entropy: provider {self.provider!r} takes neither class weights "
                                        "nor probability targets (F.cross_entropy does: provider None or 'aten')")
            return F.cross_entropy(logits, target, weight=self.weight, **kw)
        if logits.dim() == 1:  # one sample: [C] against a 0-dim target
            out = cross_entropy(logits[None], target.reshape(1), provider=self.provider, **kw)
            return out[0] if self.reduction == "none" else out
        if logits.dim() > 2:  # [N, C, d1, ...]: classes last, then one row per position
            rows = logits.movedim(1, -1).reshape(-1, logits.shape[1])
            out = cross_entropy(rows, target.reshape(-1), provider=self.provider, **kw)
            return out.view(target.shape) if self.reduction == "none" else out
        return cross_entropy(logits, target, provider=self.provider, **kw)


from kernels.linear_cross_entropy import (  # noqa: E402  (re-export; that module imports ours)
    FusedLinearCrossEntropyLoss, fused_linear_cross_entropy)

__all__ = ["cross_entropy", "CrossEntropyLoss", "CrossEntropyError", "fused_linear_cross_entropy",
           "FusedLinearCrossEntropyLoss", "SPEC"]
