"""Shared machinery of the multi-tensor optimizers (AdamW, LAMB): buckets, state, providers.

A step gathers, per param group, every parameter with a gradient into buckets keyed by
(device, dtype); each bucket is stepped by one provider call that takes lists of tensors (the
C++ op walks all of them in one parallel loop; the Triton kernels use one launch over a chunk
table). Provider choice goes through the kernel registry with the bucket's first parameter as
the representative tensor, so `provider=` overrides and unavailable providers keep their reason.

Parameters whose memory is not dense (views with holes) cannot be walked as flat arrays: each
steps as a contiguous copy in its dtype's bucket, written back after the call (two extra passes
over that param; their states are contiguous already). So a param's arithmetic never depends on
its layout: the per-parameter `reference` provider they used to go to computes in the param's
dtype, where fp16's eps=1e-8 is 0, unlike the fused providers' fp32 math. Gradients whose
strides differ from their parameter's (e.g. a transposed grad) are copied into the parameter's
layout first (torch 2.13's fused CPU AdamW reads such a grad as flat memory, silently wrong).

Complex parameters are stepped as their real views ([..., 2] floats, `torch.view_as_real`), as
torch.optim does: the moments are elementwise over real and imaginary parts, and a tensor's norm
(LAMB's trust ratio, the clipping norm) is the same number. Their state stays complex, so state
dicts load in either direction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.registry import KernelSpec, select_provider


class OptimizerError(ValueError):
    """Bad optimizer arguments or an unsupported parameter (one-line message)."""


@dataclass
class Bucket:
    """Parallel lists of one (device, dtype) bucket of a param group."""

    params: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    states: list[dict] = field(default_factory=list)
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (non-dense param, its stepped copy)

    def write_back(self) -> None:
        """Copy the stepped dense copies into their non-dense params."""
        for param, copy in self.copies:
            param.copy_(copy)


def is_dense(t: torch.Tensor) -> bool:
    """True if t's elements fill its memory span exactly (any dim order), so it is a flat array."""
    if t.is_contiguous():
        return True
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def check_param(p: torch.Tensor, name: str) -> None:
    if p.grad is not None and p.grad.is_sparse:
        raise OptimizerError(f"{name} does not support sparse gradients")


def real_view(t):
    """A complex tensor as its real [..., 2] view (same memory); anything else as it is."""
    return torch.view_as_real(t) if isinstance(t, torch.Tensor) and t.is_complex() else t


def grad_like_param(p: torch.Tensor) -> torch.Tensor:
    """p.grad in p's exact layout (copied only when the strides differ)."""
    g = p.grad
    if g.stride() != p.stride() or g.dtype != p.dtype:
        g = torch.empty_like(p).copy_(g)
    return g


def gather(group: dict, state: dict, init_state, name: str) -> dict[tuple, Bucket]:
    """Buckets {(device, dtype): Bucket} of the group's params with grads (a non-dense param as a
    contiguous copy: call Bucket.write_back after stepping).

    `init_state(p, st)` runs for every such param each step: it fills what st lacks (all of it on
    the first step), so the step itself only reads states. The step counter is shared with the
    real-view states of complex params (one tensor, incremented in place by the providers)."""
    buckets: dict[tuple, Bucket] = {}  # not defaultdict(Bucket): torch 2.11's Dynamo cannot trace that
    for p in group["params"]:
        if p.grad is None:
            continue
        check_param(p, name)
        st = state[p]
        init_state(p, st)
        g = grad_like_param(p)  # contiguous for a non-dense p, as its states
        if p.is_complex():  # stepped as real views; the state dict keeps the complex tensors
            p, g, st = real_view(p), real_view(g), {k: real_view(v) for k, v in st.items()}
        key = (p.device, p.dtype)
        if key not in buckets:
            buckets[key] = Bucket()
        b = buckets[key]
        if not is_dense(p):
            b.copies.append((p, p.contiguous()))
            p = b.copies[-1][1]
        b.params.append(p)
        b.grads.append(g)
        b.states.append(st)
    return buckets


def step_state() -> torch.Tensor:
    """A fresh step counter: an fp32 scalar on the CPU, where the steps' host math reads it (not
    on torch's default device, which model-building code may have set)."""
    return torch.tensor(0.0, dtype=torch.float32, device="cpu")


def zeros_state(p: torch.Tensor) -> torch.Tensor:
    """A state tensor in p's layout (preserve_format keeps a dense permuted layout)."""
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def choose(spec: KernelSpec, representative: torch.Tensor, provider: str | None, cache: dict) -> str:
    """The provider for a bucket (cached per device/dtype/provider request)."""
    key = (representative.device.type, representative.dtype, provider)
    if key not in cache:
        cache[key] = select_provider(spec, (representative,), {}, provider)[0]
    return cache[key]


def run_provider(spec: KernelSpec, chosen: str, bucket: Bucket, *states, **kwargs) -> None:
    """Step the bucket's params (with its grads and the given state lists) by one provider call."""
    fn = spec.reference if chosen == "reference" else spec.providers[chosen]
    fn(bucket.params, bucket.grads, *states, **kwargs)
    bucket.write_back()


def check_hparams(lr, betas, eps, weight_decay, name: str) -> None:
    lr_v = float(lr)
    if not 0.0 <= lr_v:
        raise OptimizerError(f"{name}: invalid learning rate {lr}")
    if not 0.0 <= eps:
        raise OptimizerError(f"{name}: invalid epsilon {eps}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise OptimizerError(f"{name}: invalid betas {betas} (each in [0, 1))")
    if not 0.0 <= weight_decay:
        raise OptimizerError(f"{name}: invalid weight_decay {weight_decay}")
