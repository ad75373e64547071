"""Shared set-up of the provider-choice tests (test_tuning.py, test_tuning_rounds.py): an
isolated measuring data dir per test (autouse where imported) and throw-away kernels whose
providers do known multiples of the same work and count their calls."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from kernels import registry, tuning
from kernels.registry import KERNELS, KernelSpec, Supports, register_kernel

N = 1 << 15  # elements of the synthetic inputs: ~20 us per op, so 20x work is unmistakable


def _work(x: torch.Tensor, times: int) -> torch.Tensor:
    y = x
    for _ in range(times):
        y = (x * 1.0001).add_(1.0)
    return y - 1.0


_REAL_CPU: dict[str, str | None] = {}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch, request):
    """Measure mode, a private data dir, the cpu provider 'available' (synthetic, nothing built)."""
    # Probe (and build) the real cpu provider in the normal data dir first, and remember it; not
    # for the GPU check's cuda tests, which must not wait for the C++ build.
    if "cuda" not in request.node.name:
        _REAL_CPU["reason"] = registry.provider_unavailable_reason("cpu")
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.ENV_MODE, "measure")
    monkeypatch.setitem(registry._PROBE_RESULTS, "cpu", None)
    tuning.forget_decisions()
    yield tmp_path
    tuning.forget_decisions()


@pytest.fixture
def toy(request):
    """Register a synthetic kernel: toy(cpu=k, aten=k, reference=k) gives each provider k x work
    (the reference does 20x unless told)."""
    names: list[str] = []
    calls: Counter = Counter()

    def make(suffix: str = "", reference_measured: bool = True, **work: int) -> KernelSpec:
        def provider(name: str, k: int):
            def run(x: torch.Tensor) -> torch.Tensor:
                calls[name] += 1
                return _work(x, k)
            return run

        providers = {p: provider(p, k) for p, k in work.items() if p != "reference"}
        name = f"toy_tuning_{request.node.name.split('[')[0]}{suffix}"
        spec = register_kernel(KernelSpec(name, provider("reference", work.get("reference", 20)),
                                          providers, Supports(dtypes=(torch.float32,)),
                                          reference_measured=reference_measured))
        names.append(name)
        return spec

    make.calls = calls
    yield make
    for name in names:
        KERNELS.pop(name, None)
