"""Provider fallback on real kernels: a `cpu` provider whose build fails (simulated by its probe
result) keeps the reason, shows it in `available_providers()`, and every kernel falls back to
`aten` or the reference with the same numbers; an explicit unavailable provider is one clear
ValueError line. The probe cache is patched with monkeypatch, so it is restored afterwards."""
from __future__ import annotations

import fcntl
import os
import re
import time

import pytest
import torch
from torch.utils import cpp_extension

import kernels
from kernels import _build, registry
from kernels.registry import KERNELS, select_provider

BROKEN = "C++ build failed in /x: norms.o: error: no compiler (simulated)"


@pytest.fixture
def cpu_broken(monkeypatch):
    monkeypatch.setitem(registry._PROBE_RESULTS, "cpu", BROKEN)
    yield


def test_reason_is_kept_and_shown(cpu_broken) -> None:
    avail = kernels.available_providers()
    assert avail["cpu"] == BROKEN and avail["reference"] is None and avail["aten"] is None


@pytest.mark.parametrize("name,expected", [("layer_norm", "aten"), ("rms_norm", "aten"),
                                           ("add_rms_norm", "reference"), ("softmax", "aten"),
                                           ("swiglu", "reference"), ("gelu", "aten")])
def test_auto_choice_falls_back_with_the_reason(cpu_broken, name, expected) -> None:
    x = torch.randn(3, 8)
    args = {"layer_norm": (x, torch.randn(8), torch.randn(8), 1e-5),
            "rms_norm": (x, torch.randn(8), 1e-6, 0.0, None),
            "add_rms_norm": (x, torch.randn(3, 8), torch.randn(8), 1e-6, 0.0, None),
            "softmax": (x, -1, 1.0, None, False), "swiglu": (x, x), "gelu": (x, "none")}[name]
    chosen, skipped = select_provider(KERNELS[name], args, {})
    assert chosen == expected and skipped["cpu"] == BROKEN


def test_public_calls_still_work_and_explicit_cpu_is_one_line(cpu_broken) -> None:
    x, w, b = torch.randn(5, 16, dtype=torch.float64), torch.randn(16), torch.randn(16)
    y = kernels.layer_norm(x.float(), w, b, 1e-5)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x.float(), (16,), w, b, 1e-5))
    s, n = kernels.add_rms_norm(x.float(), x.float(), w, 1e-6)
    torch.testing.assert_close(s, 2 * x.float())
    with pytest.raises(ValueError) as info:
        kernels.layer_norm(x.float(), w, b, 1e-5, provider="cpu")
    msg = str(info.value)
    assert "\n" not in msg and msg == f"layer_norm: provider 'cpu' unavailable: {BROKEN}"


def test_optimizer_falls_back(cpu_broken) -> None:
    p = torch.nn.Parameter(torch.randn(4, 4))
    ref = torch.nn.Parameter(p.detach().clone())
    ours, theirs = kernels.AdamW([p], lr=0.1), torch.optim.AdamW([ref], lr=0.1)
    for param in (p, ref):
        param.grad = torch.ones(4, 4)
    ours.step()
    theirs.step()
    torch.testing.assert_close(p, ref)
    with pytest.raises(ValueError, match="provider 'cpu' unavailable"):
        opt = kernels.AdamW([p], provider="cpu")
        p.grad = torch.ones(4, 4)
        opt.step()


def test_cpu_probe_turns_a_failed_build_into_its_first_line(monkeypatch) -> None:
    def fail(verbose: bool = False) -> None:
        raise RuntimeError("C++ build failed in /tmp/b: x.o: error: 'omp.h' file not found\nmore")

    from kernels import providers

    monkeypatch.setattr(_build, "load_cpu_ops", fail)
    monkeypatch.setattr(providers, "_CPU_OPS", None)  # as before the first load
    assert _build._probe_cpu() == "C++ build failed in /tmp/b: x.o: error: 'omp.h' file not found"


def test_cpu_probe_names_missing_ninja(monkeypatch) -> None:
    def no_ninja() -> None:
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "verify_ninja_availability", no_ninja)
    assert _build._probe_cpu() == "ninja not found (pip install ninja)"


def test_triton_without_gpu_has_a_reason() -> None:
    if torch.cuda.is_available() or registry.triton_interpreted():
        pytest.skip("a GPU (or the Triton interpreter) is present: triton is available")
    reason = kernels.available_providers()["triton"]
    assert reason == "no CUDA GPU" or reason.startswith("Triton not installed")
    with pytest.raises(ValueError, match=re.escape(f"softmax: provider 'triton' unavailable: {reason}")):
        kernels.softmax(torch.randn(2, 3), provider="triton")


def _fake_build(root, name: str, age_s: float, now: float):
    d = root / name
    d.mkdir()
    (d / "fusionlens_cpu.so").write_bytes(b"x")
    (d / _build.LAST_USED).touch()
    for f in (d / "fusionlens_cpu.so", d / _build.LAST_USED, d):
        os.utime(f, (now - age_s, now - age_s))
    return d


def test_old_builds_are_pruned_keeping_the_newest(tmp_path) -> None:
    now = time.time()
    current = _fake_build(tmp_path, "current", 5_000, now)  # the build in use: never deleted, however old
    newer = [_fake_build(tmp_path, f"newer{i}", 3_000 + i, now) for i in range(2)]
    old = [_fake_build(tmp_path, f"old{i}", 10_000 + i, now) for i in range(3)]
    deleted = _build._prune_builds(current, keep=3, min_age_s=600)  # current + the 2 newest others
    assert sorted(p.name for p in deleted) == ["old0", "old1", "old2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "newer0", "newer1"]
    assert all(d.exists() for d in newer) and not any(d.exists() for d in old)


def test_prune_spares_builds_in_use_or_locked(tmp_path) -> None:
    now = time.time()
    current = _fake_build(tmp_path, "current", 0, now)
    fresh = _fake_build(tmp_path, "fresh", 60, now)  # used a minute ago: a process may be loading it
    locked = _fake_build(tmp_path, "locked", 20_000, now)
    stale = _fake_build(tmp_path, "stale", 20_000, now)
    with open(locked / "fusionlens.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a build in progress in another process
        deleted = _build._prune_builds(current, keep=1, min_age_s=600)
    assert deleted == [stale]
    assert current.exists() and fresh.exists() and locked.exists() and not stale.exists()


def test_build_hash_is_the_same_before_and_after_loading() -> None:
    """cpp_extension.load appends -L/-l flags to the lists it is given; ours must not change, or
    the build directory and tuning_store's fingerprint would differ before and after a load."""
    before = _build.build_dir_for(_build._inputs())
    _build.load_cpu_ops()
    assert _build.build_dir_for(_build._inputs()) == before
    assert (before / "fusionlens_cpu.so").exists()
