"""Autocast's float32 policy, followed by the kernels whose eager op it lists.

Inside `torch.autocast` on a GPU, eager runs `F.layer_norm` and `F.softmax` in float32: a bf16 or
fp16 input is up-cast first and the output is fp32 (autocast's "fp32 list"; on CPU neither op is
listed). Our fused providers are autograd Functions and library ops, which autocast does not
touch: left alone they would return the input's dtype, while the "aten" provider, an ATen op,
returns fp32, so the output dtype would depend on which provider the measured choice picked (and
a post-LN model's residual stream would drop from fp32 to bf16 where eager keeps it in fp32).

A kernel that replaces such an op names it in its `KernelSpec.autocast` (`AutocastRule`): when
`upcast_now` says eager would up-cast this call, `registry.dispatch` runs the rule instead, which
up-casts every low-precision input, as autocast does, and dispatches again in fp32, so every
provider and the reference agree with eager. Gradients flow back through the casts in the
inputs' own dtypes, as in eager. `FP32_POLICY` is torch's own list for these ops (a test checks
it against the installed torch's CUDA and CPU autocast).

`cross_entropy` and `fused_linear_cross_entropy` follow autocast themselves (fp32 loss on CPU and
GPU; `kernels/cross_entropy.py`); the other kernels replace ops autocast leaves in the input's
dtype (GELU, SiLU, products, RoPE's arithmetic; RMSNorm in HF's semantics, whose casts are
explicit).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)

# eager op -> device types whose autocast runs it in float32 (torch 2.13's CUDA list has both;
# its CPU list has neither). tests/kernels/test_autocast.py checks this against torch itself.
FP32_POLICY: dict[str, frozenset[str]] = {
    "layer_norm": frozenset({"cuda"}),
    "softmax": frozenset({"cuda"}),
}


# one C call that is False outside every autocast region (private; the per-device queries otherwise)
any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


@dataclass(frozen=True)
class AutocastRule:
    """op: the eager op (a key of FP32_POLICY) the kernel replaces; call: fn(*args, provider=,
    **kwargs) that computes the call as eager under autocast does (inputs up-cast, then dispatched)."""

    op: str
    call: Callable[..., Any]


def up(t: Any) -> Any:
    """A bf16/fp16 tensor as fp32 (autocast's cast: differentiable, grads return in its dtype)."""
    return t.float() if isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION else t


def upcast_now(op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Eager's `op` would run in fp32 on this call: an autocast region is on for the device of the
    call's tensors, that device's policy lists `op`, and some input is below fp32. `dispatch`
    asks `any_autocast()` first, one C call, so a call outside every autocast region never gets
    here (this check cost 0.4 us of a 9 us decode-size layer_norm)."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    if not tensors or not any(t.dtype in LOW_PRECISION for t in tensors):
        return False
    device = tensors[0].device.type
    return device in FP32_POLICY[op] and torch.is_autocast_enabled(device)
