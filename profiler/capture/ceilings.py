"""Measured roofline ceilings: peak matmul FLOP/s per dtype and streaming memory bandwidth.

DESIGN.md, Roofline: measured ceilings beat datasheet ones. On a GPU each figure is the median of
device-timed runs (CUDA events, after warm-up); on a CPU the best of several runs per thread count,
with the load average recorded (a shared CPU only ever measures low, so the best run is the
closest to the machine; each CPU figure is timed for at least a minimum time, not only a number
of runs, so one busy moment cannot make it). Results are cached per machine as JSON under the
data directory (`FUSIONLENS_DATA_DIR`, default `./.fusionlens`), keyed by a fingerprint of CPU
model, cores, torch version, GPU name, thread count and mode; a second call reads the cache. A
re-measurement (`refresh=True`) keeps the best of it and the cached figures, per figure, for the
same reason. Nothing here runs at import time.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from profiler.capture.devices import Ceilings, DeviceTableError

MIB = 1024 * 1024
DEFAULT_DATA_DIR = ".fusionlens"


@dataclass(frozen=True)
class Sizes:
    """What one measurement mode times: matmul n per dtype, bandwidth array bytes, repeats (at
    least, and on the CPU for at least min_s seconds per figure)."""

    matmul_n: dict
    bw_bytes: int
    repeats: int
    thread_counts: str  # "current" or "all" (1 and the current count)
    min_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.bw_bytes < MIB or self.repeats < 1 or self.thread_counts not in ("current", "all")
                or not 0.0 <= self.min_s <= 10.0):
            raise ValueError(f"bad measurement sizes: {self}")


CPU_MODES = {
    # quick: tests (~1-3 s here); full: under ~30 s on 2 busy cores. A quick figure is one 0.3-1 ms
    # run: best of 3 alone was one busy moment from a roof 5x too low (27 GFLOP/s fp32 against
    # the 130 GFLOP/s the model's addmm then ran at), hence the minimum time per figure.
    "quick": Sizes({"fp32": 384, "fp64": 256, "bf16": 256}, bw_bytes=40 * MIB, repeats=3, thread_counts="current",
                   min_s=0.15),
    "full": Sizes({"fp32": 1536, "fp64": 1024, "bf16": 512}, bw_bytes=128 * MIB, repeats=5, thread_counts="all",
                  min_s=0.4),
}
GPU_MODES = {
    "quick": Sizes({"fp32": 4096, "tf32": 4096, "fp16": 4096, "bf16": 4096, "fp64": 2048}, bw_bytes=512 * MIB,
                   repeats=10, thread_counts="current"),
    "full": Sizes({"fp32": 8192, "tf32": 8192, "fp16": 8192, "bf16": 8192, "fp64": 8192}, bw_bytes=1024 * MIB,
                  repeats=20, thread_counts="current"),
}
_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}


def data_dir(override: Optional[os.PathLike | str] = None) -> Path:
    """The data directory: `override`, else $FUSIONLENS_DATA_DIR, else ./.fusionlens."""
    return Path(override or os.environ.get("FUSIONLENS_DATA_DIR") or DEFAULT_DATA_DIR)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_fingerprint(device: str = "cpu") -> dict[str, Any]:
    """The facts a cached measurement is only valid for."""
    import torch

    fp: dict[str, Any] = {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                          "device": device, "gpu_name": None}
    if device.startswith("cuda"):
        fp["gpu_name"] = torch.cuda.get_device_name(torch.device(device))
    else:
        fp["threads"] = torch.get_num_threads()
    return fp


def _cache_path(fp: dict[str, Any], mode: str, root: Path) -> Path:
    key = hashlib.sha256(json.dumps({**fp, "mode": mode}, sort_keys=True).encode()).hexdigest()[:16]
    return root / "ceilings" / f"{fp['device'].replace(':', '_')}-{mode}-{key}.json"


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def measured_ceilings(device: str = "cpu", mode: str = "full", refresh: bool = False,
                      root: Optional[os.PathLike | str] = None) -> Ceilings:
    """Cached measured ceilings for `device` ("cpu" or "cuda[:N]"); measures on a cache miss.

    `details["cache"]` says "hit" or "miss" and `details["cache_path"]` where the JSON lives.
    """
    modes = GPU_MODES if device.startswith("cuda") else CPU_MODES
    if mode not in modes:
        raise ValueError(f"mode must be one of {sorted(modes)}, got {mode!r}")
    fp = machine_fingerprint(device)
    path = _cache_path(fp, mode, data_dir(root))
    cached = _read_cache(path, fp)
    if not refresh and cached is not None:
        return cached.with_details(cache="hit", cache_path=str(path))
    measure = measure_gpu if device.startswith("cuda") else measure_cpu
    ceilings = measure(modes[mode], device).with_details(fingerprint=fp, mode=mode)
    if cached is not None:
        ceilings = best_of(cached, ceilings)
    _write_atomic(path, {"fingerprint": fp, "ceilings": ceilings.to_json()})
    return ceilings.with_details(cache="miss", cache_path=str(path))


def _read_cache(path: Path, fp: dict[str, Any]) -> Optional[Ceilings]:
    """The cached Ceilings for this fingerprint, or None (absent, another machine, or damaged:
    a damaged entry is re-measured and overwritten)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return Ceilings.from_json(data["ceilings"]) if data.get("fingerprint") == fp else None
    except (OSError, ValueError, KeyError, TypeError, DeviceTableError):
        return None


