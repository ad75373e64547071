"""Allocation of kernel outputs (one place, so the allocation strategy is measured and tuned once).

Large CPU outputs get transparent-huge-page advice. glibc hands blocks over its mmap threshold
(at most 32 MiB after it adapts) straight back to the OS on free, so every fresh output of that
size is a new mapping whose first write takes one page fault per 4 KiB page (25k faults, ~40 ms
for 100 MB on this VM). `madvise(MADV_HUGEPAGE)` on the 2 MiB-aligned interior of the buffer,
before anything touches it, turns those into one fault per 2 MiB (~4x cheaper first write).

- Only Linux CPU tensors of at least `HUGEPAGE_MIN_BYTES`: a smaller buffer holds at most one
  aligned 2 MiB block, and glibc serves it from the reused heap (no faults to save) once its
  threshold has adapted. The threshold is measured in `benchmarks/bench_alloc.py`.
- Support is probed once (Linux, THP mode in /sys not `never`, libc's `madvise` found) and the
  reason kept when unsupported (`hugepage_status()`); a failing madvise turns the advice off for
  the process, with its errno as the reason. `FUSIONLENS_HUGEPAGES=0` turns it off (read per call).
- The advice changes neither values nor layout: outputs stay plain contiguous `torch.empty`
  tensors; memory is not touched here (poisoning fills NaN afterwards, in `registry.new_output`).
- RSS: the whole interior of an output is written by its kernel anyway, so huge pages add no
  resident memory for outputs; the rounding is inside the buffer (aligned interior only).
- Caveat (measured on a Firecracker VM with free page reporting): free 2 MiB blocks are returned
  to the host, so about 1 first touch in 5 lands on one and costs host faults (100 MB: 80-150 ms
  instead of 11 ms; 4 KiB pages: a steady ~43 ms). Bare metal and VMs without page reporting
  do not have this; FUSIONLENS_HUGEPAGES=0 is the switch where it matters.

Once the C++ extension is loaded (`attach_pool`), CPU outputs of `POOL_MIN_BYTES` or more come
from its caching pool instead (kernels/csrc/pool.h): a freed output's block is kept and handed to
the next output that fits, so steady-state calls write to memory that is already mapped. The pool
keeps at most `pool_cap_bytes()` of idle blocks (FUSIONLENS_CPU_POOL_MB; default the smaller of
1 GiB and 1/8 of RAM), least recently freed out first; `empty_output_pool()` gives them back, and
FUSIONLENS_CPU_POOL=0 turns it off (read per call). Peak memory is unchanged (a block is reused
only once its tensor is gone); what it costs is the idle blocks it holds between calls. Under
torch.compile a large output is traced as the op `fusionlens::empty_output`, whose run-time impl is
this same allocation (see `_traced_empty` at the end).
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import _disable_current_modes

HUGEPAGE_BYTES = 2 << 20  # x86-64 / arm64 (4 KiB base pages) PMD size; read from /sys when present
HUGEPAGE_MIN_BYTES = 4 << 20  # measured: below this the aligned interior is < 1 huge page on average
MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>, the same on every Linux architecture
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
THP_PMD_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
POOL_MIN_BYTES = HUGEPAGE_MIN_BYTES  # smaller outputs: glibc's reused heap serves them without faults
POOL_CAP_DEFAULT = 1 << 30

_lock = threading.Lock()
_probe: tuple[object, int, str | None] | None = None  # (madvise fn or None, huge page bytes, reason)
_pool_op = None  # torch.ops.fusionlens.empty_pooled.default once the extension is loaded


def _thp_mode(text: str) -> str:
    """The selected mode of a sysfs THP setting: 'always [madvise] never' -> 'madvise'."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip()


def _detect() -> tuple[object, int, str | None]:
    """(madvise function, huge page bytes, None) when huge-page advice can work, else (None, 0, why)."""
    if not sys.platform.startswith("linux"):
        return None, 0, f"huge-page advice is Linux-only (platform {sys.platform})"
    try:
        mode = _thp_mode(THP_ENABLED.read_text())
    except OSError as exc:
        return None, 0, f"transparent huge pages unavailable ({THP_ENABLED}: {exc.strerror or exc})"
    if mode not in ("always", "madvise"):
        return None, 0, f"transparent huge pages are {mode!r} in {THP_ENABLED}"
    try:
        page = int(THP_PMD_SIZE.read_text().strip())
    except (OSError, ValueError):
        page = HUGEPAGE_BYTES
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError) as exc:
        return None, 0, f"libc madvise not found ({exc})"
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn, page, None


