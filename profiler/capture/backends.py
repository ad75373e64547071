"""Capture backends: a registry of ways to run a model's steps under a profiler (DESIGN.md, Capture).

A backend is a function

    fn(step_fn, plan, out_dir, progress=None) -> CaptureResult

- `step_fn(i: int) -> None` runs training/inference step `i` (0-based) and synchronises the
  device, so a backend only has to call it `plan.steps` times (wait + warmup + active) and mark
  step boundaries the way its profiler wants (Kineto: `prof.step()`).
- `plan` is a `CapturePlan` (frozen, validated): what to record.
- `out_dir` is an existing directory; the backend writes its raw trace there (Kineto: a
  Perfetto-openable JSON) and returns its path.
- `progress(done_steps, total_steps, message)` is an optional callback for progress bars.

It returns a `CaptureResult`: the `Trace`, the raw trace path, `sources_off` (source -> one-line
reason it was off, e.g. {"nvml": "no NVIDIA driver: NVMLError_LibraryNotFound"}) and timings.

Backends register with `@register_backend(name, probe=...)`; a duplicate name is an error. `probe`
(optional) returns None when the backend can run here, else the reason it cannot; it is called
lazily and cached. Built-in backend modules (imported on first lookup, never at import time):
`profiler.capture.kineto` (default) and `profiler.capture.cupti_tracer` (the cupti-python
kernel-only tracer). A missing built-in module is skipped; its absence is reported by name.

NVML is not a backend: the runner wraps any backend in `profiler.capture.nvml.NvmlSampler(hz=50)`
on CUDA (a context manager with `.unavailable_reason: str | None` and `.samples() -> DataFrame`
with `profiler.trace.schema.COUNTER_COLUMNS`) and merges the samples into `Trace.counters`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Protocol

from profiler.errors import FusionLensError
from profiler.trace.model import Trace

DEVICES = ("cpu", "cuda")
MODES = ("train", "infer")
DTYPES = ("float32", "float16", "bfloat16", "float64")
AUTOCAST_DTYPES = (None, "bfloat16", "float16")
BUILTIN_BACKEND_MODULES = ("profiler.capture.kineto", "profiler.capture.cupti_tracer")

ProgressFn = Callable[[int, int, str], None]


class CaptureError(FusionLensError):
    """A capture could not run (unknown backend, unusable device, ...): one human line."""


@dataclass(frozen=True)
class CapturePlan:
    """What one capture records. `steps` = wait + warmup + active steps run in total.

    wait: steps run unprofiled first; warmup: profiled but discarded (Kineto warm-up);
    active: steps kept in the trace. nvml: sample NVML counters when on CUDA.
    record_shapes: Kineto records every op's input shapes in the timed steps (heavier, see
    benchmarks/bench_capture.py); off by default because every op the cost pass matches gets its
    shapes and dtypes from that untimed pass, in the same format.
    flops: run the separate untimed FLOPs/bytes pass and join it to the trace.
    autocast: None, or "bfloat16"/"float16": mixed-precision steps (fp32 weights, the forward and
    loss under torch.autocast, fp16 with a GradScaler), as AMP training runs; needs dtype float32.
    """

    device: str = "cpu"
    dtype: str = "float32"
    mode: str = "train"
    wait: int = 1
    warmup: int = 1
    active: int = 3
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    nvml: bool = True
    flops: bool = True
    backend: str = "kineto"
    autocast: Optional[str] = None

    def __post_init__(self) -> None:
        kind, sep, index = self.device.partition(":")
        if kind not in DEVICES or (sep and (kind != "cuda" or not index.isdigit())):
            raise CaptureError(f"device must be one of {DEVICES} (optionally cuda:N), got {self.device!r}")
        if self.dtype not in DTYPES:
            raise CaptureError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.autocast not in AUTOCAST_DTYPES:
            raise CaptureError(f"autocast must be one of {AUTOCAST_DTYPES[1:]} or off, got {self.autocast!r}")
        if self.autocast and self.dtype != "float32":
            raise CaptureError(f"autocast {self.autocast} runs over fp32 weights: use dtype float32, not {self.dtype}")
        if self.mode not in MODES:
            raise CaptureError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name, low in (("wait", 0), ("warmup", 0), ("active", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 10_000:
                raise CaptureError(f"{name} steps must be an integer in [{low}, 10000], got {value!r}")

    @property
    def steps(self) -> int:
        """Total steps the backend runs: wait + warmup + active."""
        return self.wait + self.warmup + self.active

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class CaptureResult:
    """One capture's output. timings: phase -> seconds (e.g. run_s, export_s, load_s)."""

    trace: Trace
    raw_path: Optional[Path]
    sources_off: Mapping[str, str] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.trace, Trace):
            raise TypeError(f"CaptureResult.trace must be a Trace, got {type(self.trace).__name__}")
        object.__setattr__(self, "sources_off", MappingProxyType(dict(self.sources_off)))
        object.__setattr__(self, "timings", MappingProxyType(dict(self.timings)))

    def __reduce__(self) -> tuple:
        """Pickles (profiler.capture.isolated sends it from the capture's child process) with
        plain dicts in place of the read-only mapping views, which cannot be pickled."""
        return (type(self), (self.trace, self.raw_path, dict(self.sources_off), dict(self.timings)))


