"""Provider choice by measurement: time every provider that can run a call, keep the fastest.

On the first automatic call of a kernel for a new *key* (kernel, device, threads, grad or not, and
per tensor argument its dtype, a half-octave bucket of rows and of the last dim, contiguity; the
mode arguments that change the algorithm: bools, strings, ints, None; floats as 0, 1 or other),
`choose` runs every runnable provider on the call's own arguments, in interleaved rounds after a
warm-up, and keeps the one with the lowest median; ties within `TIE_FRACTION` go to the earlier
provider in `PROVIDER_ORDER`, so a choice does not flap. Later calls with the same key reuse it
(~10 us: key, lookup, checks), and a call identical to one answered so gets its provider from
`kernels/choice_memo.py` (~3 us). Decisions live in memory and in `<data dir>/tuning/
provider_choice.json` (`kernels/tuning_store.py`), under a fingerprint of the machine and builds.

What is timed is what the user will run: forward under no_grad, or forward + backward
(`torch.autograd.grad` from detached aliases of the inputs, against a fixed grad_output from a
private generator) when an input requires grad. Clock: process CPU time at one thread (immune to
other processes on a shared machine), wall time at more threads (where latency is what the
threads buy), CUDA events on GPUs. A decision stops after `BUDGET_S` (at least one timed round);
a provider `DROP_FACTOR` x slower than the fastest in the first round (and long) skips the rest.
A warm-up is never a sample: a first call can be 35x the next (SwiGLU fwd+bwd at 4096 x 3072 on
CPU: 765 ms, then 22 ms: fresh pages), so each candidate is timed once more, however long. The
measured outputs are dropped: the real call runs afterwards with the chosen provider. A kernel
whose calls are long can name a cheaper call that ranks its providers the same way
(`KernelSpec.measure_call`: a fused linear + CE times 8 of its token chunks).

Never measured (the order decides, nothing is stored; a stored decision is still used): inside
torch.compile tracing or a JIT trace, under `poison_outputs()`, while a CUDA graph is captured, the
autograd profiler records, or a TorchDispatchMode, a torch.func transform or forward-mode AD is
active. Saved-tensor hooks (`torch.utils.checkpoint`, `save_on_cpu`) are set aside while measuring:
the timing runs' graphs are not the model's. `FUSIONLENS_PROVIDER_CHOICE=order` turns measuring
off. Optimizers stay on the order: their providers mutate state and `select_provider` sees only a
representative tensor, not the call.
"""
from __future__ import annotations

import inspect
import os
import random
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

import torch

from kernels import choice_memo, profiled_ops, registry
from kernels.registry import KERNELS, PROVIDER_ORDER, KernelSpec
from kernels.tuning_store import DecisionStore

ENV_MODE = "FUSIONLENS_PROVIDER_CHOICE"
MODES = ("measure", "order")
BUDGET_S = 0.3  # wall seconds per decision (warm-ups included); at least one timed round
MAX_ROUNDS = 9  # timed rounds per decision when calls are cheap
TIE_FRACTION = 0.05  # within 5% of the fastest: the earlier provider in PROVIDER_ORDER wins
SAMPLE_TARGET_S = 2e-4  # a sample repeats a cheap call until it lasts about this long
MAX_INNER = 64
DROP_FACTOR = 4.0  # this many times slower than the fastest in the first round ...
DROP_MIN_S = 0.015  # ... and at least this long per call: no later rounds for that provider
NOTICE_S = 1.0  # warm-ups longer than this in all: say on stderr what the pause is (once per decision)


