"""NVML sampler: the no-driver path (this machine) and the sampling loop against a stand-in library."""
from __future__ import annotations

import time
import types

import pytest

from profiler.capture.nvml import LIBRARY_NOT_FOUND, NvmlSampler, throttle_reason_names
from profiler.trace.schema import COUNTER_COLUMNS


def _has_nvidia_driver() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_no_driver_gives_reason_and_no_exception():
    with NvmlSampler(hz=50) as sampler:
        time.sleep(0.05)
    assert sampler.unavailable_reason == LIBRARY_NOT_FOUND
    df = sampler.samples()
    assert df.empty and list(df.columns) == list(COUNTER_COLUMNS)
    assert sampler.achieved_hz() == {}


class NotSupported(Exception):
    pass


def stand_in_nvml(n_devices: int = 2):
    """A minimal library with pynvml's names; device 1 lacks power readings (NotSupported)."""
    lib = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, NVMLError=NotSupported,
                                NVMLError_LibraryNotFound=type("LNF", (NotSupported,), {}))
    lib.calls = 0
    lib.nvmlInit = lambda: None
    lib.nvmlShutdown = lambda: None
    lib.nvmlDeviceGetCount = lambda: n_devices
    lib.nvmlDeviceGetHandleByIndex = lambda i: i
    lib.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{h}-aaaa"
    lib.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h, memory=40)
    lib.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30)

    def power(h):
        if h == 1:
            raise NotSupported("Not Supported")
        return 300_000  # mW
    lib.nvmlDeviceGetPowerUsage = power
    lib.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    lib.nvmlDeviceGetTemperature = lambda h, kind: 55
    lib.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 4  # SwPowerCap
    return lib


def test_sampling_loop_rate_values_and_clock_mapping():
    with NvmlSampler(hz=50, nvml_module=stand_in_nvml()) as sampler:
        time.sleep(0.6)
    assert sampler.unavailable_reason is None
    assert (1, "power") in sampler.unsupported and (0, "power") not in sampler.unsupported
    rates = sampler.achieved_hz()
    assert set(rates) == {0, 1}
    assert all(35 < hz < 55 for hz in rates.values()), rates  # ~50 Hz with perf_counter pacing
    df = sampler.samples()
    assert list(df.columns) == list(COUNTER_COLUMNS) and str(df["name"].dtype) == "category"
    last = df[df["device"] == 0].groupby("name", observed=True)["value"].last()
    assert last["power_w"] == 300.0 and last["gpu_util_pct"] == 90 and last["mem_used_bytes"] == 2**30
    assert last["sm_clock_mhz"] == 1980 and last["throttle_reasons"] == 4
    assert "power_w" not in set(df[df["device"] == 1]["name"])
    start_us = sampler.t0_unix_ns / 1e3  # default ts_us: Unix-epoch µs, within the 0.6 s run
    assert start_us <= df["ts_us"].min() and df["ts_us"].max() < start_us + 5e6
    assert abs(start_us - time.time() * 1e6) < 60e6
    # Aligned on a trace origin 1 s before the sampler started: ts_us counts from that origin.
    shifted = sampler.samples(t0_us=start_us - 1e6)
    assert shifted["ts_us"].min() >= 1e6 and (df["ts_us"] - shifted["ts_us"] - (start_us - 1e6)).abs().max() < 1.0


def test_bad_rate_is_refused():
    with pytest.raises(ValueError):
        NvmlSampler(hz=0)


def test_throttle_mask_decodes_to_names():
    import pynvml

    mask = pynvml.nvmlClocksThrottleReasonSwPowerCap | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    assert throttle_reason_names(mask) == ["HwThermalSlowdown", "SwPowerCap"]
    assert throttle_reason_names(0) == []


def test_devices_are_labelled_by_cuda_index_when_uuids_are_known():
    # This process sees only NVML GPU 1, as its CUDA device 0 (CUDA_VISIBLE_DEVICES=1).
    with NvmlSampler(hz=50, nvml_module=stand_in_nvml(), cuda_uuids=["0000000" + "1-AAAA"]) as sampler:
        time.sleep(0.1)
    df = sampler.samples()
    assert set(df["device"]) == {0}
    assert df[df["name"] == "gpu_util_pct"]["value"].eq(91).all()  # NVML device 1 reports 90 + 1


def test_throttle_names_read_the_current_clock_event_constants_too():
    """A pynvml that only has the nvmlClocksEventReason* names (the deprecated Throttle ones gone)."""
    from types import SimpleNamespace

    import pynvml

    events_only = SimpleNamespace(nvmlClocksEventReasonGpuIdle=pynvml.nvmlClocksEventReasonGpuIdle,
                                  nvmlClocksEventReasonSwPowerCap=pynvml.nvmlClocksEventReasonSwPowerCap,
                                  nvmlClocksEventReasonAll=pynvml.nvmlClocksEventReasonAll,
                                  nvmlClocksEventReasonNone=pynvml.nvmlClocksEventReasonNone)
    mask = pynvml.nvmlClocksEventReasonGpuIdle | pynvml.nvmlClocksEventReasonSwPowerCap
    assert throttle_reason_names(mask, events_only) == ["GpuIdle", "SwPowerCap"]
    assert throttle_reason_names(mask) == ["GpuIdle", "SwPowerCap"]  # the installed pynvml: both names, one entry
