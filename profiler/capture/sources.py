"""Which capture sources will run here, and why the others will not (DESIGN.md, Capture).

The dashboard's "Sources" panel and any pre-flight check ask this module before a capture runs;
the runner records what was really off afterwards (`CaptureResult.sources_off`). Sources: Kineto
(torch.profiler), the untimed FLOPs/bytes pass, NVML counters, the cupti-python tracer and CUDA
itself. Each is a `SourceStatus` with a one-line reason when off. Pure: no streamlit, no drawing;
probes run lazily (never at import) and the environment probes are cached per process.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

from profiler.capture.backends import CapturePlan, available_backends

SOURCES = ("kineto", "flops", "nvml", "cupti", "cuda")
LABELS = {"kineto": "Kineto (torch.profiler)", "flops": "FLOPs/bytes pass", "nvml": "NVML counters",
          "cupti": "CUPTI tracer", "cuda": "CUDA"}


@dataclass(frozen=True)
class SourceStatus:
    """One source: on (it will run / is usable) or off with the reason (a human line)."""

    name: str
    on: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if self.name not in SOURCES:
            raise ValueError(f"unknown source {self.name!r} (known: {', '.join(SOURCES)})")
        if not self.on and not self.reason.strip():
            raise ValueError(f"source {self.name!r} is off without a reason")

    @property
    def label(self) -> str:
        return LABELS[self.name]


def cuda_unavailable_reason() -> Optional[str]:
    """None when torch sees a CUDA device, else why not (CPU build, no device, driver missing)."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is a CPU-only build"
    try:
        count = torch.cuda.device_count()
    except RuntimeError as exc:  # a broken driver raises here rather than returning 0
        return f"CUDA unavailable: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    if count == 0 or not torch.cuda.is_available():
        return "no CUDA device visible (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides every GPU)"
    return None


def nvml_unavailable_reason(nvml_module: Any = None) -> Optional[str]:
    """None when NVML initialises and lists at least one GPU, else why not (never raises).

    `nvml_module`: the pynvml module to probe (None = import it); the init is undone at once.
    """
    from profiler.capture.nvml import LIBRARY_NOT_FOUND

    pynvml = nvml_module
    if pynvml is None:
        try:
            import pynvml
        except ImportError:
            return "NVML unavailable: nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return LIBRARY_NOT_FOUND
    except pynvml.NVMLError as exc:
        return f"NVML unavailable: {type(exc).__name__}: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return f"NVML unavailable: listing devices failed: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return None if count > 0 else "NVML unavailable: the driver lists no GPU"


def nvml_off_by_plan(plan: CapturePlan) -> Optional[str]:
    """Why `plan` itself leaves NVML off (not CUDA, or turned off), else None. The runner uses it too."""
    if not plan.is_cuda:
        return "device is cpu (NVML samples NVIDIA GPUs only)"
    if not plan.nvml:
        return "turned off for this capture"
    return None


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, Optional[str]]:
    """Probe once per process: CUDA, NVML and each capture backend -> None (usable) or reason."""
    env: dict[str, Optional[str]] = {"cuda": cuda_unavailable_reason(), "nvml": nvml_unavailable_reason()}
    env.update({f"backend:{name}": reason for name, reason in available_backends().items()})
    return env


def plan_sources(plan: CapturePlan, env: Optional[dict[str, Optional[str]]] = None) -> list[SourceStatus]:
    """What a capture with `plan` will record here: one SourceStatus per source in SOURCES order.

    `env` is `environment()` (the default) or an equivalent mapping, so the rules can be checked
    on any machine. The reasons follow the runner's (`runner._run_backend`, `runner._nvml`).
    """
    env = environment() if env is None else env
    cuda = env.get("cuda")
    kineto_reason = env.get("backend:kineto", "the kineto backend is not registered")
    cupti_reason = env.get("backend:cupti", "the cupti backend is not registered")
    out = []
    if plan.backend == "kineto":
        out.append(SourceStatus("kineto", kineto_reason is None, kineto_reason or ""))
        out.append(SourceStatus("cupti", False, f"not used: {cupti_reason}" if cupti_reason else
                                "not used: Kineto is this capture's backend (CUPTI callbacks are process-wide)"))
    else:
        out.append(SourceStatus("kineto", False, f"not used: {plan.backend} is this capture's backend "
                                                 "(CUPTI callbacks are process-wide: never both)"))
        reason = env.get(f"backend:{plan.backend}", f"unknown capture backend {plan.backend!r}")
        if plan.backend == "cupti":
            out.append(SourceStatus("cupti", reason is None, reason or ""))
    out.insert(1, SourceStatus("flops", plan.flops, "" if plan.flops else "turned off for this capture"))
    nvml_off = nvml_off_by_plan(plan)
    if nvml_off:
        nvml = SourceStatus("nvml", False, nvml_off)
    else:
        nvml = SourceStatus("nvml", env.get("nvml") is None, env.get("nvml") or "")
    out.insert(2, nvml)
    if plan.is_cuda:
        out.append(SourceStatus("cuda", cuda is None, cuda or ""))
    else:
        out.append(SourceStatus("cuda", False, "device is cpu" + (f"; CUDA here: {cuda}" if cuda else "")))
    return sorted(out, key=lambda s: SOURCES.index(s.name))


def blocking_reason(plan: CapturePlan, env: Optional[dict[str, Optional[str]]] = None) -> Optional[str]:
    """None when `plan` can run here, else the one line why not (device or backend unusable)."""
    env = environment() if env is None else env
    if plan.is_cuda and env.get("cuda"):
        return f"device {plan.device} is unavailable here: {env['cuda']}"
    backend = env.get(f"backend:{plan.backend}", f"unknown capture backend {plan.backend!r}")
    if backend:
        return f"backend {plan.backend} is unavailable here: {backend}"
    return None
