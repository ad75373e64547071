"""The fast path of the measured provider choice: the exact signature of a call -> its provider.

Reusing a stored decision the full way costs a key (every argument's size bucket, as text), a
store lookup and the provider's support checks: ~10 us a call on this CPU, more than the kernels
themselves at decode sizes (one row of 256-4096: 1-12 us eager). `tuning.choose` remembers here
the provider of each call it answered from a stored decision, under the call's exact signature:
the kernel, grad mode, thread count, the environment the choice reads (choice mode, data dir,
working dir, Triton interpreter), and every argument (a tensor by type, shape, strides, dtype,
device and requires_grad; a scalar by type and value). The key, the lookup and the support checks
are functions of that signature, so an identical call gets the same provider from one dict lookup.

- Only plain calls: a tensor subclass, a sparse tensor or any other argument type has no
  signature (the full path runs). `registry.select_provider` skips the memo while tracing,
  poisoning or under a torch.func transform, and re-checks that the provider is still available.
- Cleared whenever the decisions change (`DecisionStore.put`, `forget`, `drop_machine`), and when
  it holds `MAX_ENTRIES` signatures (a new sequence length each decode step adds one per kernel).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Hashable

import torch

MAX_ENTRIES = 4096
ENABLED = True  # off: every call takes the full way (benchmarks/bench_dispatch.py compares the two)
ENV_READ = ("FUSIONLENS_PROVIDER_CHOICE", "FUSIONLENS_DATA_DIR", "TRITON_INTERPRET")  # what the choice reads
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_SCALAR_TYPES = (type(None), bool, int, float, str)

_ENV_KEYS = tuple(os.environ.encodekey(k) for k in ENV_READ) if hasattr(os.environ, "encodekey") else ()
_memo: dict[tuple, str] = {}
_generation = 0  # +1 on every clear: a choice made before it is not remembered after it
_lock = threading.Lock()  # put and clear (lookups take none)


def _part(v: Any) -> Hashable | None:
    """What of one argument the choice depends on; None when it has no signature."""
    t = type(v)
    if t in _TENSOR_TYPES:
        if v.layout is not torch.strided:
            return None
        return t, v.shape, v.stride(), v.dtype, v.device, v.requires_grad
    if t in _SCALAR_TYPES:
        return t, v  # the type too: 1, 1.0 and True are equal keys
    return None


def _env() -> tuple:
    """The values of ENV_READ now. os.environ.get encodes its key on every call (~0.5 us each);
    its dict of encoded keys answers in ~0.05 us, and is what os.environ reads and writes."""
    env = os.environ
    data = getattr(env, "_data", None)
    if type(data) is dict and _ENV_KEYS:
        return tuple(map(data.get, _ENV_KEYS))
    return tuple(map(env.get, ENV_READ))


def signature(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple | None:
    """The exact signature of a call of kernel `name`, or None when an argument has none."""
    parts = [_part(v) for v in args]
    if kwargs:
        parts += [(k, _part(v)) for k, v in kwargs.items()]
        if any(p[1] is None for p in parts[len(args):]):
            return None
    if None in parts:
        return None
    return (name, torch.is_grad_enabled(), torch.get_num_threads(), os.getcwd(), _env(), *parts)


def get(sig: tuple | None) -> str | None:
    """The provider remembered for this signature, if any."""
    return _memo.get(sig) if sig is not None else None


def generation() -> int:
    return _generation


def put(sig: tuple | None, provider: str, since: int) -> None:
    """Remember a call's provider, unless the decisions changed after `since` (a `generation()`
    read before the choice was looked up: another thread measured or forgot meanwhile)."""
    if sig is None:
        return
    with _lock:
        if since != _generation:
            return
        if len(_memo) >= MAX_ENTRIES:
            _memo.clear()
        _memo[sig] = provider


def remember(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], provider: str, since: int,
             sig: Any = ...) -> None:
    """`put` under the call's signature: `sig` when the caller has computed it already (a memo
    miss in `registry.select_provider`), else computed here, only when the memo is on."""
    if ENABLED:
        put(signature(name, args, kwargs) if sig is ... else sig, provider, since)


def clear() -> None:
    """Forget every remembered call (the decisions changed)."""
    global _generation
    with _lock:
        _generation += 1
        _memo.clear()


def size() -> int:
    return len(_memo)
