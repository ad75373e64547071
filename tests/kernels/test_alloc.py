"""Kernel output allocation (`kernels/_alloc.py`): huge-page advice for large CPU outputs.

The truth for "the advice is applied" is the kernel's own view of the mapping: the VMA that holds
the buffer's 2 MiB-aligned interior carries the `hg` flag (MADV_HUGEPAGE) in /proc/self/smaps and,
once written, is backed by AnonHugePages. Whether this machine supports it is read here
independently from /sys, so the tests fail if the feature silently stops working where it can.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import _alloc
from kernels.registry import new_output, poison_outputs

ROOT = Path(__file__).resolve().parents[2]
LARGE = (64 << 20) // 4  # fp32 elements of a 64 MiB buffer: above glibc's largest mmap threshold
CPU = torch.device("cpu")


def _thp_supported() -> bool:
    """Independent of the module: Linux with THP `always` or `madvise` selected in /sys."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


SUPPORTED = _thp_supported()
needs_thp = pytest.mark.skipif(not SUPPORTED, reason="no transparent huge pages on this machine")


def vma_of(addr: int) -> dict:
    """The /proc/self/smaps entry containing addr: {'start', 'end', 'flags', 'anon_huge_kb'}."""
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            current = {"start": lo, "end": hi, "flags": [], "anon_huge_kb": 0} if lo <= addr < hi else None
        elif current is not None and line.startswith("AnonHugePages:"):
            current["anon_huge_kb"] = int(line.split()[1])
        elif current is not None and line.startswith("VmFlags:"):
            current["flags"] = line.split()[1:]
            return current
    raise AssertionError(f"address {addr:#x} is in no mapping of this process")


def interior_start(t: torch.Tensor) -> int:
    start, length = _alloc.aligned_interior(t.data_ptr(), t.untyped_storage().nbytes())
    assert length > 0
    return start


@pytest.fixture
def advice_on(monkeypatch):
    monkeypatch.delenv("FUSIONLENS_HUGEPAGES", raising=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32], ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (0, 7), (4096, 4096), (2, 3, 1024, 700)], ids=str)
def test_outputs_are_plain_contiguous_tensors(advice_on, shape, dtype) -> None:
    out = _alloc.empty(shape, dtype, CPU)
    assert tuple(out.shape) == shape and out.dtype == dtype and out.device == CPU
    assert out.is_contiguous() and out.storage_offset() == 0
    assert out.untyped_storage().nbytes() == out.numel() * out.element_size()
    out.fill_(3)
    assert bool((out == 3).all())


def test_large_kernel_outputs_match_float64_and_plain_allocation(advice_on, monkeypatch) -> None:
    """A kernel writing a huge-page-advised output gives the same bits as with the advice off."""
    x = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(0))  # 16 MiB output
    truth = F.gelu(x.double())
    with poison_outputs():  # NaN-filled after allocation: any element left unwritten shows
        advised = kernels.gelu(x, provider="cpu")
    assert not bool(advised.isnan().any())
    assert (advised.double() - truth).abs().max().item() < 1e-5
    monkeypatch.setenv("FUSIONLENS_HUGEPAGES", "0")
    plain = kernels.gelu(x, provider="cpu")
    assert torch.equal(advised, plain)


def test_poisoning_fills_large_outputs(advice_on) -> None:
    like = torch.empty(0)
    with poison_outputs():
        out = new_output((LARGE,), like)
    assert bool(out.isnan().all())


@needs_thp
def test_large_cpu_output_gets_hugepage_advice(advice_on) -> None:
    assert _alloc.hugepage_status() is None, f"THP is supported here but the advice is off: {_alloc.hugepage_status()}"
    out = _alloc.empty((LARGE,), torch.float32, CPU)
    vma = vma_of(interior_start(out))
    assert "hg" in vma["flags"], f"no MADV_HUGEPAGE on the output's mapping: {vma['flags']}"
    out.fill_(1.0)  # first touch: the kernel backs the advised interior with 2 MiB pages
    assert vma_of(interior_start(out))["anon_huge_kb"] >= 2048


_CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from kernels import _alloc
from tests.kernels.test_alloc import vma_of
small = _alloc.empty((256, 256), torch.float32, torch.device("cpu"))   # 256 KiB
mid = _alloc.empty((1 << 20,), torch.float32, torch.device("cpu"))     # 4 MiB, at the threshold
big = _alloc.empty((16 << 20,), torch.float32, torch.device("cpu"))    # 64 MiB
def flags(t):
    start, length = _alloc.aligned_interior(t.data_ptr(), t.untyped_storage().nbytes())
    return vma_of(start if length else t.data_ptr())["flags"]
print(json.dumps({"status": _alloc.hugepage_status(), "small": flags(small), "mid": flags(mid),
                  "big": flags(big)}))
"""


def _child(env_value: str | None) -> dict:
    """Allocate in a fresh process (no earlier advice on its heap), report each buffer's VmFlags."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "FUSIONLENS_HUGEPAGES")}
    if env_value is not None:
        env["FUSIONLENS_HUGEPAGES"] = env_value
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_thp
def test_advice_by_size_and_env_switch() -> None:
    on = _child(None)
    assert on["status"] is None
    assert "hg" in on["big"] and "hg" in on["mid"]
    assert "hg" not in on["small"], "a small output's mapping got huge-page advice"
    off = _child("0")
    assert off["status"] == "turned off by FUSIONLENS_HUGEPAGES=0"
    assert not any("hg" in off[k] for k in ("small", "mid", "big")), off


def test_thp_mode_parsing_and_unsupported_reason(tmp_path, monkeypatch) -> None:
    assert _alloc._thp_mode("always [madvise] never\n") == "madvise"
    assert _alloc._thp_mode("[always] madvise never") == "always"
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    monkeypatch.setattr(_alloc, "THP_ENABLED", never)
    fn, _, reason = _alloc._detect()
    if sys.platform.startswith("linux"):
        assert fn is None and "'never'" in reason
    monkeypatch.setattr(_alloc, "THP_ENABLED", tmp_path / "missing")
    fn, _, reason = _alloc._detect()
    assert fn is None and reason


@needs_thp
def test_madvise_error_turns_advice_off_with_reason(advice_on, monkeypatch) -> None:
    fn, _, _ = _alloc._probed()
    # A "huge page" of 2 MiB + 1 byte gives an address that is not page aligned: a real EINVAL.
    monkeypatch.setattr(_alloc, "_probe", (fn, (2 << 20) + 1, None))
    out = _alloc.empty((LARGE,), torch.float32, CPU)
    assert out.is_contiguous() and out.numel() == LARGE
    status = _alloc.hugepage_status()
    assert status is not None and "madvise(MADV_HUGEPAGE) failed" in status and "errno" in status


def test_aligned_interior() -> None:
    mb2 = 2 << 20
    assert _alloc.aligned_interior(mb2, 2 * mb2) == (mb2, 2 * mb2)
    assert _alloc.aligned_interior(mb2 + 64, 2 * mb2) == (2 * mb2, mb2)
    assert _alloc.aligned_interior(mb2 + 64, mb2) == (2 * mb2, 0)
    start, length = _alloc.aligned_interior(12345 * 4096 + 64, 4 << 20)  # any 4 MiB holds a block
    assert start % mb2 == 0 and length >= mb2
