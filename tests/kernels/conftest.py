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


@pytest.fixture(params=["cpp", "python"])
def norm_road(request, monkeypatch) -> str:
    """The cpu provider's two training roads for the norms: the C++ node (norm_train) and the
    Python autograd.Function (`apply_norm(..., cpp_autograd=False)`)."""
    if request.param == "python":
        from kernels import norm_function, norms

        monkeypatch.setattr(norms, "apply_norm",
                            lambda *a, **k: norm_function.apply_norm(*a, **{**k, "cpp_autograd": False}))
    return request.param
