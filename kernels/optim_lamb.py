"""Multi-tensor LAMB with apex FusedLAMB's semantics, all params of a dtype/device per call.

Per step (apex's defaults: eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, adam_w_mode,
grad_averaging, bias_correction, use_nvlamb=False):
1. global grad-norm clipping over every parameter of every group: g /= max(1, ||g|| / max_grad_norm)
   (off when max_grad_norm is None or 0);
2. m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (L2 mode adds wd * p to g first);
3. update u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p (decoupled weight decay);
4. trust ratio r = ||p|| / ||u|| per tensor, 1 when either norm is 0, and 1 when the group's
   weight_decay is 0 unless use_nvlamb (apex applies the ratio only to decayed params);
5. p -= lr * r * u.
State keys: `step` (float32 scalar tensor), `exp_avg`, `exp_avg_sq`. amsgrad is refused.

Providers of the `lamb_step` kernel: `cpu` (kernels/csrc/optim.cpp: two passes, the second
recomputes u instead of storing it), `triton` (kernels/triton_optim.py), and the per-parameter
`reference` written with eager ops.
"""
from __future__ import annotations

import math

import torch

from kernels import optim_common as oc
from kernels.providers import cpu_ops
from kernels.registry import (Cost, KernelSpec, Supports, io_bytes, op_only_cost, provider_unavailable_reason,
                              register_kernel, register_op_cost, total_cost)


def _reference(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps,
               weight_decay, grad_divisor, bias_correction, adam_w_mode, grad_averaging,
               use_nvlamb):
    """The LAMB step one parameter at a time with eager ops (math in fp32, or fp64 for fp64)."""
    b3 = 1 - beta1 if grad_averaging else 1.0
    for i, p in enumerate(params):
        steps[i] += 1
        step = float(steps[i])
        acc = torch.float64 if p.dtype == torch.float64 else torch.float32
        pf, g = p.to(acc), grads[i].to(acc) / grad_divisor
        if not adam_w_mode:
            g = g + weight_decay * pf
        m = exp_avgs[i].to(acc).mul_(beta1).add_(g, alpha=b3)
        v = exp_avg_sqs[i].to(acc).mul_(beta2).addcmul_(g, g, value=1 - beta2)
        exp_avgs[i].copy_(m)
        exp_avg_sqs[i].copy_(v)
        bc1 = 1 - beta1 ** step if bias_correction else 1.0
        bc2 = 1 - beta2 ** step if bias_correction else 1.0
        u = (exp_avgs[i].to(acc) / bc1) / ((exp_avg_sqs[i].to(acc) / bc2).sqrt() + eps)
        if adam_w_mode:
            u = u + weight_decay * pf
        pn, un = float(pf.norm()), float(u.norm())
        trust = (use_nvlamb or weight_decay != 0) and pn > 0 and un > 0
        p.copy_(pf - lr * (pn / un if trust else 1.0) * u)


def _cpu(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, weight_decay,
         grad_divisor, bias_correction, adam_w_mode, grad_averaging, use_nvlamb):
    """The C++ step; its clipping divisor is a one-element tensor (a float is wrapped in one)."""
    if not isinstance(grad_divisor, torch.Tensor):
        grad_divisor = torch.full((), float(grad_divisor), dtype=torch.float64, device="cpu")
    cpu_ops().lamb_step_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
                         grad_divisor, bias_correction, adam_w_mode, grad_averaging, use_nvlamb)


def _triton(params, grads, exp_avgs, exp_avg_sqs, steps, *, grad_divisor, **hp):
    """The Triton step; its clipping divisor is a tensor on the parameters' device (a float is
    filled in there: no host->device copy)."""
    from kernels import profiled_ops

    if not isinstance(grad_divisor, torch.Tensor):
        grad_divisor = torch.full((), float(grad_divisor), dtype=torch.float64, device=params[0].device)
    profiled_ops.namespace("kernels.triton_optim").lamb_step(params, grads, exp_avgs, exp_avg_sqs, steps,
                                                             grad_divisor=grad_divisor, **hp)


def _cost(p: torch.Tensor, *args, **kwargs) -> Cost:
    """Fused, two passes: (g, p, m, v read; m, v written) + (m, v, p read; p written) = 10 streams.
    An eager per-parameter loop (fp32, AdamW mode) makes 37: g / divisor 2, m.mul_ 2, m.add_ 3,
    v.mul_ 2, v.addcmul_ 3, m / bc1 2, v / bc2 2, sqrt 2, + eps 2, / 3, wd * p 2, + 3, ||p|| 1,
    ||u|| 1, lr * ratio * u 2, p.sub_ 3 (the test reference adds casts and copies to this)."""
    n, es = p.numel(), p.element_size()
    return Cost(flops=24.0 * n, bytes_fused=10.0 * n * es, bytes_unfused=37.0 * n * es)


@register_op_cost("lamb_step_", "triton_lamb_step_")
def _step_op(params, grads, exp_avgs, exp_avg_sqs, steps, **_) -> Cost:
    """One launch over a list of parameters: the KernelSpec's cost of each, summed."""
    return total_cost(_cost(p) for p in params)


@register_op_cost("multi_sumsq")
def _sumsq_op(tensors, **_) -> Cost:
    """Sum of squares of each tensor (the global grad norm): 2 FLOPs an element, one fp64 out each."""
    return op_only_cost(2.0 * sum(t.numel() for t in tensors), io_bytes(tensors) + 8.0 * len(tensors))


