"""NVML sampler: a background thread reading GPU counters at ~50 Hz into counter tracks.

DESIGN.md, Capture: on NVIDIA GPUs an NVML sampler (utilization, memory, power, SM clock,
temperature, throttle reasons) runs beside any backend and its samples become `Trace.counters`
(columns `schema.COUNTER_COLUMNS`). Without a driver `pynvml.nvmlInit()` raises
`NVMLError_LibraryNotFound`: the sampler then records `.unavailable_reason` and does nothing, so
the capture carries on.

Clock mapping (how the runner aligns samples with the profiler trace): at start the sampler
records `time.time_ns()` and `time.perf_counter_ns()` together; each sample is timed with
`perf_counter_ns` (monotonic, immune to NTP steps) and mapped to Unix time as
`unix_ns = t0_unix_ns + (perf_ns - t0_perf_ns)`. `samples()` gives `ts_us` in Unix-epoch µs
(the runner maps them onto the trace through Kineto's `baseTimeNanoseconds` and `meta["t0_us"]`);
`samples(t0_us=origin)` subtracts a Unix-µs origin, e.g. a trace's raw clock origin, so that
raw_ts = ts_us + origin.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pandas as pd

from profiler.trace.model import empty_frame
from profiler.trace.schema import COUNTER_COLUMNS

LIBRARY_NOT_FOUND = "NVML unavailable: NVIDIA driver library not found"
# Counter track names (units in the names) and the pynvml reading behind each.
COUNTERS = ("gpu_util_pct", "mem_util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz", "temperature_c",
            "throttle_reasons")


@dataclass(frozen=True)
class Sample:
    """One reading: device (NVML index), counter name, value, perf_counter_ns when read."""

    perf_ns: int
    device: int
    name: str
    value: float


def _readers(nvml: Any) -> dict[str, Callable[[Any], Sequence[tuple[str, float]]]]:
    """counter group -> fn(handle) -> [(counter, value)]; each group may be unsupported on a GPU."""
    def util(h):
        u = nvml.nvmlDeviceGetUtilizationRates(h)
        return [("gpu_util_pct", float(u.gpu)), ("mem_util_pct", float(u.memory))]

    def throttle(h):  # the newer name first; drivers before r535 only have the throttle API
        newer = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None:
            try:
                return [("throttle_reasons", float(newer(h)))]
            except getattr(nvml, "NVMLError_FunctionNotFound", nvml.NVMLError):
                pass
        return [("throttle_reasons", float(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)))]

    return {
        "utilization": util,
        "memory": lambda h: [("mem_used_bytes", float(nvml.nvmlDeviceGetMemoryInfo(h).used))],
        "power": lambda h: [("power_w", nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)],  # mW -> W
        "sm_clock": lambda h: [("sm_clock_mhz", float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)))],
        "temperature": lambda h: [("temperature_c", float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)))],
        "throttle": throttle,
    }


# Bit constants of the clock-event mask: the current name first, the deprecated one as a fallback
# (nvidia-ml-py keeps both today; a release may drop the old one).
_REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")


def throttle_reason_names(mask: int, nvml: Any = None) -> list[str]:
    """Decode a throttle/clock-event bitmask into pynvml constant names (without the prefix)."""
    if nvml is None:
        import pynvml as nvml

    names = set()
    for prefix in _REASON_PREFIXES:
        for attr in dir(nvml):
            if attr.startswith(prefix) and attr not in (prefix + "All", prefix + "None"):
                bit = getattr(nvml, attr)
                if isinstance(bit, int) and bit and mask & bit == bit:
                    names.add(attr[len(prefix):])
    return sorted(names)


def _norm_uuid(uuid: Any) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.lower().removeprefix("gpu-")


def _visible_cuda_uuids() -> list[str]:
    """UUID per CUDA device index, only when this process already initialised CUDA (never inits it)."""
    try:
        import torch

        if not torch.cuda.is_initialized():
            return []
        return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    except Exception:  # no CUDA build, old torch without .uuid: fall back to NVML indices
        return []


def _label_devices(nvml: Any, cuda_uuids: Sequence[str]) -> dict[int, Any]:
    """label -> NVML handle. With CUDA UUIDs known, label = the CUDA index (what the trace's `device`
    column holds, CUDA_VISIBLE_DEVICES respected) and GPUs this process cannot see are left out;
    otherwise label = the NVML index."""
    handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())}
    if not cuda_uuids:
        return handles
    cuda_index = {_norm_uuid(u): i for i, u in enumerate(cuda_uuids)}
    labelled = {}
    for handle in handles.values():
        i = cuda_index.get(_norm_uuid(nvml.nvmlDeviceGetUUID(handle)))
        if i is not None:
            labelled[i] = handle
    return labelled or handles


class NvmlSampler:
    """Context manager sampling NVML counters of `devices` at `hz` (default: every GPU this process
    sees). Devices are CUDA indices when CUDA is initialised (matched by UUID), else NVML indices.

    Attributes: `unavailable_reason` (None when sampling ran), `unsupported` (device, group) ->
    reason for readings a GPU does not support, `t0_unix_ns`/`t0_perf_ns` (the clock mapping),
    `missed_ticks` (ticks skipped because a read overran its period).
    """

    def __init__(self, hz: float = 50.0, devices: Optional[Sequence[int]] = None, rank: int = 0,
                 nvml_module: Any = None, cuda_uuids: Optional[Sequence[str]] = None) -> None:
        if not 0 < hz <= 1000:
            raise ValueError(f"hz must be in (0, 1000], got {hz!r}")
        self.hz, self.rank, self._want = float(hz), int(rank), None if devices is None else list(devices)
        self.unavailable_reason: Optional[str] = None
        self.unsupported: dict[tuple[int, str], str] = {}
        self.missed_ticks = 0
        self.t0_unix_ns = self.t0_perf_ns = 0
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._nvml: Any = None
        self._module = nvml_module  # the pynvml module; None = import it at start
        self._cuda_uuids = cuda_uuids  # UUID per CUDA index; None = ask torch if CUDA is initialised
        self._handles: dict[int, Any] = {}

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "NvmlSampler":
        """Initialise NVML and start the thread; on failure keep the reason and return quietly."""
        pynvml = self._module
        if pynvml is None:
            try:
                import pynvml
            except ImportError:
                self.unavailable_reason = "NVML unavailable: nvidia-ml-py (pynvml) is not installed"
                return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self.unavailable_reason = LIBRARY_NOT_FOUND
            return self
        except pynvml.NVMLError as exc:
            self.unavailable_reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return self
        self._nvml = pynvml
        try:
            by_label = _label_devices(pynvml, _visible_cuda_uuids() if self._cuda_uuids is None else self._cuda_uuids)
            wanted = by_label if self._want is None else self._want
            self._handles = {i: by_label[i] for i in wanted if i in by_label}
        except pynvml.NVMLError as exc:
            self.unavailable_reason = f"NVML unavailable: listing devices failed: {exc}"
        if not self._handles and self.unavailable_reason is None:
            self.unavailable_reason = f"NVML unavailable: no NVML device among {self._want}"
        if self.unavailable_reason:
            pynvml.nvmlShutdown()
            return self
        self.t0_unix_ns, self.t0_perf_ns = time.time_ns(), time.perf_counter_ns()
        self._thread = threading.Thread(target=self._run, name="fusionlens-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (one last sample is taken at stop) and shut NVML down."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._nvml.nvmlShutdown()

    def __enter__(self) -> "NvmlSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ sampling
    def _run(self) -> None:
        readers = _readers(self._nvml)
        period_ns = int(1e9 / self.hz)
        next_ns = time.perf_counter_ns()
        while True:
            self._read_all(readers)
            if self._stop.is_set():
                return
            next_ns += period_ns
            now = time.perf_counter_ns()
            if now > next_ns:  # a read overran: skip whole ticks rather than burst to catch up
                skipped = (now - next_ns) // period_ns + 1
                self.missed_ticks += int(skipped)
                next_ns += skipped * period_ns
            self._stop.wait((next_ns - now) / 1e9)

    def _read_all(self, readers: dict[str, Callable[[Any], Sequence[tuple[str, float]]]]) -> None:
        for device, handle in self._handles.items():
            perf_ns = time.perf_counter_ns()
            for group, read in readers.items():
                if (device, group) in self.unsupported:
                    continue
                try:
                    values = read(handle)
                except self._nvml.NVMLError as exc:  # e.g. NotSupported on this GPU: stop asking
                    self.unsupported[(device, group)] = f"{type(exc).__name__}: {exc}"
                    continue
                self._samples.extend(Sample(perf_ns, device, name, value) for name, value in values)

    # ------------------------------------------------------------ results
    def samples(self, t0_us: float = 0.0) -> pd.DataFrame:
        """Samples as COUNTER_COLUMNS rows; ts_us = Unix-epoch µs minus `t0_us` (default 0)."""
        if not self._samples:
            return empty_frame(COUNTER_COLUMNS)
        origin_us = float(t0_us)
        snap = list(self._samples)
        unix_us = [(self.t0_unix_ns + s.perf_ns - self.t0_perf_ns) / 1e3 for s in snap]
        df = pd.DataFrame({
            "rank": self.rank, "ts_us": [u - origin_us for u in unix_us], "device": [s.device for s in snap],
            "name": [s.name for s in snap], "value": [s.value for s in snap]})
        return df.astype(COUNTER_COLUMNS)[list(COUNTER_COLUMNS)]

    def achieved_hz(self) -> dict[int, float]:
        """Sampling rate per device: (ticks - 1) / (last - first tick time)."""
        rates = {}
        for device in self._handles:
            ticks = sorted({s.perf_ns for s in self._samples if s.device == device})
            if len(ticks) >= 2:
                rates[device] = (len(ticks) - 1) / ((ticks[-1] - ticks[0]) / 1e9)
        return rates