class BackendFn(Protocol):
    def __call__(self, step_fn: Callable[[int], None], plan: CapturePlan, out_dir: Path,
                 progress: Optional[ProgressFn] = None) -> CaptureResult: ...


@dataclass(frozen=True)
class Backend:
    """A registered backend and its availability probe (None = always available)."""

    name: str
    fn: BackendFn
    probe: Optional[Callable[[], Optional[str]]] = None
    doc: str = ""


BACKENDS: dict[str, Backend] = {}
_PROBED: dict[str, Optional[str]] = {}
_MISSING_MODULES: dict[str, str] = {}


def register_backend(name: str, probe: Optional[Callable[[], Optional[str]]] = None):
    """Decorator: register a capture backend under `name`; a duplicate name raises ValueError."""

    def wrap(fn: BackendFn) -> BackendFn:
        if name in BACKENDS:
            raise ValueError(f"capture backend {name!r} is already registered")
        doc = (fn.__doc__ or "").strip().splitlines()
        BACKENDS[name] = Backend(name, fn, probe, doc[0] if doc else "")
        return fn

    return wrap


def load_builtin_backends() -> None:
    """Import the built-in backend modules once; a module that is not there is noted, not fatal."""
    for module in BUILTIN_BACKEND_MODULES:
        if module in _MISSING_MODULES:
            continue
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # the module exists but one of its imports does not
                raise
            _MISSING_MODULES[module] = f"module {module} is not installed"


def unavailable_reason(name: str) -> Optional[str]:
    """None when backend `name` can run here, else one line saying why not (cached)."""
    load_builtin_backends()
    if name not in BACKENDS:
        return f"unknown capture backend {name!r} (known: {', '.join(sorted(BACKENDS)) or 'none'})"
    if name not in _PROBED:
        probe = BACKENDS[name].probe
        try:
            _PROBED[name] = probe() if probe else None
        except Exception as exc:  # a probe must never crash a capture: its failure is the reason
            _PROBED[name] = f"{name} probe failed: {type(exc).__name__}: {exc}"
    return _PROBED[name]


def get_backend(name: str) -> Backend:
    """The backend `name`, or CaptureError naming why it cannot be used here."""
    reason = unavailable_reason(name)
    if reason and name not in BACKENDS:
        raise CaptureError(reason)
    if reason:
        usable = [b for b in sorted(BACKENDS) if b != name and unavailable_reason(b) is None]
        raise CaptureError(f"backend {name!r}: {reason}" + (f" (usable here: {', '.join(usable)})" if usable else ""))
    return BACKENDS[name]


def available_backends() -> dict[str, Optional[str]]:
    """Every known backend -> None (usable) or the reason it is not."""
    load_builtin_backends()
    return {name: unavailable_reason(name) for name in sorted(BACKENDS)}