SPEC = register_kernel(KernelSpec(
    name="lamb_step",
    reference=_reference,
    providers={"cpu": _cpu, "triton": _triton},
    supports=Supports(dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16)),
    cost=_cost,
    description="multi-tensor LAMB step (apex FusedLAMB semantics)",
    provider_checks={"triton": lambda p, *a, **k: "float64 is not supported by the Triton kernel"
                     if p.dtype == torch.float64 else None},
))


def device_grad_divisor(grads: list[torch.Tensor], max_grad_norm: float, *, cpp: bool = True) -> torch.Tensor:
    """max(1, ||g|| / max_grad_norm) over the grads of one device as a 0-dim fp64 tensor there,
    with no host read: a GPU step stays asynchronous (apex's FusedLAMB keeps the norm on the GPU
    too) and a compiled step one graph. The norm is global_grad_norm's, to the bit.
    cpp=False: never the C++ reduction (nor its build), as for provider="reference"."""
    return torch.clamp(_device_sumsq(grads, cpp).sqrt() / max_grad_norm, min=1.0)


def _device_sumsq(grads: list[torch.Tensor], cpp: bool = True) -> torch.Tensor:
    """Sum of squares over the grads of one device as a 0-dim fp64 tensor there: dense CPU grads
    by the C++ multi-tensor reduction (fp64 across chunks) where the extension builds and cpp is
    set, others by torch._foreach_norm in fp32 (fp64 grads in fp64), squared and summed in fp64."""
    if (cpp and all(g.device.type == "cpu" and oc.is_dense(g) for g in grads)
            and provider_unavailable_reason("cpu") is None):
        return cpu_ops().multi_sumsq(grads).sum()
    norms = torch._foreach_norm([g if g.dtype == torch.float64 else g.float() for g in grads])
    return torch.stack([n.double() for n in norms]).square().sum()


def global_grad_norm(grads: list[torch.Tensor], *, cpp: bool = True) -> float:
    """sqrt(sum of squares) over all grads (fp64 on CPU; torch._foreach_norm elsewhere)."""
    if not grads:
        return 0.0
    total = 0.0
    for device in dict.fromkeys(g.device for g in grads):  # one host read per device, in first-seen order
        total += float(_device_sumsq([g for g in grads if g.device == device], cpp))
    return math.sqrt(total)


class LAMB(torch.optim.Optimizer):
    """LAMB (apex FusedLAMB semantics, see the module docstring), multi-tensor.

    Args: lr, betas, eps, weight_decay, bias_correction, adam_w_mode, grad_averaging,
    max_grad_norm (None/0 = no clipping), use_nvlamb, provider (None = best available).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, *, bias_correction: bool = True,
                 adam_w_mode: bool = True, grad_averaging: bool = True,
                 max_grad_norm: float | None = 1.0, use_nvlamb: bool = False, amsgrad: bool = False,
                 provider: str | None = None) -> None:
        oc.check_hparams(lr, betas, eps, weight_decay, "LAMB")
        if amsgrad:
            raise oc.OptimizerError("LAMB: amsgrad is not supported (as in apex FusedLAMB)")
        if max_grad_norm is not None and max_grad_norm < 0:
            raise oc.OptimizerError(f"LAMB: invalid max_grad_norm {max_grad_norm}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, grad_averaging=grad_averaging)
        super().__init__(params, defaults)
        self.adam_w_mode, self.use_nvlamb = adam_w_mode, use_nvlamb
        self.max_grad_norm = max_grad_norm
        self.provider = provider
        self._chosen: dict = {}

    @staticmethod
    def _init_state(p: torch.Tensor, st: dict) -> None:
        if st:
            return
        st["step"] = oc.step_state()
        st["exp_avg"] = oc.zeros_state(p)
        st["exp_avg_sq"] = oc.zeros_state(p)

    def _norm_in_cpp(self) -> bool:
        """Whether the clipping norm may use the C++ reduction (fp64 sums): not for the reference."""
        return self.provider != "reference"

    def _grad_divisor(self, all_buckets) -> float | torch.Tensor:
        """The clipping divisor: a tensor when every grad is on one device (no host read), else a float."""
        if not self.max_grad_norm:
            return 1.0
        grads = [g for buckets in all_buckets for b in buckets.values() for g in b.grads]
        if len({g.device for g in grads}) == 1:
            return device_grad_divisor(grads, self.max_grad_norm, cpp=self._norm_in_cpp())
        norm = global_grad_norm(grads, cpp=self._norm_in_cpp())
        return norm / self.max_grad_norm if norm > self.max_grad_norm else 1.0

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        all_buckets = [oc.gather(g, self.state, self._init_state, "LAMB") for g in self.param_groups]
        divisor = self._grad_divisor(all_buckets)
        for group, buckets in zip(self.param_groups, all_buckets):
            beta1, beta2 = group["betas"]
            hp = dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
                      weight_decay=group["weight_decay"], grad_divisor=divisor,
                      bias_correction=group["bias_correction"], adam_w_mode=self.adam_w_mode,
                      grad_averaging=group["grad_averaging"], use_nvlamb=self.use_nvlamb)
            for b in buckets.values():
                chosen = oc.choose(SPEC, b.params[0], self.provider, self._chosen)
                oc.run_provider(SPEC, chosen, b,
                                [st["exp_avg"] for st in b.states],
                                [st["exp_avg_sq"] for st in b.states],
                                [st["step"] for st in b.states], **hp)
        return loss
