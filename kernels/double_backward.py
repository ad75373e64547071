"""Second derivatives through the fused kernels (a backward run with create_graph=True).

The fused backward kernels write their gradients through library ops, which autograd cannot see
into. With create_graph=True those gradients used to come back without a graph, so a second
derivative through a kernel silently lost that kernel's term: d2/dx2 of gelu(x) + x**3 came out
as 6x, not gelu''(x) + 6x. Now a backward that runs with grad enabled (autograd enables it only
for create_graph=True) either
- recomputes its gradients from eager ops, which autograd can differentiate again (`vjp_of`:
  the activations, softmax, rope, cross_entropy and the norms, `norm_function.eager_grads`), or
- raises at once (`refuse`: fused_linear_cross_entropy, whose forward computed the gradients and
  saved them), naming the kernel and the providers that can.

A backward given batched grads (autograd.grad's is_grads_batched, autograd.functional's
vectorize=True: it runs under vmap, where library ops have no batching rules) takes the same eager
road (`eager_backward`). The usual backward (create_graph=False, plain grads) is untouched.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kernels.registry import KERNELS, is_batched


def create_graph() -> bool:
    """True inside a backward run with create_graph=True (the only time grad mode is on there)."""
    return torch.is_grad_enabled()


def eager_backward(*grads: Any) -> bool:
    """True when a backward must build its grads from eager ops, not library kernels: with
    create_graph=True (they are differentiated again), and when its incoming grads are batched
    (`autograd.grad(..., is_grads_batched=True)`, autograd.functional's jacobian/hessian with
    vectorize=True: the backward runs under vmap, and library ops have no batching rules)."""
    return create_graph() or any(isinstance(g, torch.Tensor) and is_batched(g) for g in grads)


def vjp_of(fn: Callable[..., Any], inputs: Sequence[Any], needs: Sequence[bool],
           grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Gradients of fn(*inputs) for the inputs marked in `needs`, against `grads` (one per output
    of fn), built with a graph so they can be differentiated again. None for the others."""
    wanted = [i for i, n in enumerate(needs) if n]
    if not wanted:
        return [None] * len(inputs)
    with torch.enable_grad():
        # An alias per input makes the gradients partial: with swiglu(x, sin(x)) a grad w.r.t. a
        # itself would also follow the path through b = sin(a). The aliases keep the graph.
        inputs = [t.view_as(t) if isinstance(t, torch.Tensor) and t.requires_grad else t for t in inputs]
        out = fn(*inputs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        if not pairs:
            return [None] * len(inputs)
        got = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted], [g for _, g in pairs],
                                  create_graph=True, allow_unused=True)
    result: list[torch.Tensor | None] = [None] * len(inputs)
    for i, g in zip(wanted, got):
        result[i] = g
    return result


def refuse(kernel: str) -> None:
    """Raise: a backward with create_graph=True through `kernel`'s fused backward. The message
    names the providers that can: those made of plain PyTorch ops (`KernelSpec.func_safe`) that
    the kernel has, and the reference.

    Raised at once, not when the grads are differentiated: a grad_fn that raises later (what
    @once_differentiable gives) is skipped by `torch.autograd.grad(..., inputs=x)` whenever it
    does not lead to x itself, and the term is then silently zero again.
    """
    spec = KERNELS[kernel]
    able = [p for p in spec.func_safe if p in spec.providers] + ["reference"]
    raise RuntimeError(f"{kernel}: a backward with create_graph=True (a second derivative) through the fused "
                       f"kernel is not supported; call it with {' or '.join(f'provider={p!r}' for p in able)} for that")
