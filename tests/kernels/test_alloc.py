"""Kernel output allocation (`kernels/_alloc.py`): huge-page advice for large CPU outputs, and the
output pool (kernels/csrc/pool.cpp) they come from once the C++ extension is loaded (at the end).

The truth for "the advice is applied" is the kernel's own view of the mapping: the VMA that holds
the buffer's 2 MiB-aligned interior carries the `hg` flag (MADV_HUGEPAGE) in /proc/self/smaps and,
once written, is backed by AnonHugePages. Whether this machine supports it is read here
independently from /sys, so the tests fail if the feature silently stops working where it can.
"""
from __future__ import annotations

import io
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
    """The plain-allocation road (pool off), with huge-page advice on."""
    monkeypatch.delenv("FUSIONLENS_HUGEPAGES", raising=False)
    monkeypatch.setenv("FUSIONLENS_CPU_POOL", "0")


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


# --- the output pool ------------------------------------------------------------------------
MIB = 1 << 20


@pytest.fixture
def pool(cpu_provider, monkeypatch):
    """The pool on, emptied, with its configuration restored afterwards."""
    from kernels._build import load_cpu_ops

    load_cpu_ops()
    monkeypatch.delenv("FUSIONLENS_CPU_POOL", raising=False)
    monkeypatch.delenv("FUSIONLENS_CPU_POOL_MB", raising=False)
    _alloc.attach_pool()
    _alloc.empty_output_pool()
    yield torch.ops.fusionlens
    _alloc.attach_pool()
    _alloc.empty_output_pool()


def stats() -> dict[str, int]:
    return _alloc.output_pool_stats()