@dataclass(frozen=True)
class Choice:
    """How the provider of one call was chosen, for `provider_choice` and the UI.

    how: "explicit" (provider=), "order" (first runnable in PROVIDER_ORDER), "measured" (timed
    now), "cached" (timed earlier in this process) or "stored" (read from the JSON file).
    times_us: median microseconds per call for each measured provider (empty unless measured).
    skipped: provider -> why it could not run (or failed while measured).
    note: why the order decided although measuring is on (e.g. "one runnable provider").
    """

    kernel: str
    provider: str
    how: str
    key: str = ""
    times_us: Mapping[str, float] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    clock: str = ""
    grad: bool = False
    rounds: int = 0
    decision_s: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        if self.how not in ("explicit", "order", "measured", "cached", "stored"):
            raise ValueError(f"unknown choice kind {self.how!r}")
        if self.how in ("measured", "cached", "stored") and self.provider not in self.times_us:
            raise ValueError(f"{self.kernel}: measured choice {self.provider!r} has no time")

    def as_record(self) -> dict[str, Any]:
        """The JSON record of a measured decision (what the store keeps)."""
        return {"provider": self.provider, "times_us": dict(self.times_us), "skipped": dict(self.skipped),
                "clock": self.clock, "grad": self.grad, "rounds": self.rounds, "note": self.note,
                "decision_s": round(self.decision_s, 4), "load1": _load1(),
                "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _load1() -> float | None:
    """The 1-minute load average when the decision was measured (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def mode() -> str:
    """The automatic-choice mode from FUSIONLENS_PROVIDER_CHOICE: "measure" (default) or "order"."""
    value = os.environ.get(ENV_MODE, "measure").strip().lower() or "measure"
    if value not in MODES:
        raise ValueError(f"{ENV_MODE} must be 'measure' or 'order', got {value!r}")
    return value


# ---------------------------------------------------------------- keys
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool)}
def _bucket(n: int) -> str:
    """Half-octave bucket of a size, floor(2 log2 n) / 2: 768 -> '2^9.5', 4096 -> '2^12', 0 -> '0'."""
    if n <= 0:
        return "0"
    b = n.bit_length() - 1  # 2^b <= n < 2^(b+1); the upper half-octave starts at 2^b * sqrt(2)
    return f"2^{b}.5" if n * n >= 1 << (2 * b + 1) else f"2^{b}"


def _part(v: Any) -> str:
    if v is None or v is True or v is False:
        return repr(v)
    if isinstance(v, torch.Tensor):
        cols = v.shape[-1] if v.dim() else 1
        rows = v.numel() // cols if cols else 0
        strided = "" if v.is_contiguous() else ",strided"
        return f"{_DTYPE_NAMES.get(v.dtype) or v.dtype}[{_bucket(rows)}x{_bucket(cols)}{strided}]"
    if isinstance(v, (int, str)):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if v in (0.0, 1.0) else "float"  # offset 0 / 1, scale 1 / other, smoothing off / on
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_part(x) for x in v) + ")"
    return type(v).__name__


def default_key(*args: Any, **kwargs: Any) -> str:
    """Size bucket and mode of a call: every argument through `_part`, kwargs by name."""
    parts = [_part(a) for a in args] + [f"{k}={_part(v)}" for k, v in sorted(kwargs.items())]
    return ",".join(parts)


def _wants_grad(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in (*args, *kwargs.values()))


_PARAMS: dict[Callable[..., Any], tuple[tuple[str, Any], ...]] = {}


def _parameters(fn: Callable[..., Any]) -> tuple[tuple[str, Any], ...]:
    """(name, default) of fn's parameters, () if it takes *args / **kwargs (cached per function)."""
    if fn not in _PARAMS:
        params = inspect.signature(fn).parameters.values()
        flexible = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
        _PARAMS[fn] = () if flexible else tuple((p.name, p.default) for p in params)
    return _PARAMS[fn]


def _spec_key(spec: KernelSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """`default_key` of the call's arguments in the reference's parameter order with defaults
    filled in, so `softmax(x)` and `softmax(x, -1, 1.0, None, False)` share a key."""
    params = _parameters(spec.reference)
    if not params or len(args) > len(params) or not set(kwargs) <= {n for n, _ in params}:
        return default_key(*args, **kwargs)  # not bindable: the raw arguments
    values = list(args)
    for name, default in params[len(args):]:
        values.append(kwargs.get(name, default))
    return default_key(*values)


def call_key(spec: KernelSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any], grad: bool) -> str:
    """The decision key of a call (a string: it is also the JSON key)."""
    device = registry._device_type(args)
    threads = f"t{torch.get_num_threads()}" if device == "cpu" else device
    body = spec.tune_key(*args, **kwargs) if spec.tune_key else _spec_key(spec, args, kwargs)
    return f"{spec.name}|{device}|{threads}|{'fwd+bwd' if grad else 'fwd'}|{body}"


# ---------------------------------------------------------------- when not to measure
_LOCAL = threading.local()


def _tracing() -> bool:
    """torch.compile or torch.jit.trace is tracing: sizes may be symbolic (a JIT trace's numel() is
    a tensor), so no key is computed and nothing is measured."""
    return torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None


def _not_now(args: tuple[Any, ...]) -> str | None:
    """Why this call must not be timed now (None: it may be)."""
    if _tracing():
        return "inside torch.compile / JIT tracing"
    if registry.poisoning():
        return "poison_outputs() is active"
    if getattr(_LOCAL, "depth", 0):
        return "a measurement is already running on this thread"
    if torch._C._autograd._profiler_enabled():
        return "the autograd profiler is recording"
    if profiled_ops.dispatch_mode_active():  # a recorder would log the timing runs as the model's
        return "a TorchDispatchMode is active"  # ops; under FakeTensorMode they time nothing real
    if registry.plain_ops_only():  # the arguments are wrapped or dual tensors
        return "a torch.func transform or forward-mode AD is active"
    if registry._device_type(args) == "cuda" and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured"
    return None


@contextmanager
def _saved_tensor_hooks_aside():
    """Run without this thread's saved-tensor hooks, then put them back in the same order.

    torch.utils.checkpoint (non-reentrant) packs every tensor its forward saves and requires the
    recomputation to save as many: timing runs inside the first forward (the recomputation reuses
    the decision) broke that count. save_on_cpu would copy the timing runs' tensors to the host.
    """
    hooks = []
    for _ in range(256):  # a stack this deep is not real; the bound keeps a surprise from spinning
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        if top is None:
            break
        hooks.append(top)
        torch._C._autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(hooks):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


# ---------------------------------------------------------------- timing
def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _tensors(o)] if isinstance(out, (tuple, list)) else []