def best_of(cached: Ceilings, fresh: Ceilings) -> Ceilings:
    """Per figure the larger of two measurements of one machine (a busy machine only measures
    low); details are the fresh run's, with its own figures and the number of runs merged."""
    peaks = {d: max(v for v in (cached.peak_flops_per_s.get(d), fresh.peak_flops_per_s.get(d)) if v is not None)
             for d in {**cached.peak_flops_per_s, **fresh.peak_flops_per_s}}
    details = {**fresh.details, "runs_merged": int(cached.details.get("runs_merged", 1)) + 1,
               "this_run": {"peak_flops_per_s": dict(fresh.peak_flops_per_s),
                            "mem_bw_bytes_per_s": fresh.mem_bw_bytes_per_s},
               "merge": "best per figure of this run and the cached ones"}
    return Ceilings(peaks, max(cached.mem_bw_bytes_per_s, fresh.mem_bw_bytes_per_s), "measured", details)


# ---------------------------------------------------------------- CPU
def _best_s(fn: Callable[[], Any], repeats: int, min_s: float = 0.0, max_runs: int = 2000) -> float:
    """Best wall time of `fn` over at least `repeats` runs and at least `min_s` seconds of runs."""
    fn()  # warm-up: first-touch page faults, allocator, kernel selection
    best, runs, start = float("inf"), 0, time.perf_counter()
    while runs < repeats or (time.perf_counter() - start < min_s and runs < max_runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best


def _cpu_once(sizes: Sizes) -> tuple[dict[str, float], dict[str, float]]:
    """(peak FLOP/s per dtype, {'copy': B/s, 'triad': B/s}) at the current thread count."""
    import torch

    peaks = {}
    for dtype, n in sizes.matmul_n.items():
        a = torch.randn(n, n, dtype=getattr(torch, _TORCH_DTYPES[dtype]))
        b, c = torch.randn_like(a), torch.empty_like(a)
        seconds = _best_s(lambda: torch.mm(a, b, out=c), sizes.repeats, sizes.min_s)
        peaks[dtype] = 2.0 * n**3 / seconds
    n_elems = sizes.bw_bytes // 4
    x, y, z = (torch.ones(n_elems, dtype=torch.float32) for _ in range(3))
    copy_s = _best_s(lambda: y.copy_(x), sizes.repeats, sizes.min_s)  # reads x, writes y
    triad_s = _best_s(lambda: torch.add(x, y, alpha=3.0, out=z), sizes.repeats, sizes.min_s)  # z = x + 3y
    return peaks, {"copy": 2 * 4 * n_elems / copy_s, "triad": 3 * 4 * n_elems / triad_s}


def measure_cpu(sizes: Sizes, device: str = "cpu") -> Ceilings:
    """Best-of-N matmul and copy/triad on the CPU per thread count (1, half, current; or current only)."""
    import torch

    current = torch.get_num_threads()
    counts = [current] if sizes.thread_counts == "current" else sorted({1, max(1, current // 2), current})
    per_threads: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        for threads in counts:
            torch.set_num_threads(threads)
            peaks, bw = _cpu_once(sizes)
            per_threads[str(threads)] = {"peak_flops_per_s": peaks, "mem_bw_bytes_per_s": bw}
    finally:
        torch.set_num_threads(current)
    # The roof at `current` threads is the best figure measured with at most that many threads: a run
    # may use fewer, and on a shared CPU extra threads can measure lower than one thread.
    peaks = {d: max(f["peak_flops_per_s"][d] for f in per_threads.values()) for d in sizes.matmul_n}
    bw = max(max(f["mem_bw_bytes_per_s"].values()) for f in per_threads.values())
    details = {"per_threads": per_threads, "threads": current, "load_avg": list(os.getloadavg()),
               "matmul_n": dict(sizes.matmul_n), "bw_bytes": sizes.bw_bytes, "repeats": sizes.repeats,
               "min_s": sizes.min_s, "timing": "best of >= repeats runs over >= min_s s, time.perf_counter", "bw_kernel": "max(copy, triad)",
               "roof": "best over thread counts <= threads", "measure_s": round(time.perf_counter() - t0, 3)}
    return Ceilings(peaks, bw, "measured", details)


# ---------------------------------------------------------------- GPU
def _median_event_s(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median device time of `fn` over `repeats` runs, each bracketed by CUDA events.

    All runs are queued before one synchronise (as triton's do_bench does), so the GPU never
    idles waiting for the next launch and launch latency stays out of the timings.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) / 1e3 for start, end in events)


def measure_gpu(sizes: Sizes, device: str = "cuda") -> Ceilings:
    """Device-timed matmul per dtype (tf32 with TF32 allowed, the rest with it off) and copy/triad."""
    import torch

    dev = torch.device(device)
    peaks, per_dtype_s = {}, {}
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    t0 = time.perf_counter()
    with torch.cuda.device(dev):
        try:
            for dtype, n in sizes.matmul_n.items():
                torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
                a = torch.randn(n, n, device=dev, dtype=getattr(torch, _TORCH_DTYPES[dtype]))
                b, c = torch.randn_like(a), torch.empty_like(a)
                seconds = _median_event_s(lambda: torch.mm(a, b, out=c), sizes.repeats)
                peaks[dtype], per_dtype_s[dtype] = 2.0 * n**3 / seconds, seconds
                del a, b, c
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved_tf32
        n_elems = sizes.bw_bytes // 4
        x, y, z = (torch.ones(n_elems, device=dev) for _ in range(3))
        copy_s = _median_event_s(lambda: y.copy_(x), sizes.repeats)
        triad_s = _median_event_s(lambda: torch.add(x, y, alpha=3.0, out=z), sizes.repeats)
        bw = {"copy": 2 * 4 * n_elems / copy_s, "triad": 3 * 4 * n_elems / triad_s}
        del x, y, z
        torch.cuda.empty_cache()
    # fp32 on the roof means IEEE fp32 (TF32 off, PyTorch's default); tf32 is kept separately.
    details = {"gpu_name": torch.cuda.get_device_name(dev), "matmul_n": dict(sizes.matmul_n),
               "matmul_median_s": per_dtype_s, "bw_bytes_per_s": bw, "bw_bytes": sizes.bw_bytes,
               "repeats": sizes.repeats, "timing": "median of CUDA-event-timed runs (queued back to back) after 3 warm-ups",
               "bw_kernel": "max(copy, triad)", "not_measured": {"fp8": "needs torch._scaled_mm layouts; table only"},
               "measure_s": round(time.perf_counter() - t0, 3)}
    return Ceilings(peaks, max(bw.values()), "measured", details)