def fp32(mib: float) -> tuple[int]:
    return (int(mib * MIB) // 4,)


def test_a_freed_output_block_is_handed_out_again(pool) -> None:
    assert _alloc.pool_status() is None
    a = _alloc.empty(fp32(8), torch.float32, CPU)
    ptr, before = a.data_ptr(), stats()
    assert ptr % (2 * MIB) == 0 and before["live_bytes"] >= 8 * MIB
    del a
    assert stats()["held_bytes"] == before["held_bytes"] + 8 * MIB
    b = _alloc.empty((2048, 1024), torch.bfloat16, CPU)  # 4 MiB of another dtype: not a fit (8 > 4 * 1.25)
    assert b.data_ptr() != ptr
    c = _alloc.empty(fp32(7), torch.int32, CPU)  # 7 MiB rounds to 8: the same block
    assert c.data_ptr() == ptr and stats()["hits"] == before["hits"] + 1
    assert tuple(c.shape) == fp32(7) and c.dtype == torch.int32 and c.is_contiguous()
    assert c.untyped_storage().nbytes() == 7 * MIB
    d = _alloc.empty(fp32(12), torch.float32, CPU)  # larger than every idle block: a fresh one
    assert d.data_ptr() not in (ptr, b.data_ptr())


def test_of_equal_blocks_the_most_recently_freed_comes_back(pool) -> None:
    """LIFO among blocks of one size: the block just freed may still be in the CPU's caches."""
    a, b = _alloc.empty(fp32(8), torch.float32, CPU), _alloc.empty(fp32(8), torch.float32, CPU)
    pb = b.data_ptr()
    assert a.data_ptr() != pb
    del a, b  # a freed first, b last
    for _ in range(3):
        t = _alloc.empty(fp32(8), torch.float32, CPU)
        assert t.data_ptr() == pb
        del t


def test_a_promoted_fp32_output_over_the_minimum_is_pooled(pool) -> None:
    """llama RMSNorm on a 3 MiB bf16 x with an fp32 weight writes a 6 MiB fp32 output: pooled."""
    x = torch.randn(1024, 1536).bfloat16()
    live = stats()["live_bytes"]
    y = kernels.rms_norm(x, torch.randn(1536), 1e-6, provider="cpu")
    assert y.dtype == torch.float32 and stats()["live_bytes"] == live + 6 * MIB


def test_small_outputs_and_other_devices_do_not_use_the_pool(pool) -> None:
    before = stats()
    small = _alloc.empty((1000, 1000), torch.float32, CPU)  # 3.8 MiB, under the 4 MiB minimum
    assert stats()["live_bytes"] == before["live_bytes"] and small.numel() == 10**6


def test_idle_blocks_are_capped_least_recently_freed_first(pool) -> None:
    pool.pool_configure(16 * MIB, _alloc.POOL_MIN_BYTES, False)
    blocks = [_alloc.empty(fp32(8), torch.float32, CPU) for _ in range(3)]
    ptrs = [t.data_ptr() for t in blocks]
    evicted = stats()["evicted_bytes"]
    for i in range(3):  # freed in order 0, 1, 2: block 0 is the least recently freed, so it leaves
        blocks[i] = None
    s = stats()
    assert s["held_bytes"] == 16 * MIB and s["held_blocks"] == 2 and s["evicted_bytes"] == evicted + 8 * MIB
    again = [_alloc.empty(fp32(8), torch.float32, CPU) for _ in range(2)]  # newest first
    assert [t.data_ptr() for t in again] == [ptrs[2], ptrs[1]]
    big = _alloc.empty(fp32(20), torch.float32, CPU)  # over the cap: freed at once, never held
    del big
    assert stats()["held_bytes"] <= 16 * MIB


def test_empty_output_pool_gives_idle_blocks_back(pool) -> None:
    t = [_alloc.empty(fp32(6), torch.float32, CPU) for _ in range(2)]
    kept = _alloc.empty(fp32(6), torch.float32, CPU)
    kept.fill_(2.0)
    del t
    assert stats()["held_bytes"] == 2 * 6 * MIB
    assert kernels.empty_output_pool() == 12 * MIB
    assert stats()["held_bytes"] == 0 and stats()["held_blocks"] == 0
    assert bool((kept == 2.0).all())  # a live output is untouched
    del kept
    assert stats()["held_bytes"] == 6 * MIB


def test_switched_off_by_env(pool, monkeypatch) -> None:
    monkeypatch.setenv("FUSIONLENS_CPU_POOL", "0")
    assert _alloc.pool_status() == "turned off by FUSIONLENS_CPU_POOL=0" and _alloc.pool_min_bytes() == 0
    before = stats()
    t = _alloc.empty(fp32(8), torch.float32, CPU)
    assert stats()["live_bytes"] == before["live_bytes"] and t.numel() == 2 * MIB


def test_cap_from_env(monkeypatch) -> None:
    monkeypatch.setenv("FUSIONLENS_CPU_POOL_MB", "64")
    assert _alloc.pool_cap_bytes() == 64 * MIB
    monkeypatch.delenv("FUSIONLENS_CPU_POOL_MB")
    default = _alloc.pool_cap_bytes()
    assert 0 < default <= 1 << 30
    monkeypatch.setenv("FUSIONLENS_CPU_POOL_MB", "lots")
    with pytest.warns(UserWarning, match="FUSIONLENS_CPU_POOL_MB='lots' is not a number"):
        assert _alloc.pool_cap_bytes() == default


def test_pooled_tensors_resize_and_keep_their_values(pool) -> None:
    t = _alloc.empty(fp32(5), torch.float32, CPU)
    t.copy_(torch.arange(t.numel(), dtype=torch.float32))
    n = t.numel()
    t.resize_(3 * n)  # a new block from the pool's allocator, the old values copied over
    assert bool((t[:n] == torch.arange(n, dtype=torch.float32)).all())
    t.resize_(10)
    assert t.tolist() == list(range(10))
    t.resize_(0)
    del t
    assert stats()["live_bytes"] == 0


def test_threads_allocate_and_free_concurrently(pool) -> None:
    import threading

    errors: list[str] = []

    def work(k: int) -> None:
        g = torch.Generator().manual_seed(k)
        for i in range(60):
            mib = 4 + int(torch.randint(0, 9, (1,), generator=g))
            t = _alloc.empty(fp32(mib), torch.float32, CPU)
            t.fill_(float(k * 1000 + i))
            if not bool((t == float(k * 1000 + i)).all()):
                errors.append(f"thread {k} step {i}: a block was shared")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    s = stats()
    assert s["live_bytes"] == 0 and s["hits"] > 0 and s["held_bytes"] <= s["cap_bytes"]


_FORK_CHILD = r"""
import os, sys, threading, torch
sys.path.insert(0, sys.argv[1])
import kernels
from kernels import _alloc
from kernels._build import load_cpu_ops
load_cpu_ops()
keep = [_alloc.empty((1 << 21,), torch.float32, torch.device("cpu")) for _ in range(3)]
del keep[0]
pid = os.fork()
if pid == 0:  # the child allocates, frees and empties the pool it inherited
    t = _alloc.empty((1 << 21,), torch.float32, torch.device("cpu")); t.fill_(1.0)
    ok = bool((t == 1.0).all()); del t, keep
    _alloc.empty_output_pool()
    os._exit(0 if ok and _alloc.output_pool_stats()["live_bytes"] == 0 else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_uses_its_copy_of_the_pool(cpu_provider) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FUSIONLENS_CPU_POOL", "FUSIONLENS_CPU_POOL_MB")}
    proc = subprocess.run([sys.executable, "-c", _FORK_CHILD, str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "child 0"


@pytest.mark.parametrize("case", ["layer_norm", "add_rms_norm", "gelu", "softmax"])
def test_large_kernel_outputs_from_the_pool_match_plain_allocation(pool, monkeypatch, case) -> None:
    """Fused ops writing pooled outputs (reused blocks holding old values, NaN-poisoned first)
    give the bits they give with plain allocation, forward and backward."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 2048, generator=g)  # 8 MiB fp32 rows: every output is pooled
    r, w, b = torch.randn(1024, 2048, generator=g), torch.randn(2048, generator=g), torch.randn(2048, generator=g)
    run = {"layer_norm": lambda x: kernels.layer_norm(x, w, b, 1e-5, provider="cpu"),
           "add_rms_norm": lambda x: kernels.add_rms_norm(x, r, w, 1e-6, provider="cpu")[1],
           "gelu": lambda x: kernels.gelu(x, provider="cpu"),
           "softmax": lambda x: kernels.softmax(x, scale=0.5, provider="cpu")}[case]

    def step():
        xr = x.clone().requires_grad_()
        with poison_outputs():
            y = run(xr)
            (gx,) = torch.autograd.grad(y, xr, torch.ones_like(y))
        return y.detach(), gx

    first = [t.clone() for t in step()]  # plain copies: the pooled outputs are freed here
    hits = stats()["hits"]
    pooled = step()  # on the blocks `first`'s outputs left behind
    assert stats()["hits"] > hits
    monkeypatch.setenv("FUSIONLENS_CPU_POOL", "0")
    plain = step()
    for a, c in zip(pooled, plain):
        assert not bool(a.isnan().any()) and torch.equal(a, c)
    assert torch.equal(first[0], plain[0])


def test_pooled_tensors_share_pickle_and_outlive_their_tensor_through_numpy(pool) -> None:
    t = _alloc.empty(fp32(8), torch.float32, CPU)
    t.fill_(3.0)
    t.share_memory_()  # data moves to shared memory; the pooled block goes back to the pool
    assert t.is_shared() and bool((t == 3.0).all()) and stats()["live_bytes"] == 0
    u = _alloc.empty(fp32(8), torch.float32, CPU)
    u.fill_(2.0)
    buf = io.BytesIO()
    torch.save(u, buf)
    buf.seek(0)
    assert bool((torch.load(buf) == 2.0).all())
    view = u.numpy()  # keeps the block alive after the tensor is gone
    del u
    assert stats()["live_bytes"] == 8 * MIB and float(view[-1]) == 2.0
    del view
    assert stats()["live_bytes"] == 0
