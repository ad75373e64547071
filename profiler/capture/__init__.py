"""Live capture: run a model spec under a profiler and return a Trace with FLOPs and bytes.

Stages (DESIGN.md, Capture): `spec` (zoo, hf:, file.py:build) -> `runner.capture` -> a backend from
`backends` (Kineto by default; cupti-python on NVIDIA GPUs) with the NVML sampler beside it ->
`flops` (untimed op-cost pass) -> `join` (costs onto cpu_ops and kernels). `ddp` runs the same per
rank; `report` and `artifacts` write the CLI's files. Imports are lazy: importing this package does
not import torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "capture": "profiler.capture.runner",
    "capture_ddp": "profiler.capture.ddp",
    "CapturePlan": "profiler.capture.backends",
    "CaptureResult": "profiler.capture.backends",
    "CaptureError": "profiler.capture.backends",
    "register_backend": "profiler.capture.backends",
    "available_backends": "profiler.capture.backends",
    "SpecError": "profiler.capture.spec",
    "load_spec": "profiler.capture.spec",
    "zoo_models": "profiler.capture.zoo",
    "build_zoo": "profiler.capture.zoo",
    "save_trace": "profiler.capture.artifacts",
    "load_saved_trace": "profiler.capture.artifacts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'profiler.capture' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