def _probed() -> tuple[object, int, str | None]:
    global _probe
    if _probe is None:
        with _lock:
            if _probe is None:
                _probe = _detect()
    return _probe


def _disable(reason: str) -> None:
    global _probe
    with _lock:
        _probe = (None, 0, reason)


def _switched_on(var: str) -> bool:
    """An on/off environment switch, on unless set to 0 (or 'false'/'off'/'no'); read per call."""
    return os.environ.get(var, "1").strip().lower() not in ("0", "false", "off", "no")


def hugepages_enabled_by_env() -> bool:
    """False when FUSIONLENS_HUGEPAGES=0 (or 'false'/'off'/'no')."""
    return _switched_on("FUSIONLENS_HUGEPAGES")


def hugepage_status() -> str | None:
    """None when large CPU outputs get huge-page advice, else the reason they do not."""
    if not hugepages_enabled_by_env():
        return "turned off by FUSIONLENS_HUGEPAGES=0"
    return _probed()[2]


def hugepage_bytes() -> int:
    """This machine's huge page size in bytes (0 when the advice is unavailable)."""
    return _probed()[1]


def aligned_interior(ptr: int, nbytes: int, page: int = HUGEPAGE_BYTES) -> tuple[int, int]:
    """(start, length) of the whole `page`-aligned blocks inside [ptr, ptr + nbytes); length may be 0."""
    start = (ptr + page - 1) // page * page
    end = (ptr + nbytes) // page * page
    return start, max(end - start, 0)


def advise_hugepages(t: torch.Tensor) -> bool:
    """madvise(MADV_HUGEPAGE) the aligned interior of t's storage; True when advice was given."""
    fn, page, reason = _probed()
    if fn is None or reason is not None:
        return False
    start, length = aligned_interior(t.data_ptr(), t.untyped_storage().nbytes(), page)
    if length == 0:
        return False
    if fn(start, length, MADV_HUGEPAGE) != 0:  # type: ignore[operator]
        err = ctypes.get_errno()
        _disable(f"madvise(MADV_HUGEPAGE) failed: {os.strerror(err)} (errno {err})")
        return False
    return True


def pool_enabled_by_env() -> bool:
    """False when FUSIONLENS_CPU_POOL=0 (or 'false'/'off'/'no')."""
    return _switched_on("FUSIONLENS_CPU_POOL")


