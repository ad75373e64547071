"""The default capture backend: torch.profiler (Kineto) on CPU and CUDA (DESIGN.md, Capture).

A schedule of wait/warmup/active steps (one cycle), a `ProfilerStep#N` marker around every
active step, optional shapes, memory and stack recording. The Kineto JSON is written to `out_dir`
(Perfetto and TensorBoard open it) and loaded with `profiler.trace.load_trace`.

`profiler_options(plan)` (settings) and `step_marker` (the per-step annotation) are used by both the
backend and `benchmarks/bench_capture.py`, so the overhead the benchmark reports is the capture's.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

from profiler.capture.backends import CaptureError, CapturePlan, CaptureResult, ProgressFn, register_backend


STEP_MARKER = "ProfilerStep#"  # torch.profiler's step annotation name; the loader finds steps by it
# Kineto's log threshold above all its severities. torch 2.13's Kineto prints two lines to stderr
# per capture ("USDT:... profiler_start" / "profiler_stop"); on a CPU capture it has nothing else
# to say. On CUDA its warnings (e.g. CUPTI permissions) matter, so they are kept there.
KINETO_QUIET = "6"


def quiet_kineto_on_cpu(device: str) -> None:
    """For a command-line CPU capture: silence Kineto's stderr log unless the user set
    KINETO_LOG_LEVEL. Kineto reads it once, when the process first profiles, so call this before;
    it changes this process's environment (and its DDP workers'), so the library never calls it."""
    if str(device).startswith("cpu"):
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


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
    Kineto's device-correlation stack (~0.02-0.04 of Kineto's ~0.3 us per op, bench_capture.py) only
    to tag GPU activity, which a CPU trace has none of; ops keep their own External id. On CUDA it
    stays on: the FLOPs join and kernel attribution read the kernels' External id.
    """
    return dict(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.is_cuda else []),
                record_shapes=plan.record_shapes, profile_memory=plan.profile_memory,
                with_stack=plan.with_stack, with_modules=False, with_flops=False, acc_events=False,
                experimental_config=_ExperimentalConfig(disable_external_correlation=not external_correlation(plan)))


def step_marker(step_fn: Callable[[int], None]) -> Callable[[int], None]:
    """step_fn(i) inside a `ProfilerStep#i` user annotation, opened and closed from C++ directly.

    The same USER_SCOPE event `profile.step()` writes (the loader assigns steps by it), without
    its Python path: after a model step, `profile.step()` took ~40 us (its `record_function`
    goes through `torch.ops.profiler`; plus `os.environ` and `_is_kineto_stopped` lookups) against
    ~5 us here; on a 1 ms inference step that was ~3-4% of overhead (bench_capture.py,
    variants kineto-profstep vs kineto). (`_RecordFunctionFast` is cheaper but records a cpu_op.)
    """
    enter, leave = torch.autograd._record_function_with_args_enter, torch.autograd._record_function_with_args_exit

    def marked(i: int) -> None:
        handle = enter(f"{STEP_MARKER}{i}")
        try:
            step_fn(i)
        finally:
            leave(handle)

    return marked


def run_steps(prof: profile, step_fn: Callable[[int], None], plan: CapturePlan,
              progress: Optional[ProgressFn] = None) -> float:
    """Run the plan's wait/warmup/active steps on `prof` (a `profile` without a schedule).

    torch's schedule transitions, done once per phase instead of through `prof.step()` after
    every step: wait steps run unprofiled; `prepare_trace` starts the warm-up (Kineto set up, not
    recording); `start_trace` starts the active steps, each in a `ProfilerStep#i` marker;
    `stop_trace` ends them. Returns the seconds the steps took (profiler stop excluded).
    """
    marked = step_marker(step_fn)
    first_active = plan.wait + plan.warmup
    started = False
    t0 = time.perf_counter()
    try:
        for i in range(plan.steps):
            if i == plan.wait:
                prof.prepare_trace()
            if i == first_active:
                prof.start_trace()
                started = True
            (marked if i >= first_active else step_fn)(i)
            if progress:
                phase = "wait" if i < plan.wait else "warmup" if i < first_active else "active"
                progress(i + 1, plan.steps, f"step {i + 1}/{plan.steps} ({phase})")
        return time.perf_counter() - t0
    finally:
        if started:
            prof.stop_trace()


@register_backend("kineto")
def kineto_backend(step_fn: Callable[[int], None], plan: CapturePlan, out_dir: Path,
                   progress: Optional[ProgressFn] = None) -> CaptureResult:
    """torch.profiler (Kineto): CPU ops, plus CUDA runtime and kernels on GPU."""
    reason = _cuda_reason(plan)
    if reason:
        raise CaptureError(reason)
    path = Path(out_dir) / trace_filename(_rank())
    prof = profile(**profiler_options(plan))
    t0 = time.perf_counter()
    run_s = run_steps(prof, step_fn, plan, progress)
    stop_s = time.perf_counter() - t0 - run_s
    t1 = time.perf_counter()
    prof.export_chrome_trace(str(path))
    export_s = time.perf_counter() - t1
    if not path.exists():
        raise CaptureError(f"the profiler wrote no trace to {path}")
    t1 = time.perf_counter()
    trace = _load_trace()(path)
    timings = {"run_s": run_s, "stop_s": stop_s, "export_s": export_s, "load_s": time.perf_counter() - t1}
    return CaptureResult(trace, path, {}, timings)
