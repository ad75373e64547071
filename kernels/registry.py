"""Registry of fused kernels: `KernelSpec` objects registered by decorator.

A kernel has a `reference` composed from eager PyTorch ops (the truth for tests), `providers`
(implementations keyed by provider name: "cpu" = our C++ extension, "triton" = Triton for CUDA,
"aten" = an ATen fused op where that is the best available), `supports` (dtypes, devices, shape
checks) and `cost` (FLOPs and bytes of the fused kernel vs. the unfused chain: the same numbers
the roofline and the advisor read).

Provider choice is automatic and can be overridden with `provider=` (an explicit provider always
wins, or raises with its reason). The automatic choice of `dispatch` is made by measurement
(`kernels/tuning.py`, docs/kernels.md): on the first call of a kernel for a new key (kernel,
device, dtypes, size bucket, mode arguments, threads, grad or not) every provider that can run
the call is timed on the call's own arguments and the fastest is kept, in memory and in
`<data dir>/tuning/provider_choice.json`; ties within 5% go to the earlier provider in
`PROVIDER_ORDER`. `FUSIONLENS_PROVIDER_CHOICE=order` makes it the first runnable provider in
`PROVIDER_ORDER` for the tensor's device, which is also what `select_provider` returns unless
asked `by_measurement=True` (the optimizers, which pass a representative tensor rather than the
call, stay on the order). `kernels.provider_choice(name, *args, **kwargs)` reports the choice,
the measured times and why each other provider was skipped. An unavailable provider keeps its
reason as a value (`available_providers()`, `why_not`), so the UI can show why it was skipped.

This package imports nothing from `profiler` or `fusion_advisor`.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.autograd.forward_ad as _forward_ad

from kernels import _alloc, choice_memo
from kernels.autocast import AutocastRule, any_autocast, upcast_now

# Provider preference per device type. "reference" (eager composition) is always last.
PROVIDER_ORDER: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu", "aten", "reference"),
    "cuda": ("triton", "aten", "reference"),
}


@dataclass(frozen=True)
class Cost:
    """Work of one call. Bytes are algorithmic (inputs + outputs at their dtypes)."""

    flops: float
    bytes_fused: float  # bytes the fused kernel reads + writes
    bytes_unfused: float  # bytes the eager chain reads + writes (intermediates written and re-read)

    @property
    def bytes_saved(self) -> float:
        return max(self.bytes_unfused - self.bytes_fused, 0.0)


FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)  # what the kernels take


@dataclass(frozen=True)
class Supports:
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    # Optional extra check on the call's arguments: returns None if fine, else a reason string.
    check: Callable[..., str | None] | None = None


@dataclass(frozen=True)
class KernelSpec:
    name: str
    reference: Callable[..., Any]
    providers: Mapping[str, Callable[..., Any]]  # provider name -> implementation
    supports: Supports = field(default_factory=Supports)
    cost: Callable[..., Cost] | None = None
    description: str = ""
    # Per-provider extra support checks: provider -> fn(*args, **kwargs) -> reason | None.
    provider_checks: Mapping[str, Callable[..., str | None]] = field(default_factory=dict)
    # Optional key of measured provider choice: fn(*args, **kwargs) -> str naming the size bucket
    # and the mode arguments that change the algorithm (None: `tuning.default_key`).
    tune_key: Callable[..., str] | None = None
    # Providers made of plain PyTorch ops (no autograd.Function, no library op), which torch.func
    # transforms (grad, vmap, jacrev, ...) and forward-mode AD see through; under a transform or
    # inside forward_ad.dual_level() only these and the reference can run (`plain_ops_only`).
    func_safe: tuple[str, ...] = ("aten",)
    # False: the measured choice never picks the reference while a provider can run (it would
    # materialise what the kernel exists to avoid, e.g. the [N, V] logits of a fused linear + CE,
    # even when that is faster); it still runs when no provider can.
    reference_measured: bool = True
    # Optional: fn(args, kwargs) -> (args, kwargs, note) of a cheaper call that ranks the providers
    # as this call does (a fused linear + CE on a few of its token chunks), or None to time the
    # call itself. The decision is still kept under the full call's key.
    measure_call: Callable[..., tuple | None] | None = None
    # Optional: the eager op whose autocast policy the kernel follows, and how it computes a call
    # eager would up-cast to fp32 (`kernels/autocast.py`); `dispatch` runs it in that case.
    autocast: AutocastRule | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"kernel name must be an identifier, got {self.name!r}")
        if not callable(self.reference):
            raise TypeError(f"kernel {self.name}: reference must be callable")
        unknown = set(self.providers) - {p for order in PROVIDER_ORDER.values() for p in order}
        if unknown:
            raise ValueError(f"kernel {self.name}: unknown providers {sorted(unknown)}")


KERNELS: dict[str, KernelSpec] = {}

# provider -> callable returning None when usable, else the reason it is not (cached by caller).
_PROVIDER_PROBES: dict[str, Callable[[], str | None]] = {}
_PROBE_RESULTS: dict[str, str | None] = {}


def register_kernel(spec: KernelSpec) -> KernelSpec:
    """Register a KernelSpec; a duplicate name raises."""
    if spec.name in KERNELS:
        raise ValueError(f"kernel {spec.name!r} is already registered")
    KERNELS[spec.name] = spec
    return spec


# The library ops (`torch.ops.fusionlens.*`) the providers run, as a profiler sees them: op name
# ("act_fwd") -> fn(**the op's arguments by schema name) -> Cost of that one call. Forward ops read
# their KernelSpec's `cost`, so a capture's roofline and the advisor count the same FLOPs and bytes
# (bytes_fused: what the op reads and writes); backward ops are counted the same way.
OP_COSTS: dict[str, Callable[..., Cost]] = {}
# Library ops that do no arithmetic on tensors themselves: which instruction set a family runs,
# the output pool's controls and its allocation (a profiler counts allocations as such), and the
# composite norm_eager_grads (kernels/norm_function.py), whose eager ops are counted one by one.
NO_COMPUTE_OPS = frozenset({"activations_isa", "cross_entropy_isa", "norms_isa", "optim_isa", "rope_isa",
                            "softmax_isa", "empty_pooled", "empty_output", "pool_configure", "pool_empty",
                            "pool_stats", "norm_eager_grads"})


def register_op_cost(*names: str):
    """Decorator: the Cost of one call of each named `fusionlens::` op (a duplicate raises)."""
    def wrap(fn: Callable[..., Cost]) -> Callable[..., Cost]:
        for name in names:
            if name in OP_COSTS:
                raise ValueError(f"op cost for fusionlens::{name} is already registered")
            OP_COSTS[name] = fn
        return fn
    return wrap


def io_bytes(*tensors: Any) -> float:
    """Bytes of the given tensors (lists flattened, None skipped; broadcast dims once): each one
    read or written once."""
    total = 0
    for t in tensors:
        if isinstance(t, (list, tuple)):
            total += io_bytes(*t)
        elif isinstance(t, torch.Tensor) and t.numel():
            distinct = 1  # broadcast (stride-0) dims are read once
            for size, stride in zip(t.shape, t.stride()):
                distinct *= size if stride else 1
            total += distinct * t.element_size()
    return float(total)


def op_only_cost(flops: float, nbytes: float) -> Cost:
    """Cost of a library op whose eager chain is not modelled (backward ops): unfused = fused."""
    return Cost(flops=float(flops), bytes_fused=nbytes, bytes_unfused=nbytes)


def total_cost(costs: Any) -> Cost:
    """The sum of several Costs (one launch over many tensors)."""
    f = bf = bu = 0.0
    for c in costs:
        f, bf, bu = f + c.flops, bf + c.bytes_fused, bu + c.bytes_unfused
    return Cost(flops=f, bytes_fused=bf, bytes_unfused=bu)


def op_cost(name: str, **arguments: Any) -> Cost | None:
    """Cost of one call of library op `name` ("act_fwd" or "fusionlens::act_fwd") given its
    arguments by schema name; Cost(0, 0, 0) for ops that compute nothing; None when unknown."""
    short = name.split("::")[-1]
    if short in NO_COMPUTE_OPS:
        return Cost(0.0, 0.0, 0.0)
    fn = OP_COSTS.get(short)
    return None if fn is None else fn(**arguments)


def register_provider_probe(provider: str):
    """Decorator: register the availability probe of a provider (run lazily, once)."""

    def wrap(fn: Callable[[], str | None]) -> Callable[[], str | None]:
        if provider in _PROVIDER_PROBES:
            raise ValueError(f"provider probe {provider!r} is already registered")
        _PROVIDER_PROBES[provider] = fn
        return fn

    return wrap


def provider_unavailable_reason(provider: str) -> str | None:
    """None if `provider` works on this machine, else why not. Probed once, then cached.

    torch.compile evaluates it while tracing and keeps the answer as a constant (the mark below),
    so a first call inside a compiled function probes (and builds or loads the C++ extension)
    outside the graph instead of breaking it."""
    if provider in ("reference", "aten"):
        return None
    if provider not in _PROBE_RESULTS:
        if provider not in _PROVIDER_PROBES:
            import kernels._build  # noqa: F401  (registers the cpu and triton probes)
        probe = _PROVIDER_PROBES.get(provider)
        if probe is None:
            _PROBE_RESULTS[provider] = f"no probe registered for provider {provider!r}"
        else:
            try:
                _PROBE_RESULTS[provider] = probe()
            except Exception as exc:  # a probe must never take the program down
                _PROBE_RESULTS[provider] = f"{type(exc).__name__}: {exc}"
    return _PROBE_RESULTS[provider]


# What torch.compiler.assume_constant_result sets; calling it would import torch._dynamo (and
# Triton) with `import kernels`. tests/kernels/test_compile.py checks the effect.
provider_unavailable_reason._dynamo_marked_constant = True  # type: ignore[attr-defined]


_POISON = threading.local()
_POISON_BLOCKS = [0]  # open poison_outputs() blocks in all threads: 0 answers `poisoning` without the thread-local
_POISON_LOCK = threading.Lock()


@contextmanager
def poison_outputs():
    """Within this block, `new_output` fills fresh outputs with NaN (tests: unwritten elements show)."""
    previous = getattr(_POISON, "on", False)
    _POISON.on = True
    with _POISON_LOCK:
        _POISON_BLOCKS[0] += 1
    try:
        yield
    finally:
        _POISON.on = previous
        with _POISON_LOCK:
            _POISON_BLOCKS[0] -= 1


def poisoning() -> bool:
    """True inside `poison_outputs()` on this thread (asked on every kernel call and output:
    a thread-local read costs ~0.3 us, the count of open blocks ~0.03)."""
    return _POISON_BLOCKS[0] > 0 and getattr(_POISON, "on", False)


def new_output(shape: tuple[int, ...] | torch.Size, like: torch.Tensor,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """Allocate a kernel output (contiguous, on `like`'s device); NaN-filled under poison_outputs().

    Providers allocate every output through this (and pass it to their C++/Triton kernel), so a
    test can poison them and catch elements a kernel forgot to write.
    """
    out = _alloc.empty(tuple(shape), dtype or like.dtype, like.device)
    if poisoning() and out.is_floating_point():
        out.fill_(float("nan"))
    return out


def new_output_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A dense output of x's shape laid out in x's dimension order (eager's preserve_format), through
    `new_output`: a kernel that reads x in memory order then writes its output in the same order.
    An expanded x (a broadcast, stride-0 dim) has no such order: its output is contiguous, as eager's."""
    if x.is_contiguous() or any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape)):
        return new_output(x.shape, x, dtype)
    order = sorted(range(x.dim()), key=lambda i: (-x.stride(i), i))  # outermost dim first
    base = new_output([x.shape[i] for i in order], x, dtype)
    return base.permute([order.index(i) for i in range(x.dim())])


