"""Memory copies and sets: counts, bytes, time and achieved bandwidth, by direction.

Direction comes from the activity name as CUPTI/roctracer/Kineto write it
(`Memcpy HtoD (Pageable -> Device)`, `Memcpy DtoH (Device -> Pinned)`, `Memcpy DtoD`, `Memcpy
HtoH`, `Memcpy PtoP` (peer to peer), spelled-out `HostToDevice` variants), through the
`DIRECTION_PATTERNS` registry; `gpu_memset` rows are `memset`. The memory kinds in parentheses
(`Pageable`, `Pinned`, `Device`, `Managed`, ...) are kept as `src_kind` / `dst_kind`: pageable
host memory makes copies slow and synchronous. AMD traces also carry an args `kind` ("HtoD"),
which the loader does not keep; their names say the same thing.

Achieved bandwidth `gb_per_s` = bytes / time (1 GB = 1e9 bytes), summed over the group; the
`mean_gb_per_s` column is the plain mean of the per-copy bandwidths.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler.analysis.kernel_types import NamePattern, first_label, per_distinct
from profiler.analysis.registry import register_analysis

DIRECTION_PATTERNS: tuple[NamePattern, ...] = (
    NamePattern("HtoD", r"\bHtoD\b|H2D|Host\s*To\s*Device", "host to device"),
    NamePattern("DtoH", r"\bDtoH\b|D2H|Device\s*To\s*Host", "device to host"),
    NamePattern("DtoD", r"\bDtoD\b|D2D|Device\s*To\s*Device", "device to device (same GPU)"),
    NamePattern("HtoH", r"\bHtoH\b|H2H|Host\s*To\s*Host", "host to host"),
    NamePattern("PtoP", r"\bPtoP\b|P2P|Peer", "peer to peer (between GPUs)"),
    NamePattern("DtoA", r"\bDtoA\b|\bAtoD\b|\bAtoA\b|\bHtoA\b|\bAtoH\b", "CUDA arrays"),
)
_KINDS_RE = re.compile(r"\(\s*(\w+)\s*->\s*(\w+)\s*\)")


def _kinds(names: list) -> np.ndarray:
    out = np.empty((len(names), 2), dtype=object)
    for i, n in enumerate(names):  # once per distinct name
        m = _KINDS_RE.search(str(n))
        out[i] = (m.group(1), m.group(2)) if m else (None, None)
    return out


def copies(trace) -> pd.DataFrame:
    """Memcpy/memset rows with `op` (memcpy/memset), `direction`, `src_kind`, `dst_kind`, `gb_per_s`."""
    m = trace.of_kind("gpu_memcpy", "gpu_memset")
    is_set = (m["kind"] == "gpu_memset").to_numpy()
    direction = per_distinct(m["name"], lambda c: np.array(first_label(c, DIRECTION_PATTERNS), dtype=object))
    direction = np.where(is_set, "memset", np.where(pd.isna(direction), "unknown", direction))
    src = per_distinct(m["name"], lambda c: _kinds(c)[:, 0] if len(c) else np.empty(0, dtype=object))
    dst = per_distinct(m["name"], lambda c: _kinds(c)[:, 1] if len(c) else np.empty(0, dtype=object))
    nbytes = m["bytes"].astype("float64").to_numpy()
    dur = m["dur_us"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        bw = np.where(dur > 0, nbytes / (dur * 1e3), np.nan)
    return m.assign(op=np.where(is_set, "memset", "memcpy"), direction=direction,
                    src_kind=np.where(is_set, None, src), dst_kind=dst,
                    gb_per_s=bw)


@register_analysis("memcpy_stats", "Memory copies",
                   "Memcpy/memset counts, bytes, time and achieved bandwidth by direction (HtoD, DtoH, DtoD, PtoP, ...)")
def memcpy_stats(trace, by_memory_kind: bool = False) -> pd.DataFrame:
    """Per rank, op and direction (and src/dst memory kind with `by_memory_kind`): `count, bytes,
    total_us, mean_us, gb_per_s, mean_gb_per_s, min_gb_per_s, max_gb_per_s`."""
    c = copies(trace)
    keys = ["rank", "op", "direction"] + (["src_kind", "dst_kind"] if by_memory_kind else [])
    c = c.assign(_bytes=c["bytes"].astype("float64"))
    g = c.groupby(keys, dropna=False, sort=True)
    out = g.agg(count=("dur_us", "size"), bytes=("_bytes", "sum"), total_us=("dur_us", "sum"),
                mean_us=("dur_us", "mean"), mean_gb_per_s=("gb_per_s", "mean"),
                min_gb_per_s=("gb_per_s", "min"), max_gb_per_s=("gb_per_s", "max")).reset_index()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["gb_per_s"] = np.where(out["total_us"] > 0, out["bytes"] / (out["total_us"] * 1e3), np.nan)
    # a sum past int64 (absurd per-copy sizes, e.g. 2^63 in a damaged trace) is unknown, not a crash
    total = out["bytes"].round()
    out["bytes"] = total.where(total.abs() < 2.0 ** 63).astype("Int64")
    out["count"] = out["count"].astype("int64")
    cols = keys + ["count", "bytes", "total_us", "mean_us", "gb_per_s", "mean_gb_per_s", "min_gb_per_s", "max_gb_per_s"]
    return out[cols]
