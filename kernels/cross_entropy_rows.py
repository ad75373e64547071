"""Row-wise cross-entropy primitives, one set per provider (cpu C++, triton, eager aten ops).

`cross_entropy` and `fused_linear_cross_entropy` are written once on top of three primitives,
each over logits [N, V] with a unit stride along V:

- `forward(logits, target, ignore_index, eps) -> (loss_rows, lse)`: loss_rows fp32 [N], ignored
  rows 0; lse whatever the provider's backward reads (cpu, triton: the pair (max, log sum exp(x -
  max)) fp32 [N, 2], which keeps the softmax as accurate as eager's at large logits; aten: the
  log-sum-exp [N]). eps is the label smoothing (PyTorch's definition: the target distribution is
  (1 - eps) * onehot + eps / V).
- `backward(logits, target, lse, grad_rows, ignore_index, eps) -> grad` [N, V] in the logits'
  dtype: grad_rows[i] * (softmax(x_i) - (1 - eps) * onehot(t_i) - eps / V); ignored rows 0, or
  NaN where the row's softmax is NaN (a NaN or +Inf logit, all -Inf), as eager's softmax * 0.
- `fused_(logits, target, ignore_index, eps, grad_scale) -> loss_rows`: both at once, with the
  logits (contiguous, a scratch chunk) overwritten by grad_scale * dloss/dlogits.

All arithmetic is fp32 whatever the logits' dtype. Outputs are allocated with
`registry.new_output`, so tests can poison them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels.providers import cpu_ops
from kernels.registry import has_data, new_output


@dataclass(frozen=True)
class RowOps:
    """The three row primitives of one provider."""

    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    backward: Callable[..., torch.Tensor]
    fused_: Callable[..., torch.Tensor]


REDUCTIONS = ("mean", "sum", "none")


class CrossEntropyError(ValueError):
    """Bad arguments to cross_entropy / fused_linear_cross_entropy (one-line message)."""


def validate(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
             label_smoothing: float, reduction: str) -> None:
    """Raise CrossEntropyError unless the call is one this family supports."""
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise CrossEntropyError("cross_entropy: logits and target must be tensors")
    if logits.dim() != 2 or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise CrossEntropyError(f"cross_entropy: expected logits [N, V] and target [N], got "
                                f"{tuple(logits.shape)} and {tuple(target.shape)} (flatten to [tokens, vocab])")
    if logits.numel() == 0:
        raise CrossEntropyError(f"cross_entropy: empty input (logits {tuple(logits.shape)})")
    if not logits.is_floating_point() or target.is_floating_point() or target.is_complex():
        raise CrossEntropyError("cross_entropy: logits must be floating point and target integer "
                                "class indices (probability targets are not supported)")
    if reduction not in REDUCTIONS:
        raise CrossEntropyError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise CrossEntropyError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    # On GPU this check would synchronise, under torch.compile it would break the graph and a fake
    # tensor has no values; the kernels check each row themselves (the C++ ops raise; the Triton
    # kernels read nothing out of bounds and give that row a NaN loss and gradient).
    if target.device.type == "cpu" and has_data(target):
        v = logits.shape[1]
        bad = (target != ignore_index) & ((target < 0) | (target >= v))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise CrossEntropyError(f"cross_entropy: target {int(target[i])} at row {i} is out of "
                                    f"range [0, {v}) and is not ignore_index={ignore_index}")


def cast_output(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t.to(dtype)`, skipped when it would return `t` itself: torch 2.11's Dynamo (the GPU image's)
    loses the gradient of an autograd.Function whose output is such a no-op `.to` (zero grads under
    torch.compile; 2.13 is fine). tests/kernels/test_compile.py fails under 2.11 without it."""
    return t if t.dtype == dtype else t.to(dtype)


def _rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = logits.shape[0]  # loss rows [N]; lse as the pair (max, log sum exp(x - max)) [N, 2]
    return new_output((n,), logits, torch.float32), new_output((n, 2), logits, torch.float32)


# ---- cpu: the C++ ops in kernels/csrc/cross_entropy.cpp ----------------------------------------

