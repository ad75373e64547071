"""Fixtures shared by the kernel tests."""
from __future__ import annotations

import pytest

import kernels


@pytest.fixture
def cpu_provider(request) -> None:
    """Skips a test when the C++ extension is unavailable, with the reason. Tests named for cuda
    (Triton on a GPU) neither wait for the extension's build nor get skipped when it fails."""
    if "cuda" in request.node.name:
        return
    reason = kernels.available_providers()["cpu"]
    if reason:
        pytest.skip(f"cpu provider unavailable: {reason}")
