"""The default capture backend: torch.profiler (Kineto) on CPU and CUDA (DESIGN.md, Capture).

A schedule of wait/warmup/active steps (repeat once), `ProfilerStep#N` markers from `prof.step()`,
`record_shapes`, optional memory and stack recording. The Kineto JSON is written to `out_dir`
(Perfetto and TensorBoard open it) and loaded with `profiler.trace.load_trace`.

`profiler_options(plan)` is the one place the profiler's settings are chosen; the backend and
`benchmarks/bench_capture.py` both use it, so the overhead the benchmark reports is the capture's.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch._C._profiler import _ExperimentalConfig

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


def external_correlation(plan: CapturePlan) -> bool:
    """Whether Kineto tags ops with External ids: only where there is device activity to link."""
    return plan.is_cuda


def profiler_options(plan: CapturePlan) -> dict[str, Any]:
    """Keyword arguments for `torch.profiler.profile` (no schedule) that capture `plan`.

    Only what the plan asks for is on: no `with_modules`/`with_flops` (FLOPs and shapes come from
    the untimed cost pass). On CPU, external correlation is off: it pushes and pops each op's id on
    Kineto's device-correlation stack (~0.02 of Kineto's ~0.3 us per op, bench_capture.py) only
    to tag GPU activity, which a CPU trace has none of; ops keep their own External id. On CUDA it
    stays on: the FLOPs join and kernel attribution read the kernels' External id.
    """
    return dict(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.is_cuda else []),
                record_shapes=plan.record_shapes, profile_memory=plan.profile_memory,
                with_stack=plan.with_stack, with_modules=False, with_flops=False, acc_events=False,
                experimental_config=_ExperimentalConfig(disable_external_correlation=not external_correlation(plan)))


@register_backend("kineto")
def kineto_backend(step_fn: Callable[[int], None], plan: CapturePlan, out_dir: Path,
                   progress: Optional[ProgressFn] = None) -> CaptureResult:
    """torch.profiler (Kineto): CPU ops, plus CUDA runtime and kernels on GPU."""
    reason = _cuda_reason(plan)
    if reason:
        raise CaptureError(reason)
    path = Path(out_dir) / trace_filename(_rank())
    written: list[float] = []

    def on_ready(prof: profile) -> None:
        t0 = time.perf_counter()
        prof.export_chrome_trace(str(path))
        written.append(time.perf_counter() - t0)

    sched = schedule(wait=plan.wait, warmup=plan.warmup, active=plan.active, repeat=1)
    t0 = time.perf_counter()
    with profile(schedule=sched, on_trace_ready=on_ready, **profiler_options(plan)) as prof:
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
