"""GPU idle time per stream, split by cause: host wait, kernel wait, other.

A stream's idle time is the sum of the gaps between its GPU activities (kernels, memcpy, memset;
overlapping activities merged), from its first start to its last end. Each gap, ending where
activity `next` starts and whose host launch call (matched by correlation) began at `launch`, is
split in two parts:
- `host_wait_us` = the part of the gap before `launch`: the stream had nothing queued and was
  waiting for the host to issue work (Python, the dispatcher, the data loader, a sync);
- the rest, from the launch call (or the gap start, if the launch came earlier) to `next`:
  `kernel_wait_us` when it is at most `kernel_wait_threshold_us` (30 µs by default): the launch
  and dispatch latency between back-to-back kernels; `other_us` when longer: the work was queued
  but waited on something else (an event or another stream, a memcpy on another engine, a sync).
Activities without a matched launch (no correlation) have no host-wait part.

HTA's idle-time breakdown (`get_idle_time_breakdown`) puts each whole gap in one bucket: host
wait when the next kernel's runtime call started after the previous kernel ended; else kernel wait
when the gap is below `consecutive_kernel_delay` (30, in ns in its current ns-based version, so
almost nothing qualifies); else other. Ours splits a gap at the launch call instead, so a long host
stall followed by the usual launch latency counts as host wait plus kernel wait rather than all
host wait, and our threshold is 30 µs (a realistic launch-to-start latency). Gaps are measured
from the furthest end so far on the stream (HTA: the previous kernel's end), so an overlapped
activity never creates a negative gap. Per-stream idle totals agree with HTA's.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analysis.breakdown import gpu_activity
from profiler.analysis.registry import register_analysis

DEFAULT_KERNEL_WAIT_THRESHOLD_US = 30.0
_KEYS = ["rank", "device", "stream"]


def stream_order(trace, with_launch: bool = True) -> pd.DataFrame:
    """GPU activity sorted by (rank, device, stream, start), with `reach_us` (the furthest end
    of this and every earlier activity on the same stream) and `gap_before_us` (idle time on the
    stream right before this row started; 0 when it overlaps or touches earlier work)."""
    g = gpu_activity(trace, with_launch=with_launch)
    g = g.assign(device=g["device"].astype("Int64").fillna(-1), stream=g["stream"].astype("Int64").fillna(-1))
    g = g.sort_values(_KEYS + ["ts_us"], kind="stable").reset_index(drop=True)
    key = g.groupby(_KEYS, sort=False).ngroup().to_numpy()
    reach = g["end_us"].groupby(key).cummax().to_numpy()
    prev_reach = np.full(len(key), np.nan)
    prev_reach[1:] = reach[:-1]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    prev_reach[first] = np.nan
    gap = np.where(first, 0.0, np.maximum(g["ts_us"].to_numpy() - prev_reach, 0.0))
    return g.assign(stream_key=key, reach_us=reach, prev_reach_us=prev_reach, gap_before_us=gap)


def stream_gaps(trace, kernel_wait_threshold_us: float = DEFAULT_KERNEL_WAIT_THRESHOLD_US) -> pd.DataFrame:
    """One row per idle gap on a stream, with its split (see module doc)."""
    if kernel_wait_threshold_us < 0:
        raise ValueError(f"kernel_wait_threshold_us must be >= 0, got {kernel_wait_threshold_us}")
    return _gaps(stream_order(trace, with_launch=True), kernel_wait_threshold_us)


def _gaps(o: pd.DataFrame, kernel_wait_threshold_us: float) -> pd.DataFrame:
    o = o[o["gap_before_us"] > 0]
    start = o["prev_reach_us"].to_numpy()
    gap = o["gap_before_us"].to_numpy()
    launch = o["launch_ts_us"].to_numpy(float)
    host = np.where(np.isnan(launch), 0.0, np.clip(launch - start, 0.0, gap))
    rest = gap - host
    short = rest <= kernel_wait_threshold_us
    return pd.DataFrame({
        "rank": o["rank"].to_numpy(), "device": o["device"].to_numpy(), "stream": o["stream"].to_numpy(),
        "gap_start_us": start, "gap_end_us": o["ts_us"].to_numpy(), "gap_us": gap,
        "next_name": o["name"].array, "next_launch_ts_us": launch,
        "host_wait_us": host, "kernel_wait_us": np.where(short, rest, 0.0),
        "other_us": np.where(short, 0.0, rest)})


@register_analysis("idle_time", "Idle time per stream",
                   "Per rank and stream: idle time split into host wait, kernel wait and other")
def idle_time(trace, kernel_wait_threshold_us: float = DEFAULT_KERNEL_WAIT_THRESHOLD_US) -> pd.DataFrame:
    """Columns: `rank, device, stream, span_us, busy_us, idle_us, host_wait_us, kernel_wait_us,
    other_us, gaps, idle_pct` (idle as % of the stream's span)."""
    if kernel_wait_threshold_us < 0:
        raise ValueError(f"kernel_wait_threshold_us must be >= 0, got {kernel_wait_threshold_us}")
    o = stream_order(trace, with_launch=True)
    span = o.groupby(_KEYS, sort=True).agg(first=("ts_us", "min"), last=("end_us", "max"),
                                          dur_sum=("dur_us", "sum"))
    gaps = _gaps(o, kernel_wait_threshold_us)
    parts = gaps.groupby(_KEYS, sort=True).agg(idle_us=("gap_us", "sum"), host_wait_us=("host_wait_us", "sum"),
                                              kernel_wait_us=("kernel_wait_us", "sum"),
                                              other_us=("other_us", "sum"), gaps=("gap_us", "size"))
    out = span.join(parts, how="left").fillna({c: 0 for c in parts.columns})
    out["span_us"] = out["last"] - out["first"]
    out["busy_us"] = out["span_us"] - out["idle_us"]
    out["gaps"] = out["gaps"].astype("int64")
    with np.errstate(invalid="ignore", divide="ignore"):
        out["idle_pct"] = np.where(out["span_us"] > 0, 100.0 * out["idle_us"] / out["span_us"], 0.0)
    out = out.reset_index()
    out["rank"] = out["rank"].astype("int32")
    return out[["rank", "device", "stream", "span_us", "busy_us", "idle_us", "host_wait_us",
                "kernel_wait_us", "other_us", "gaps", "idle_pct"]]