def _runner(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
            grad: bool) -> Callable[[], None]:
    """A closure that runs one call the way the user will: forward only, or forward + backward."""
    if not grad:
        def forward() -> None:
            with torch.no_grad():
                fn(*args, **kwargs)
        return forward

    def alias(v: Any) -> Any:  # a fresh leaf on the same memory: no copy, no autograd history
        return v.detach().requires_grad_(True) if isinstance(v, torch.Tensor) and v.requires_grad else v

    a = tuple(alias(v) for v in args)
    kw = {k: alias(v) for k, v in kwargs.items()}
    leaves = [v for v in (*a, *kw.values()) if isinstance(v, torch.Tensor) and v.requires_grad]
    gen = torch.Generator(device=leaves[0].device).manual_seed(0)  # never the global RNG
    grad_outputs: dict[tuple, torch.Tensor] = {}

    def forward_backward() -> None:
        with torch.enable_grad():
            outs = [o for o in _tensors(fn(*a, **kw)) if o.requires_grad]
            if not outs:
                raise RuntimeError("no output requires grad, so the backward cannot be timed")
            gos = []
            for o in outs:
                k = (tuple(o.shape), o.dtype, o.device)
                if k not in grad_outputs:
                    grad_outputs[k] = torch.randn(o.shape, generator=gen, dtype=o.dtype, device=o.device)
                gos.append(grad_outputs[k])
            torch.autograd.grad(outs, leaves, gos, allow_unused=True)
    return forward_backward


def _clock(device: str) -> tuple[str, Callable[[], float]]:
    if device == "cuda":
        return "cuda_events", time.perf_counter
    if device == "cpu" and torch.get_num_threads() == 1:
        return "process_cpu", time.process_time
    return "wall", time.perf_counter


def _sample_s(run: Callable[[], None], inner: int, device: torch.device, clock: Callable[[], float]) -> float:
    """Seconds per call: `inner` calls timed together (CUDA: events after a synchronize)."""
    if device.type == "cuda":
        with torch.cuda.device(device):  # the events go on the stream the kernels run on
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / inner
    t0 = clock()
    for _ in range(inner):
        run()
    return (clock() - t0) / inner


class Measurement(NamedTuple):
    times_us: dict[str, float]  # median microseconds per call
    failed: dict[str, str]  # provider -> why it failed while measured
    clock: str
    rounds: int
    first_round_only: tuple[str, ...]  # far slower than the best in round 1: not timed again