def pool_cap_bytes() -> int:
    """The most idle memory the pool keeps: FUSIONLENS_CPU_POOL_MB, else min(1 GiB, RAM / 8)."""
    env = os.environ.get("FUSIONLENS_CPU_POOL_MB", "").strip()
    if env:
        try:
            return max(int(float(env) * (1 << 20)), 0)
        except ValueError:  # a typo must not take the C++ kernels down: say so once, use the default
            warnings.warn(f"FUSIONLENS_CPU_POOL_MB={env!r} is not a number of MiB: using the default cap",
                          stacklevel=2)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return POOL_CAP_DEFAULT
    return min(POOL_CAP_DEFAULT, ram // 8)


def attach_pool() -> None:
    """Called once the C++ extension is loaded: configure its pool and route large CPU outputs to it."""
    global _pool_op
    ops = torch.ops.fusionlens
    # outside any dispatch mode: when the first call is traced (torch.export, a FLOPs recorder),
    # the mode would record the configuration as one of the model's ops
    with _disable_current_modes():
        ops.pool_configure(pool_cap_bytes(), POOL_MIN_BYTES, hugepage_status() is None)
    if _pool_op is None:
        torch.library.register_fake("fusionlens::empty_output", _empty_output_fake)
    _pool_op = ops.empty_pooled.default


def pool_status() -> str | None:
    """None when large CPU outputs come from the pool, else the reason they do not."""
    if not pool_enabled_by_env():
        return "turned off by FUSIONLENS_CPU_POOL=0"
    if _pool_op is None:
        return "the C++ extension (which holds the pool) is not loaded"
    return None


def pool_min_bytes() -> int:
    """The smallest output the pool serves now; 0 when it is off (norm_train's argument)."""
    return POOL_MIN_BYTES if pool_status() is None else 0


def output_pool_stats() -> dict[str, int]:
    """The pool's counters: idle bytes and blocks held, bytes of live pooled outputs, hits, misses,
    bytes evicted, cap and minimum size. All zero before the C++ extension is loaded."""
    keys = ("held_bytes", "held_blocks", "live_bytes", "hits", "misses", "evicted_bytes", "cap_bytes", "min_bytes")
    if _pool_op is None:
        return dict.fromkeys(keys, 0)
    return dict(zip(keys, torch.ops.fusionlens.pool_stats()))


def empty_output_pool() -> int:
    """Give every idle pooled block back to the OS (as torch.cuda.empty_cache); returns the bytes freed."""
    return int(torch.ops.fusionlens.pool_empty()) if _pool_op is not None else 0


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous tensor for a kernel output: from the pool when large and on the
    CPU, else torch.empty with huge-page advice when large (see above)."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    if torch.compiler.is_compiling():
        return _traced_empty(shape, dtype, device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= POOL_MIN_BYTES and pool_status() is None:
        return _pool_op(shape, dtype)
    out = torch.empty(shape, dtype=dtype, device=device)
    if nbytes >= HUGEPAGE_MIN_BYTES and hugepages_enabled_by_env():
        advise_hugepages(out)
    return out


# Under torch.compile tracing the pool op cannot be called (Dynamo would run it once and bake its
# output into the graph as a constant) nor the huge-page advice traced (`UntypedStorage.nbytes`).
# A large CPU output is traced as `fusionlens::empty_output` instead: an opaque op of the C++
# extension (kernels/csrc/pool.cpp) that makes the same choice as `empty` above at run time, so a
# compiled graph's large outputs come from the pool too. Inductor's own allocations are fresh
# mappings every call: a compiled SwiGLU module's forward + backward at 4096 x 3072 fp32 ran 112 ms
# on them against eager's 25 (page faults), 26 ms on the pool. Its fake (tracing) impl is
# registered here once the extension is loaded (`attach_pool`).
def _empty_output_fake(shape: list, dtype: torch.dtype) -> torch.Tensor:
    _keep_apart()
    return torch.empty(shape, dtype=dtype)


def _keep_apart() -> None:
    """Keep AOTAutograd's common-subexpression pass from merging two `empty_output` calls, as it
    does not merge aten.empty: two outputs of one shape (a forward's y and its backward's dx) would
    share one node, which the forward then saves for the backward, so Inductor copies it instead of
    writing in place (LayerNorm 4096 x 768 fwd+bwd compiled: 7.0 ms against 3.9 on Inductor's own
    allocations). The pass skips the ops in its `rand_ops` list (private, read defensively;
    tests/kernels/test_compile_pool.py checks the outcome). Run by the fake kernel, so only once
    something traces the op, and outside Dynamo's own tracing of Python."""
    from torch._functorch import compile_utils  # loaded by then: torch.compile imports it

    no_cse, op = getattr(compile_utils, "rand_ops", None), torch.ops.fusionlens.empty_output
    if isinstance(no_cse, list) and op not in no_cse:
        no_cse.append(op)


def _traced_empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The traced allocation of a kernel output: `fusionlens::empty_output` for a CPU output that
    may be large (static shapes decide now, without a guard; symbolic ones at run time), else
    torch.empty, which Inductor allocates itself without a Python call."""
    if device.type == "cpu" and _pool_op is not None:  # the op is the extension's (no pool without it)
        small = math.prod(shape) * dtype.itemsize < POOL_MIN_BYTES
        if not torch.fx.experimental.symbolic_shapes.statically_known_true(small):  # decided without a guard
            return torch.ops.fusionlens.empty_output(list(shape), dtype)
    return torch.empty(shape, dtype=dtype, device=device)
