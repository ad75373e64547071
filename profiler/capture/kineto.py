"""The default capture backend: torch.profiler (Kineto) on CPU and CUDA (DESIGN.md, Capture).

A schedule of wait/warmup/active steps (repeat once), `ProfilerStep#N` markers from `prof.step()`,
`record_shapes`, optional memory and stack recording. The Kineto JSON is written to `out_dir`
(Perfetto and TensorBoard open it) and loaded with `profiler.trace.load_trace`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from profiler.capture.backends import CaptureError, CapturePlan, CaptureResult, ProgressFn, register_backend


def trace_filename(rank: int) -> str:
    """Per-rank file name: one Kineto JSON per rank in the same directory."""
    return f"kineto_rank{rank}.pt.trace.json"


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _cuda_reason(plan: CapturePlan) -> Optional[str]:
    if plan.is_cuda and not torch.cuda.is_available():
        return "CUDA requested but torch.cuda.is_available() is False"
    return None


def _load_trace() -> Callable:
    """The Kineto JSON loader (profiler.trace.load_trace)."""
    try:
        from profiler.trace import load_trace
    except ImportError:  # older tree: the loader lives in profiler.trace.ingest
        from profiler.trace.ingest import load_trace
    return load_trace


@register_backend("kineto")
def kineto_backend(step_fn: Callable[[int], None], plan: CapturePlan, out_dir: Path,
                   progress: Optional[ProgressFn] = None) -> CaptureResult:
    """torch.profiler (Kineto): CPU ops, plus CUDA runtime and kernels on GPU."""
    reason = _cuda_reason(plan)
    if reason:
        raise CaptureError(reason)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.is_cuda else [])
    path = Path(out_dir) / trace_filename(_rank())
    written: list[float] = []

    def on_ready(prof: profile) -> None:
        t0 = time.perf_counter()
        prof.export_chrome_trace(str(path))
        written.append(time.perf_counter() - t0)

    sched = schedule(wait=plan.wait, warmup=plan.warmup, active=plan.active, repeat=1)
    t0 = time.perf_counter()
    with profile(activities=activities, schedule=sched, on_trace_ready=on_ready,
                 record_shapes=plan.record_shapes, profile_memory=plan.profile_memory,
                 with_stack=plan.with_stack, acc_events=False) as prof:
        for i in range(plan.steps):
            step_fn(i)
            prof.step()
            if progress:
                phase = "wait" if i < plan.wait else "warmup" if i < plan.wait + plan.warmup else "active"
                progress(i + 1, plan.steps, f"step {i + 1}/{plan.steps} ({phase})")
    run_s = time.perf_counter() - t0
    if not path.exists():
        raise CaptureError(f"the profiler wrote no trace to {path}")
    t1 = time.perf_counter()
    trace = _load_trace()(path)
    timings = {"run_s": run_s - sum(written), "export_s": sum(written), "load_s": time.perf_counter() - t1}
    return CaptureResult(trace, path, {}, timings)
