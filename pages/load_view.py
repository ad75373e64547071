"""Pure helpers behind the Load page: duration formatting, the per-rank table, the clock check, the
top-kernels table.

No streamlit here (the page draws; this module decides), so every rule is unit-testable.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import pandas as pd

# (threshold in µs, divisor, unit, format): the first row whose threshold the value reaches.
_DURATION_UNITS = ((86_400e6, 86_400e6, "days", "{:,.1f}"), (3_600e6, 3_600e6, "h", "{:,.2f}"),
                   (60e6, 60e6, "min", "{:,.2f}"), (1e6, 1e6, "s", "{:,.3f}"), (1e3, 1e3, "ms", "{:,.2f}"),
                   (0.0, 1.0, "µs", "{:,.2f}"))


def fmt_duration_us(us: Optional[float]) -> str:
    """A duration in µs as a short readable string: 1.76 µs, 12.55 ms, 13.336 s, 2.5 h, 19,184.0 days."""
    if us is None or pd.isna(us):
        return "-"
    if us == 0:
        return "0 µs"
    for threshold, divisor, unit, fmt in _DURATION_UNITS:
        if abs(us) >= threshold:
            return f"{fmt.format(us / divisor)} {unit}"
    return f"{us:,.2f} µs"  # negative: keep the sign, µs


def device_names(props: Any) -> str:
    """'NVIDIA H100 80GB HBM3 x8' from a deviceProperties list; '' when no device has a name."""
    names = [str(p.get("name")) for p in (props or ()) if isinstance(p, Mapping) and p.get("name")]
    if not names:
        return ""
    kinds = list(dict.fromkeys(names))
    return ", ".join(f"{n} x{names.count(n)}" if names.count(n) > 1 else n for n in kinds)


def identity_line(meta: Mapping[str, Any]) -> str:
    """One caption for a single-rank trace: 'Rank 1 of 2 · Device: Tesla V100-SXM2-16GB x2'."""
    ranks = list(meta.get("ranks") or ())
    world = (meta.get("distributed_info") or {}).get("world_size")
    parts = []
    if len(ranks) == 1 and isinstance(world, int) and world > 1:
        parts.append(f"Rank {ranks[0]} of {world} (the other ranks' files were not loaded)")
    device = device_names(meta.get("device_properties"))
    capture = meta.get("capture")
    plan = (capture.get("plan") or {}) if isinstance(capture, Mapping) else {}
    if not device and plan.get("device"):
        device = f"{plan['device']} (captured on this machine by FusionLens)"
    parts.append("Device: " + (device or "not recorded in the trace (deviceProperties has no names)"))
    return " · ".join(parts)


def rank_frame(trace) -> pd.DataFrame:
    """One row per rank: where it came from, its device(s), world size, events, kernels, time range."""
    ev = trace.events
    per_rank = trace.meta.get("per_rank") or {}
    rows = []
    for rank, info in sorted(per_rank.items()):
        mine = ev[ev["rank"] == rank]
        dist = info.get("distributed_info") or {}
        kernels = mine[mine["kind"] == "kernel"]
        rows.append({
            "rank": int(rank), "file": str(info.get("source", "")).replace("\\", "/").rsplit("/", 1)[-1],
            "device": device_names(info.get("device_properties")) or "not recorded",
            "world size": "-" if dist.get("world_size") is None else str(dist.get("world_size")),
            "events": int(len(mine)), "kernels": int(len(kernels)),
            "kernel time": fmt_duration_us(float(kernels["dur_us"].sum())),
            "starts at": fmt_duration_us(float(mine["ts_us"].min())) if len(mine) else "-",
            "span": fmt_duration_us(float((mine["ts_us"] + mine["dur_us"]).max() - mine["ts_us"].min()))
            if len(mine) else "-",
        })
    return pd.DataFrame(rows)


def clock_warning(trace) -> Optional[str]:
    """A one-line warning when two ranks never overlap in time, else None.

    Ranks of one run are profiled at the same time, so their intervals overlap once the loader has
    aligned them on the earliest event. Disjoint intervals mean different runs or unrelated clocks
    (e.g. one file in epoch time, one relative): cross-rank numbers (span, stragglers) then mean nothing.
    """
    ev = trace.events
    if ev.empty or ev["rank"].nunique() < 2:
        return None
    ends = ev["ts_us"] + ev["dur_us"]
    spans = pd.DataFrame({"start": ev["ts_us"], "end": ends, "rank": ev["rank"]}).groupby("rank")
    ranges = spans.agg({"start": "min", "end": "max"}).sort_values("start")
    prev_rank, prev_end = None, None
    for rank, row in ranges.iterrows():
        if prev_end is not None and row["start"] > prev_end:
            gap = fmt_duration_us(float(row["start"] - prev_end))
            return (f"Ranks {prev_rank} and {rank} never overlap in time (rank {rank} starts {gap} after rank "
                    f"{prev_rank} ends): different runs or unrelated clocks, so the span and cross-rank "
                    "timings are not meaningful.")
        if prev_end is None or row["end"] > prev_end:
            prev_rank, prev_end = rank, row["end"]
    return None


def top_kernels(trace, n: int = 15) -> pd.DataFrame:
    """The `n` kernels with the most total time: calls, total (ms), mean (µs), share (%)."""
    k = trace.kernels
    if k.empty:
        return pd.DataFrame()
    g = k.groupby("name", observed=True)["dur_us"].agg(["count", "sum", "mean"])
    g = g.sort_values("sum", ascending=False).head(n)
    total_us = float(k["dur_us"].sum())
    return pd.DataFrame({
        "kernel": g.index.astype(str), "calls": g["count"].astype(int).to_numpy(),
        "total (ms)": (g["sum"] / 1e3).to_numpy(), "mean (µs)": g["mean"].to_numpy(),
        "share (%)": (100.0 * g["sum"] / total_us).to_numpy() if total_us > 0 else float("nan"),
    })
