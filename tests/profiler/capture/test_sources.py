"""Which capture sources run and why not: the rules on synthetic environments, the real probes on
this machine, and agreement with what the runner records after a real capture."""
from __future__ import annotations

import ctypes.util

import pytest
import torch

from profiler.capture.backends import CapturePlan
from profiler.capture.nvml import LIBRARY_NOT_FOUND
from profiler.capture.sources import (SOURCES, SourceStatus, blocking_reason, cuda_unavailable_reason, environment,
                                      nvml_unavailable_reason, plan_sources)

GPU_BOX = {"cuda": None, "nvml": None, "backend:kineto": None, "backend:cupti": None}
CPU_BOX = {"cuda": "torch X is a CPU-only build", "nvml": LIBRARY_NOT_FOUND, "backend:kineto": None,
           "backend:cupti": "CUPTI unavailable: NotSupportedError: CUDA driver is not found"}


def _by_name(plan: CapturePlan, env: dict) -> dict[str, SourceStatus]:
    statuses = plan_sources(plan, env)
    assert [s.name for s in statuses] == list(SOURCES)
    return {s.name: s for s in statuses}


def test_cpu_plan_on_a_gpu_box_keeps_gpu_sources_off_with_reasons():
    s = _by_name(CapturePlan(device="cpu"), GPU_BOX)
    assert s["kineto"].on and s["flops"].on
    assert not s["nvml"].on and s["nvml"].reason == "device is cpu (NVML samples NVIDIA GPUs only)"
    assert not s["cupti"].on and "Kineto is this capture's backend" in s["cupti"].reason
    assert not s["cuda"].on and s["cuda"].reason == "device is cpu"


def test_cuda_plan_on_a_gpu_box_turns_nvml_and_cuda_on():
    s = _by_name(CapturePlan(device="cuda"), GPU_BOX)
    assert s["nvml"].on and s["cuda"].on and s["kineto"].on
    assert not s["cupti"].on  # never in the same capture as Kineto
    assert blocking_reason(CapturePlan(device="cuda"), GPU_BOX) is None


def test_cuda_plan_without_a_driver_says_why():
    plan = CapturePlan(device="cuda")
    s = _by_name(plan, CPU_BOX)
    assert (s["nvml"].on, s["nvml"].reason) == (False, LIBRARY_NOT_FOUND)
    assert (s["cuda"].on, s["cuda"].reason) == (False, CPU_BOX["cuda"])
    assert s["cupti"].reason == "not used: " + CPU_BOX["backend:cupti"]
    assert blocking_reason(plan, CPU_BOX) == f"device cuda is unavailable here: {CPU_BOX['cuda']}"


def test_cupti_backend_turns_kineto_off():
    plan = CapturePlan(device="cuda", backend="cupti")
    s = _by_name(plan, GPU_BOX)
    assert s["cupti"].on and not s["kineto"].on and "process-wide" in s["kineto"].reason
    s = _by_name(plan, {**GPU_BOX, "backend:cupti": "cupti-python is not installed"})
    assert (s["cupti"].on, s["cupti"].reason) == (False, "cupti-python is not installed")
    assert blocking_reason(plan, {**GPU_BOX, "backend:cupti": "nope"}) == "backend cupti is unavailable here: nope"


def test_turned_off_sources_say_so():
    s = _by_name(CapturePlan(device="cuda", flops=False, nvml=False), GPU_BOX)
    assert (s["flops"].on, s["flops"].reason) == (False, "turned off for this capture")
    assert (s["nvml"].on, s["nvml"].reason) == (False, "turned off for this capture")


def test_status_validates():
    with pytest.raises(ValueError, match="without a reason"):
        SourceStatus("nvml", False, " ")
    with pytest.raises(ValueError, match="unknown source"):
        SourceStatus("perf", True)


class _FakeNvml:
    """A pynvml-shaped module whose init/count behave as told, recording shutdowns."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def __init__(self, init_exc=None, count=1):
        self.init_exc, self.count, self.shutdowns = init_exc, count, 0

    def nvmlInit(self):
        if self.init_exc:
            raise self.init_exc

    def nvmlDeviceGetCount(self):
        if isinstance(self.count, Exception):
            raise self.count
        return self.count

    def nvmlShutdown(self):
        self.shutdowns += 1


def test_nvml_probe_paths():
    assert nvml_unavailable_reason(_FakeNvml(_FakeNvml.NVMLError_LibraryNotFound())) == LIBRARY_NOT_FOUND
    assert nvml_unavailable_reason(_FakeNvml(_FakeNvml.NVMLError("Driver Not Loaded"))) == \
        "NVML unavailable: NVMLError: Driver Not Loaded"
    fake = _FakeNvml(count=0)
    assert nvml_unavailable_reason(fake) == "NVML unavailable: the driver lists no GPU" and fake.shutdowns == 1
    fake = _FakeNvml(count=_FakeNvml.NVMLError("gone"))
    assert nvml_unavailable_reason(fake) == "NVML unavailable: listing devices failed: gone" and fake.shutdowns == 1
    fake = _FakeNvml(count=2)
    assert nvml_unavailable_reason(fake) is None and fake.shutdowns == 1


def test_real_probes_agree_with_this_machine():
    env = environment()
    assert (env["cuda"] is None) == torch.cuda.is_available()
    assert cuda_unavailable_reason() == env["cuda"]
    if torch.version.cuda is None:
        assert env["cuda"] == f"torch {torch.__version__} is a CPU-only build"
    if ctypes.util.find_library("nvidia-ml") is None:  # no driver library: pynvml cannot load it
        assert env["nvml"] == LIBRARY_NOT_FOUND
    assert env["backend:kineto"] is None


def test_preview_matches_what_the_runner_records(tmp_path):
    from profiler.capture.runner import capture

    plan = CapturePlan(device="cpu", mode="infer", wait=0, warmup=1, active=1)
    result = capture("mlp", plan, tmp_path, size="tiny")
    predicted_off = {s.name: s.reason for s in plan_sources(plan) if not s.on and s.name in ("nvml", "cupti", "flops")}
    assert dict(result.sources_off) == predicted_off