def measure(spec: KernelSpec, candidates: list[str], args: tuple[Any, ...], kwargs: Mapping[str, Any],
            grad: bool, budget_s: float | None = None) -> Measurement:
    """Median microseconds per call of each candidate.

    Each candidate is warmed up once (which also sizes its repetitions), then the candidates are
    timed in rounds, in a seeded shuffled order, until the budget is spent: no provider always runs
    first or always right after the same one (on CPU the one after an unfused chain pays the page
    faults of the memory that chain just freed; a fixed rotation keeps each one's predecessor). A
    candidate whose first timed call took over DROP_FACTOR x the fastest one's, and long enough
    to matter to the budget, cannot win: it skips the later rounds. (Judged after a warm-up, not
    on it: a first call can be 100x slower than the next, e.g. fresh pages for the outputs.)
    """
    budget_s = BUDGET_S if budget_s is None else budget_s
    device = next((v.device for v in args if isinstance(v, torch.Tensor)), torch.device("cpu"))
    clock_name, clock = _clock(device.type)
    start = time.perf_counter()
    runs: dict[str, Callable[[], None]] = {}
    warm: dict[str, float] = {}
    failed: dict[str, str] = {}
    noticed = False
    for p in candidates:
        fn = spec.reference if p == "reference" else spec.providers[p]
        try:
            run = _runner(fn, args, kwargs, grad)
            warm[p] = _sample_s(run, 1, device, clock)
        except Exception as exc:  # a provider that fails is skipped with its reason
            first = (str(exc).strip().splitlines() or [""])[0]
            failed[p] = f"failed while measured: {type(exc).__name__}: {first}"
            continue
        runs[p] = run
        if not noticed and sum(warm.values()) > NOTICE_S:  # a big kernel's first call pauses for seconds
            noticed = True
            print(f"FusionLens: timing {len(candidates)} providers of {spec.name} once for this shape class "
                  f"({sum(warm.values()):.0f} s so far; the fastest is kept per machine, "
                  f"{ENV_MODE}=order skips measuring; `python -m kernels decisions` lists them)",
                  file=sys.stderr, flush=True)
    samples: dict[str, list[float]] = {p: [] for p in runs}
    inner = {p: max(1, min(MAX_INNER, int(SAMPLE_TARGET_S / max(w, 1e-7)))) for p, w in warm.items()}
    timed, slow = list(runs), ()
    rounds = 0
    shuffler = random.Random(0)  # private and seeded: the global RNG is not touched
    # at least one timed round after the warm-ups, then rounds until the budget is spent
    while timed and rounds < MAX_ROUNDS and not (rounds and time.perf_counter() - start >= budget_s):
        order = list(timed)
        shuffler.shuffle(order)
        for p in order:
            samples[p].append(_sample_s(runs[p], inner[p], device, clock))
        rounds += 1
        if rounds == 1:  # hopeless and costly after a warm-up and a timed call: no more rounds
            best = min(s[0] for s in samples.values())
            slow = tuple(p for p in timed if samples[p][0] > DROP_FACTOR * best and samples[p][0] > DROP_MIN_S)
            timed = [p for p in timed if p not in slow]
    times_us = {p: statistics.median(s) * 1e6 for p, s in samples.items()}
    return Measurement(times_us, failed, clock_name, rounds, slow)


def pick(times_us: Mapping[str, float], order: tuple[str, ...], tie: float = TIE_FRACTION) -> str:
    """The fastest provider; among those within `tie` of it, the earliest in `order`."""
    best = min(times_us.values())
    for p in order:
        if p in times_us and times_us[p] <= best * (1.0 + tie):
            return p
    return min(times_us, key=times_us.__getitem__)


# ---------------------------------------------------------------- decisions
_STORE = DecisionStore()


def _order_choice(spec: KernelSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any], note: str,
                  report: bool) -> Choice:
    """The order's pick; report=True checks every provider, else stops at the first runnable."""
    if report:
        runnable, skipped = registry.runnable_providers(spec, args, kwargs)
        return Choice(spec.name, runnable[0], "order", skipped=skipped, note=note)
    chosen, skipped = registry.select_provider(spec, args, kwargs)
    return Choice(spec.name, chosen, "order", skipped=skipped, note=note)


def _from_record(spec: KernelSpec, rec: dict, how: str, key: str, skipped: Mapping[str, str]) -> Choice:
    return Choice(spec.name, rec["provider"], how, key=key, times_us=rec["times_us"], skipped=skipped,
                  clock=rec.get("clock", ""), grad=bool(rec.get("grad")), rounds=int(rec.get("rounds", 0)),
                  decision_s=float(rec.get("decision_s", 0.0)), note=str(rec.get("note", "")))


