"""cupti-python activity tracer: a lighter, kernel-only capture backend (DESIGN.md, Capture).

CUPTI activity records (CONCURRENT_KERNEL, MEMCPY, MEMSET, plus RUNTIME/DRIVER launches and
EXTERNAL_CORRELATION) arrive through buffer callbacks and are copied into plain dicts at once.
Ops are linked through external correlation ids: a `TorchDispatchMode` recorder pushes one id per
aten op (`activity_push_external_correlation_id`) around the op's dispatch and writes the op's
name, inputs and CUPTI-clock times into a table; CUPTI tags every API call made meanwhile with
that id, and `cupti_records.build_trace` carries it onto the kernels.

CUPTI's activity callbacks are process-wide, so this tracer never runs in the same capture as
Kineto: a module-level guard refuses a second tracer and refuses to start while torch.profiler
is enabled (`CuptiConflictError`). Run Kineto and CUPTI captures in separate processes.

Without a driver `from cupti import cupti` works and the first call raises a RuntimeError
subclass; `cupti_unavailable_reason()` catches it and keeps the reason for the UI and CLI.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from profiler.capture.backends import CaptureError, CapturePlan, CaptureResult, ProgressFn, register_backend
from profiler.capture.cupti_records import CuptiRecords, api_name, build_trace, input_signature

BUFFER_BYTES = 8 * 1024 * 1024
_GUARD = threading.Lock()  # held while a tracer is active: one CUPTI client per process
_ACTIVE: Optional["CuptiTracer"] = None


class CuptiConflictError(CaptureError):
    """A second CUPTI client in the same capture (another tracer, or torch.profiler/Kineto)."""


def cupti_active() -> bool:
    """True while a cupti tracer runs in this process (other CUPTI clients must not start)."""
    return _ACTIVE is not None


def _kineto_enabled() -> bool:
    import torch

    return bool(torch._C._autograd._profiler_enabled())


def cupti_driver_reason() -> Optional[str]:
    """None when a CUPTI call works, else why: without a driver `import cupti` succeeds and the
    first call raises a RuntimeError subclass (cupti's NotSupportedError), caught here."""
    try:
        from cupti import cupti
    except ImportError as exc:
        return f"cupti-python is not installed ({exc})"
    try:
        cupti.get_timestamp()  # the first call loads libcuda
    except RuntimeError as exc:
        return f"CUPTI unavailable: {type(exc).__name__}: {exc}"
    return None


def cupti_unavailable_reason() -> Optional[str]:
    """None when the cupti backend can trace here, else one line saying why not (never raises)."""
    reason = cupti_driver_reason()
    if reason:
        return reason
    import torch

    if not torch.cuda.is_available():
        return f"CUDA is not available to torch {torch.__version__} (CPU build or no GPU)"
    return None


def _enum_name(enum: Any, value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def _kernel(a: Any) -> dict:
    """A kernel record as written: CUPTI (and cupti-python, `name: str`) has no demangling option, so
    the mangled name is copied here and demangled once per unique name in `build_trace`, off the
    buffer callback, through the same `profiler.trace.demangle` as uploaded traces."""
    return {"kind": "kernel", "name": a.name, "start": a.start, "end": a.end, "device": a.device_id,
            "stream": a.stream_id, "correlation": a.correlation_id, "grid_x": a.grid_x, "grid_y": a.grid_y,
            "grid_z": a.grid_z, "block_x": a.block_x, "block_y": a.block_y, "block_z": a.block_z,
            "registers_per_thread": a.registers_per_thread,
            "shared_memory_bytes": a.static_shared_memory + a.dynamic_shared_memory}


class CuptiTracer:
    """Context manager: collect kernel/memcpy/memset (+ launch API) activity into `self.records`."""

    def __init__(self, with_api: bool = True) -> None:
        from cupti import cupti

        self._cupti = cupti
        kinds = cupti.ActivityKind
        self.kinds = [kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET, kinds.EXTERNAL_CORRELATION]
        if with_api:  # launches: the runtime/driver rows and the carriers of external ids
            self.kinds += [kinds.RUNTIME, kinds.DRIVER]
        self.records = CuptiRecords()
        self.unix_offset_ns = 0
        self._api_names: dict[tuple[int, int], str] = {}
        self._enabled: list[Any] = []

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0  # 0 = as many records as fit

    def _buffer_completed(self, activities: list) -> None:
        for a in activities:  # copy out now: the buffer is reused after this returns
            try:
                self._copy_record(a)
            except Exception as exc:  # never raise into CUPTI's thread; count and keep the first reason
                self.records.errors += 1
                self.records.first_error = self.records.first_error or f"{type(exc).__name__}: {exc}"

    def _copy_record(self, a: Any) -> None:
        c, rec = self._cupti, self.records
        kind = a.kind
        if kind == c.ActivityKind.CONCURRENT_KERNEL:
            rec.gpu.append(_kernel(a))
        elif kind in (c.ActivityKind.MEMCPY, c.ActivityKind.MEMSET):
            is_copy = kind == c.ActivityKind.MEMCPY
            label = f"Memcpy {_enum_name(c.ActivityMemcpyKind, a.copy_kind)}" if is_copy else "Memset (Device)"
            rec.gpu.append({"kind": "gpu_memcpy" if is_copy else "gpu_memset", "name": label,
                            "start": a.start, "end": a.end, "device": a.device_id, "stream": a.stream_id,
                            "correlation": a.correlation_id, "bytes": a.bytes})
        elif kind == c.ActivityKind.EXTERNAL_CORRELATION:
            rec.external[a.correlation_id] = a.external_id
        elif kind in (c.ActivityKind.RUNTIME, c.ActivityKind.DRIVER):
            runtime = kind == c.ActivityKind.RUNTIME
            rec.api.append({"kind": "cuda_runtime" if runtime else "cuda_driver",
                            "name": self._api_name(runtime, a.cbid), "start": a.start, "end": a.end,
                            "pid": a.process_id, "tid": a.thread_id, "correlation": a.correlation_id})

    def _api_name(self, runtime: bool, cbid: int) -> str:
        key = (int(runtime), cbid)
        if key not in self._api_names:
            domain = self._cupti.CallbackDomain.RUNTIME_API if runtime else self._cupti.CallbackDomain.DRIVER_API
            try:
                self._api_names[key] = api_name(str(self._cupti.get_callback_name(domain, cbid)))
            except Exception:  # an id this CUPTI cannot name: keep the number
                self._api_names[key] = f"cbid_{cbid}"
        return self._api_names[key]

    def start(self) -> "CuptiTracer":
        global _ACTIVE
        if _kineto_enabled():
            raise CuptiConflictError("torch.profiler (Kineto) is active: CUPTI is process-wide, so the cupti "
                                     "tracer cannot run in the same capture; use a separate process")
        if not _GUARD.acquire(blocking=False):
            raise CuptiConflictError("another cupti tracer is already active in this process")
        try:
            c = self._cupti
            self.unix_offset_ns = time.time_ns() - c.get_timestamp()
            c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            for kind in self.kinds:
                c.activity_enable(kind)
                self._enabled.append(kind)
        except BaseException:
            self._disable()
            _GUARD.release()
            raise
        _ACTIVE = self
        return self

    def _disable(self) -> None:
        for kind in reversed(self._enabled):
            self._cupti.activity_disable(kind)
        self._enabled.clear()

    def stop(self) -> None:
        """Flush, disable the kinds, flush again (forced: also the partly filled buffers), detach
        CUPTI, release the guard: the order of NVIDIA's cupti-python samples. The caller has
        synchronised the device, so no record is produced after the last flush."""
        global _ACTIVE
        if _ACTIVE is not self:
            return
        try:
            self._cupti.activity_flush_all(0)
            self._disable()
            self._cupti.activity_flush_all(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
            self._cupti.finalize()  # lets a later client (another capture) subscribe again
        finally:
            _ACTIVE = None
            _GUARD.release()

    def __enter__(self) -> "CuptiTracer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def op_recorder(tracer: CuptiTracer, kind_name: str = "CUSTOM0") -> Any:
    """A TorchDispatchMode that pushes one external correlation id per aten op (see module doc)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    c = tracer._cupti
    kind = getattr(c.ExternalCorrelationKind, kind_name)
    ops, pid = tracer.records.ops, os.getpid()

    class ExternalIdRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.next_id = 1

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "profiler":  # record_function markers: annotations, not ops
                return func(*args, **(kwargs or {}))
            ext, self.next_id = self.next_id, self.next_id + 1
            start = c.get_timestamp()
            c.activity_push_external_correlation_id(kind, ext)
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                c.activity_pop_external_correlation_id(kind)
            end = c.get_timestamp()
            dims, dtypes = input_signature(args)
            ops.append({"external_id": ext, "name": func._schema.name, "start": start, "end": end, "pid": pid,
                        "tid": threading.get_native_id(), "seq": ext, "input_dims": dims, "input_types": dtypes})
            return out

    return ExternalIdRecorder()


def _device_properties(device: str) -> list[dict]:
    """deviceProperties in Kineto's keys, so the device table and analyses read them alike."""
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"id": i, "name": p.name, "totalGlobalMem": p.total_memory, "computeMajor": p.major,
                    "computeMinor": p.minor, "numSms": p.multi_processor_count,
                    "warpSize": getattr(p, "warp_size", 32)})
    return out


@contextlib.contextmanager
def _stopping(tracer: CuptiTracer):
    """Stop (flush, disable, release) the started tracer however the block ends."""
    try:
        yield tracer
    finally:
        tracer.stop()


@register_backend("cupti", probe=cupti_unavailable_reason)
def cupti_backend(step_fn: Callable[[int], None], plan: CapturePlan, out_dir: Path,
                  progress: Optional[ProgressFn] = None) -> CaptureResult:
    """cupti-python kernel tracer: kernels, copies, launches, ops linked by external correlation ids."""
    if not plan.is_cuda:
        raise CaptureError("the cupti backend traces CUDA kernels: use --device cuda (or the kineto backend)")
    reason = cupti_unavailable_reason()
    if reason:
        raise CaptureError(reason)
    import torch

    untraced = plan.wait + plan.warmup  # warm-up runs untraced; only `active` steps are kept
    t0 = time.perf_counter()
    for i in range(untraced):
        step_fn(i)
        if progress:
            progress(i + 1, plan.steps, f"step {i + 1}/{plan.steps} (warm-up, untraced)")
    tracer = CuptiTracer()
    try:
        tracer.start()
    except CaptureError:
        raise
    except Exception as exc:  # e.g. another CUPTI client (Kineto earlier in this process) holds CUPTI
        raise CaptureError(f"the cupti tracer could not start: {type(exc).__name__}: {exc}") from None
    with _stopping(tracer):
        with op_recorder(tracer):
            for i in range(untraced, plan.steps):
                start = tracer._cupti.get_timestamp()
                step_fn(i)
                torch.cuda.synchronize(torch.device(plan.device))
                tracer.records.steps.append((i, start, tracer._cupti.get_timestamp()))
                if progress:
                    progress(i + 1, plan.steps, f"step {i + 1}/{plan.steps} (traced)")
    run_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    import importlib.metadata as md

    versions = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "cupti_python": md.version("cupti-python")}
    trace = build_trace(tracer.records, tracer.unix_offset_ns, _device_properties(plan.device), 0, versions)
    timings = {"run_s": run_s, "build_s": time.perf_counter() - t1}
    return CaptureResult(trace, None, {"kineto": "not run: the cupti backend replaces it in this capture"}, timings)
