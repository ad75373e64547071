"""Multi-tensor AdamW: torch.optim.AdamW's semantics, all params of a dtype/device in one call.

Semantics are torch.optim.AdamW's (decoupled weight decay p *= 1 - lr * wd; bias-corrected
moments; amsgrad; maximize), with the same state keys (`step` as a float32 scalar tensor,
`exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`), so state dicts load in either direction.
Refused: capturable, differentiable, sparse gradients. foreach/fused flags are accepted and
choose nothing (this class is the fused path). Complex parameters step as their real views,
as torch's.

Providers of the `adamw_step` kernel: `cpu` (kernels/csrc/optim.cpp: one OpenMP loop over
32K-element chunks of every tensor, one pass, 28 B/element for fp32), `triton` (one launch over a
chunk table, kernels/triton_optim.py), `aten` (torch._fused_adamw_), and the per-parameter
`reference` (torch's single-tensor algorithm written with eager ops).
"""
from __future__ import annotations

import torch

from kernels import optim_common as oc
from kernels.providers import cpu_ops
from kernels.registry import Cost, KernelSpec, Supports, register_kernel, register_op_cost, total_cost


def _reference(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2,
               eps, weight_decay, amsgrad, maximize):
    """torch.optim.AdamW's single-tensor loop, one parameter at a time (the truth for tests)."""
    for i, p in enumerate(params):
        g = -grads[i] if maximize else grads[i]
        m, v = exp_avgs[i], exp_avg_sqs[i]
        steps[i] += 1
        step = float(steps[i])
        p.mul_(1 - lr * weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], v, out=max_exp_avg_sqs[i])
            v = max_exp_avg_sqs[i]
        denom = (v.sqrt() / bc2 ** 0.5).add_(eps)
        p.addcdiv_(m, denom, value=-lr / bc1)


def _cpu(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2, eps,
         weight_decay, amsgrad, maximize):
    cpu_ops().adamw_step_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
                          lr, beta1, beta2, eps, weight_decay, amsgrad, maximize)


def _aten(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2, eps,
          weight_decay, amsgrad, maximize):
    torch._foreach_add_(steps, 1)
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                        [s.to(params[0].device) for s in steps] if params[0].device.type != "cpu" else steps,
                        lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                        amsgrad=amsgrad, maximize=maximize)


def _triton(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, **hp):
    from kernels import profiled_ops

    profiled_ops.namespace("kernels.triton_optim").adamw_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, **hp)


def _cost(p: torch.Tensor, *args, amsgrad: bool = False, **kwargs) -> Cost:
    """Per element: read g, p, m, v (+ max v); write p, m, v (+ max v), in one pass. torch's
    single-tensor loop (the reference) makes 20 passes: p.mul_ 2, m.lerp_ 3, v.mul_ 2,
    v.addcmul_ 3, sqrt 2, / 2, add_ 2, p.addcdiv_ 4 (+ 3 for torch.maximum with amsgrad)."""
    n, es = p.numel(), p.element_size()
    return Cost(flops=16.0 * n, bytes_fused=(7.0 + 2 * amsgrad) * n * es,
                bytes_unfused=(20.0 + 3 * amsgrad) * n * es)


@register_op_cost("adamw_step_", "triton_adamw_step_")
def _step_op(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad=False, **_) -> Cost:
    """One launch over a list of parameters: the KernelSpec's cost of each, summed."""
    return total_cost(_cost(p, amsgrad=amsgrad) for p in params)


SPEC = register_kernel(KernelSpec(
    name="adamw_step",
    reference=_reference,
    providers={"cpu": _cpu, "triton": _triton, "aten": _aten},
    supports=Supports(dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16)),
    cost=_cost,
    description="multi-tensor AdamW step (torch.optim.AdamW semantics)",
    provider_checks={"triton": lambda p, *a, **k: "float64 is not supported by the Triton kernel"
                     if p.dtype == torch.float64 else None},
))


class AdamW(torch.optim.Optimizer):
    """AdamW that steps every parameter of a dtype/device in one multi-tensor call.

    Args as torch.optim.AdamW (lr, betas, eps, weight_decay=1e-2, amsgrad, maximize), plus
    `provider` (None = best available: cpu C++ on CPU, triton on CUDA). `foreach` and `fused` are
    accepted so that a torch.optim.AdamW call line works unchanged; they choose nothing here, every
    step being one fused multi-tensor call.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, provider: str | None = None, capturable: bool = False,
                 differentiable: bool = False, foreach: bool | None = None,
                 fused: bool | None = None) -> None:
        oc.check_hparams(lr, betas, eps, weight_decay, "AdamW")
        if capturable or differentiable:
            raise oc.OptimizerError("AdamW: capturable and differentiable are not supported "
                                    "(use torch.optim.AdamW for those)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)
        self.provider = provider
        self._chosen: dict = {}

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)

    @staticmethod
    def _init_state(p: torch.Tensor, st: dict, amsgrad: bool) -> None:
        """Fill what st lacks: everything at first, max_exp_avg_sq once amsgrad is turned on."""
        if not st:
            st["step"] = oc.step_state()
            st["exp_avg"] = oc.zeros_state(p)
            st["exp_avg_sq"] = oc.zeros_state(p)
        if amsgrad and "max_exp_avg_sq" not in st:
            st["max_exp_avg_sq"] = oc.zeros_state(p)

    def providers_used(self) -> dict:
        """{(device type, dtype, provider request): chosen provider} of the steps so far."""
        return dict(self._chosen)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ams = group["amsgrad"]
            buckets = oc.gather(group, self.state, lambda p, st: self._init_state(p, st, ams), "AdamW")
            beta1, beta2 = group["betas"]
            hp = dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
                      weight_decay=group["weight_decay"], amsgrad=ams, maximize=group["maximize"])
            for b in buckets.values():
                chosen = oc.choose(SPEC, b.params[0], self.provider, self._chosen)
                oc.run_provider(SPEC, chosen, b,
                                [st["exp_avg"] for st in b.states],
                                [st["exp_avg_sq"] for st in b.states],
                                [st["max_exp_avg_sq"] for st in b.states] if ams else [],
                                [st["step"] for st in b.states], **hp)
        return loss