def choose(spec: KernelSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
           report: bool = False, signature: Any = ...) -> Choice:
    """The automatic provider of this call: measured once per key, then reused.

    report=True also fills `skipped` for every provider on a reused decision (the UI's view);
    dispatch leaves it off, so a reused decision costs one support check of the chosen provider.
    `signature`: the call's `choice_memo.signature` when the caller computed it already."""
    if mode() == "order":
        return _order_choice(spec, args, kwargs, f"{ENV_MODE}=order", report)
    if _tracing() or registry.poisoning():  # no key, no lookup: the order
        return _order_choice(spec, args, kwargs, f"not measured: {_not_now(args)}", report)
    grad = _wants_grad(args, kwargs)
    key = call_key(spec, args, kwargs, grad)
    device = next((v.device for v in args if isinstance(v, torch.Tensor)), torch.device("cpu"))
    since, found = choice_memo.generation(), _STORE.get(key, device)
    if found is not None and found.record["provider"] == "reference" and not spec.reference_measured:
        found = None  # a decision stored before the reference stopped being a candidate
    if found is not None and registry.why_not(spec, found.record["provider"], args, kwargs) is None:
        if report:
            skipped = registry.runnable_providers(spec, args, kwargs)[1]
            return _from_record(spec, found.record, found.how, key, skipped)
        if found.memo is None:
            found.memo = _from_record(spec, found.record, found.how, key, {})
        choice_memo.remember(spec.name, args, kwargs, found.memo.provider, since, signature)  # identical calls
        return found.memo
    runnable, skipped = registry.runnable_providers(spec, args, kwargs)
    if not spec.reference_measured and len(runnable) > 1:
        runnable = [p for p in runnable if p != "reference"]
        skipped = {**skipped, "reference": "not a measured candidate: it materialises what this kernel avoids"}
    if found is not None:  # same key, but this call's checks rule the stored provider out
        times = {p: t for p, t in found.record["times_us"].items() if p in runnable}
        if times:
            return Choice(spec.name, pick(times, tuple(runnable)), "cached", key=key, times_us=times,
                          skipped=skipped, grad=grad, clock=found.record.get("clock", ""))
    if len(runnable) == 1:
        return Choice(spec.name, runnable[0], "order", key=key, skipped=skipped, grad=grad,
                      note="one runnable provider: nothing to measure")
    blocked = _not_now(args)
    if blocked:
        return Choice(spec.name, runnable[0], "order", key=key, skipped=skipped, grad=grad,
                      note=f"not measured: {blocked}")
    return _decide(spec, args, kwargs, key, device, runnable, skipped, grad, store=found is None)


def _decide(spec: KernelSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any], key: str,
            device: torch.device, runnable: list[str], skipped: dict[str, str], grad: bool,
            store: bool) -> Choice:
    """Measure the runnable providers, pick, and keep the decision."""
    t0 = time.perf_counter()
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        with _saved_tensor_hooks_aside():
            smaller = spec.measure_call(args, kwargs) if spec.measure_call is not None else None
            timed_args, timed_kwargs, part = smaller if smaller is not None else (args, kwargs, "")
            m = measure(spec, runnable, timed_args, timed_kwargs, grad)
    finally:
        _LOCAL.depth -= 1
    skipped = {**skipped, **m.failed}
    if not m.times_us:
        return Choice(spec.name, runnable[0], "order", key=key, skipped=skipped, grad=grad,
                      note="every provider failed while measured")
    order = PROVIDER_ORDER.get(device.type, tuple(runnable))
    dropped = f"timed in the first round only (over {DROP_FACTOR:g}x the fastest): {', '.join(m.first_round_only)}" \
        if m.first_round_only else ""
    note = "; ".join(n for n in (part, dropped) if n)
    choice = Choice(spec.name, pick(m.times_us, order, TIE_FRACTION), "measured", key=key, times_us=m.times_us,
                    skipped=skipped, clock=m.clock, grad=grad, rounds=m.rounds,
                    decision_s=time.perf_counter() - t0, note=note)
    if store:
        _STORE.put(key, device, choice.as_record())
    return choice


def provider_choice(name: str, *args: Any, provider: str | None = None, **kwargs: Any) -> Choice:
    """How `kernels.<name>(*args, **kwargs)` would choose its provider, without running the call.

    Measures (and keeps) the decision if this call's key was never measured. Returns a `Choice`:
    the provider, the median time per measured provider, the reason for each skipped provider.
    An explicit `provider=` that cannot run raises ValueError with the reason, as dispatch does.
    """
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r} (known: {', '.join(sorted(KERNELS))})")
    spec = KERNELS[name]
    if provider is not None:
        chosen, _ = registry.select_provider(spec, args, kwargs, provider)
        return Choice(name, chosen, "explicit")
    return choose(spec, args, kwargs, report=True)


def forget_decisions() -> None:
    """Forget the in-memory decisions (tests; after changing threads the key changes anyway)."""
    _STORE.forget()  # and the exact-call memo


def stored_decisions(device: torch.device) -> dict[str, dict]:
    """{call key: record} of every decision kept for this machine and build on `device`'s type."""
    return _STORE.stored(device)


def drop_stored_decisions(device: torch.device) -> int:
    """Drop this machine's decisions for `device`'s type, file included; returns how many."""
    return _STORE.drop_machine(device)