_ops = cpu_ops


def _cpu_forward(logits, target, ignore_index, eps):
    loss_rows, lse = _rows(logits)
    _ops().ce_forward(logits, target, ignore_index, eps, loss_rows, lse)
    return loss_rows, lse


def _cpu_backward(logits, target, lse, grad_rows, ignore_index, eps):
    grad = new_output(logits.shape, logits)
    _ops().ce_backward(logits, target, lse, grad_rows, ignore_index, eps, grad)
    return grad


def _cpu_fused_(logits, target, ignore_index, eps, grad_scale):
    loss_rows = new_output((logits.shape[0],), logits, torch.float32)
    _ops().ce_fused_(logits, target, ignore_index, eps, float(grad_scale), loss_rows)
    return loss_rows


# ---- aten: eager torch ops, any device (the chunked path without a compiled kernel) ------------

def _aten_stats(logits, target, ignore_index, eps):
    x = logits.float()  # [N, V]
    lse = torch.logsumexp(x, dim=-1)  # [N]
    valid = target != ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target))
    x_t = x.gather(1, safe_t[:, None]).squeeze(1)  # [N]
    loss = lse - (1.0 - eps) * x_t
    if eps != 0.0:
        loss = loss - eps * x.mean(dim=-1)
    return x, lse, torch.where(valid, loss, torch.zeros_like(loss)), valid, safe_t


def _aten_forward(logits, target, ignore_index, eps):
    _, lse, loss, _, _ = _aten_stats(logits, target, ignore_index, eps)
    return loss, lse


def _aten_grad(x, lse, safe_t, valid, scale_rows, eps):
    v = x.shape[1]
    grad = torch.exp(x - lse[:, None]) - eps / v  # [N, V] fp32
    grad.scatter_add_(1, safe_t[:, None], torch.full_like(lse[:, None], -(1.0 - eps)))
    grad = torch.where(lse.isfinite()[:, None], grad, float("nan"))  # a +Inf / all -Inf row: NaN, as eager
    return torch.where(valid[:, None], grad * scale_rows[:, None], grad * 0.0)  # ignored: eager's softmax * 0


def _aten_backward(logits, target, lse, grad_rows, ignore_index, eps):
    valid = target != ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target))
    return _aten_grad(logits.float(), lse, safe_t, valid, grad_rows, eps).to(logits.dtype)


def _aten_fused_(logits, target, ignore_index, eps, grad_scale):
    x, lse, loss, valid, safe_t = _aten_stats(logits, target, ignore_index, eps)
    scale = torch.full_like(lse, float(grad_scale))
    logits.copy_(_aten_grad(x, lse, safe_t, valid, scale, eps))
    return loss


# ---- triton: kernels/triton_cross_entropy.py ---------------------------------------------------

def _triton() -> Any:
    """The Triton row functions, through library ops while profiled (kernels/profiled_ops.py)."""
    from kernels import profiled_ops

    return profiled_ops.namespace("kernels.triton_cross_entropy")


def _triton_forward(logits, target, ignore_index, eps):
    loss_rows, lse = _rows(logits)
    _triton().forward(logits, target, ignore_index, eps, loss_rows, lse)
    return loss_rows, lse


def _triton_backward(logits, target, lse, grad_rows, ignore_index, eps):
    grad = new_output(logits.shape, logits)
    _triton().backward(logits, target, lse, grad_rows, ignore_index, eps, grad)
    return grad


def _triton_fused_(logits, target, ignore_index, eps, grad_scale):
    loss_rows = new_output((logits.shape[0],), logits, torch.float32)
    _triton().fused_(logits, target, ignore_index, eps, float(grad_scale), loss_rows)
    return loss_rows


ROW_OPS: dict[str, RowOps] = {
    "cpu": RowOps(_cpu_forward, _cpu_backward, _cpu_fused_),
    "aten": RowOps(_aten_forward, _aten_backward, _aten_fused_),
    "triton": RowOps(_triton_forward, _triton_backward, _triton_fused_),
}