def is_batched(t: torch.Tensor) -> bool:
    """t is a vmap BatchedTensor: torch.func.vmap's, or the legacy vmap's under which
    `autograd.grad(..., is_grads_batched=True)` and autograd.functional's jacobian/hessian with
    vectorize=True run a backward. Library ops have no batching rules. False while torch.compile
    traces (Dynamo cannot trace the check; it handles vmap itself)."""
    return not torch.compiler.is_compiling() and (_IS_BATCHED(t) or _IS_LEGACY_BATCHED(t))


_IS_BATCHED = getattr(torch._C._functorch, "is_batchedtensor", lambda t: False)
_IS_LEGACY_BATCHED = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)


def has_data(t: torch.Tensor) -> bool:
    """t's values may be read on the host now: a plain tensor, not on meta, not batched, outside
    torch.compile tracing. Fake tensors (FakeTensorMode: memory and runtime estimators, export)
    hold no data, a batched one holds many, and a read while tracing breaks the graph; code that
    would read then keeps the value a tensor."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"
            and not torch.compiler.is_compiling() and not is_batched(t))


def triton_interpreted() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1): tests only."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def available_providers() -> dict[str, str | None]:
    """{provider: None if available else the reason}, for every known provider."""
    names = {p for order in PROVIDER_ORDER.values() for p in order}
    return {p: provider_unavailable_reason(p) for p in sorted(names)}


def _device_type(args: tuple[Any, ...]) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cpu"


def _dtype(args: tuple[Any, ...]) -> torch.dtype | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.dtype
    return None


def plain_ops_only() -> bool:
    """A torch.func transform or a forward-mode AD level (dual tensors) is active: only providers
    made of plain PyTorch ops compose with them (ours would drop a dual tensor's tangent)."""
    return torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0


def memo_allowed() -> bool:
    """The exact-call memo (`choice_memo`) may answer now: not while JIT tracing (sizes may be
    symbolic), poisoning (tests pick by order), or under a torch.func transform (fewer providers)."""
    return choice_memo.ENABLED and not (torch._C._get_tracing_state() is not None or poisoning() or plain_ops_only())


def _missing(spec: KernelSpec, provider: str) -> str | None:
    """Why `spec` cannot run `provider` on any call: it has none, or this machine cannot run it."""
    if provider != "reference" and provider not in spec.providers:
        return f"{spec.name} has no {provider} provider"
    return provider_unavailable_reason(provider)


def why_not(spec: KernelSpec, provider: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """None if `provider` can run this call of `spec`, else the reason it cannot."""
    reason = _missing(spec, provider)
    if reason:
        return reason
    device = _device_type(args)
    if provider == "reference":
        return None
    if provider not in spec.func_safe and plain_ops_only():
        return (f"a torch.func transform (grad, vmap, jacrev, ...) or forward-mode AD is active: the "
                f"{provider} provider's custom autograd.Function / library op does not compose with it")
    interpreted = provider == "triton" and device == "cpu" and triton_interpreted()
    if not interpreted and (device not in PROVIDER_ORDER or provider not in PROVIDER_ORDER[device]):
        return f"provider {provider} does not run on {device} tensors"
    if device not in spec.supports.devices:
        return f"{spec.name} does not support device {device}"
    dtype = _dtype(args)
    if dtype is not None and dtype not in spec.supports.dtypes:
        return f"{spec.name} does not support dtype {dtype}"
    for check in (spec.supports.check, spec.provider_checks.get(provider)):
        if check is not None:
            reason = check(*args, **kwargs)
            if reason:
                return reason
    return None


def _candidates(spec: KernelSpec, args: tuple[Any, ...],
                kwargs: Mapping[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(provider, None if it can run this call else why not) for the kernel's providers, in order."""
    for p in PROVIDER_ORDER.get(_device_type(args), ("reference",)):
        if p == "reference" or p in spec.providers:
            yield p, why_not(spec, p, args, kwargs)


def runnable_providers(spec: KernelSpec, args: tuple[Any, ...],
                       kwargs: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """([providers that can run this call, in PROVIDER_ORDER], {other provider: reason}).

    Providers the kernel does not have are not listed; "reference" always runs, so the list is
    never empty.
    """
    runnable: list[str] = []
    skipped: dict[str, str] = {}
    for p, reason in _candidates(spec, args, kwargs):
        if reason is None:
            runnable.append(p)
        else:
            skipped[p] = reason
    return runnable, skipped


def select_provider(spec: KernelSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    provider: str | None = None, *, by_measurement: bool = False) -> tuple[str, dict[str, str]]:
    """Pick the provider for this call.

    Returns (chosen provider, {skipped provider: reason}). An explicit `provider` that cannot run
    raises ValueError with the reason, rather than silently running something else. Otherwise the
    first runnable provider in PROVIDER_ORDER, or with by_measurement=True the automatic choice
    `dispatch` makes (`kernels.tuning.choose`: measured unless FUSIONLENS_PROVIDER_CHOICE=order;
    a reused decision lists no skipped providers).
    """
    if provider is not None:
        reason = why_not(spec, provider, args, kwargs)
        if reason:
            raise ValueError(f"{spec.name}: provider {provider!r} unavailable: {reason}")
        return provider, {}
    if by_measurement and not torch.compiler.is_compiling():  # tracing sees only the order's code
        sig: Any = ...  # not computed: the memo may not answer now
        if memo_allowed():  # an identical call answered from a stored decision before
            sig = choice_memo.signature(spec.name, args, kwargs)
            known = choice_memo.get(sig)
            if known is not None and _missing(spec, known) is None:  # the call's own checks passed before
                return known, {}
        from kernels import tuning  # tuning imports this module

        choice = tuning.choose(spec, args, kwargs, signature=sig)  # a miss: remembered under `sig`
        return choice.provider, dict(choice.skipped)
    skipped: dict[str, str] = {}
    for p, reason in _candidates(spec, args, kwargs):  # lazily: stop at the first runnable one
        if reason is None:
            return p, skipped
        skipped[p] = reason
    return "reference", skipped


def dispatch(name: str, *args: Any, provider: str | None = None, **kwargs: Any) -> Any:
    """Run kernel `name` with the requested provider, or the automatic (measured) choice."""
    spec = KERNELS[name]
    if spec.autocast is not None and any_autocast() and upcast_now(spec.autocast.op, args, kwargs):  # as eager's
        return spec.autocast.call(*args, provider=provider, **kwargs)
    chosen, _ = select_provider(spec, args, kwargs, provider, by_measurement=provider is None)
    fn = spec.reference if chosen == "reference" else spec.providers[chosen]
    if torch.compiler.is_compiling():
        args, kwargs = _distinct_tensors(args, kwargs)
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, IndexError) as e:
        reason = _input_reason(spec, chosen, e, args, kwargs)
        if reason is None:
            raise
        raise KernelInputError(f"{name}: {reason}; the eager reference failed too: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


class KernelInputError(ValueError, RuntimeError):
    """Inputs no provider takes and the eager reference fails on: names the kernel and the
    providers' reason (e.g. a weight that does not match x), instead of a bare broadcasting error
    from the reference's ops. A RuntimeError too, as the reference's own error was."""


def _input_reason(spec: KernelSpec, chosen: str, error: BaseException, args: tuple, kwargs: dict) -> str | None:
    """Why the providers refused these inputs, when the reference, run in their place, failed on
    them too; None for other failures (out of memory, a provider's own error)."""
    if chosen != "reference" or isinstance(error, torch.OutOfMemoryError):
        return None
    dtype = _dtype(args)
    if dtype is not None and not dtype.is_floating_point:  # the cause, before any mismatch it leads to
        return f"{str(dtype).removeprefix('torch.')} input (it takes floating tensors)"
    try:
        return spec.supports.check(*args, **kwargs) if spec.supports.check else None
    except Exception:  # a check that cannot read these inputs explains nothing
        return None


def _distinct_tensors(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A tensor passed twice (swiglu(h, h), add_rms_norm(x, x, w)) becomes an alias the second
    time: Dynamo cannot trace an autograd.Function given the same tensor twice, and broke the
    graph there. Eager runs take the tensors as given. (Compared with `is`: `id()` of a tensor
    guards on the object, and a dynamic-shape graph would recompile for every new input.)"""
    values = [*args, *kwargs.values()]
    fixed = [v.view_as(v) if isinstance(v, torch.Tensor) and any(v is u for u in values[:i]) else v
             for i, v in enumerate(values)]
    return tuple(fixed[:len(args)]), dict(zip(kwargs, fixed[len(args):]))
