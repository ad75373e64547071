"""Whether a process has ended, for tests that check a capture's child or DDP ranks were stopped."""
from __future__ import annotations

import time
from pathlib import Path


def gone(pid: int) -> bool:
    """True when process `pid` no longer runs: it is gone, or dead and not yet reaped (a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or vanishing while read (ESRCH)
        return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """gone(pid), waiting up to timeout_s for it."""
    deadline = time.monotonic() + timeout_s
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return gone(pid)
