"""Peak resident memory of one call, from the kernel's own counters (Linux).

`peak_rss_delta_bytes(fn)` resets the process's peak-RSS mark (writing 5 to
/proc/self/clear_refs, Linux >= 4.0), runs fn, and returns (fn's result, VmHWM - VmRSS before):
the extra physical memory the call needed at its peak, whatever allocated it (torch's CPU
allocator keeps no statistics, and tracemalloc does not see tensor storage). Large blocks come
from mmap and go back on free, so back-to-back measurements do not inherit each other's peaks;
small ones stay in glibc's heap, so numbers under a few MB are noise.
"""
from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any, Callable

_STATUS = Path("/proc/self/status")


def _kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    if match is None:
        raise OSError(f"{field} not in {_STATUS}")
    return int(match.group(1))


def available() -> str | None:
    """None if peak-RSS probing works here, else why not."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _kib("VmHWM")
    except OSError as exc:
        return f"peak RSS probe unavailable: {exc}"
    return None


def peak_rss_delta_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn(), bytes of resident memory above the starting point at fn's peak)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _kib("VmRSS")
    result = fn()
    return result, max(0, _kib("VmHWM") - before) * 1024
