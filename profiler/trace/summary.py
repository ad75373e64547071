"""A short, JSON-ready summary of a Trace (what `python -m profiler summary` prints)."""
from __future__ import annotations

from typing import Any, Mapping

from profiler.trace._columns import describe_unread, most_first
from profiler.trace.model import Trace
from profiler.trace.schema import GPU_KINDS


def summarize(trace: Trace) -> dict[str, Any]:
    """Counts and spans: events, kernels, streams (distinct rank/device/stream on GPU rows), ranks."""
    ev = trace.events
    kernels = ev[ev["kind"] == "kernel"]
    gpu = ev[ev["kind"].isin(sorted(GPU_KINDS))]
    streams = gpu[["rank", "device", "stream"]].drop_duplicates()
    span_us = float((ev["ts_us"] + ev["dur_us"]).max() - ev["ts_us"].min()) if len(ev) else 0.0
    kinds = ev["kind"].value_counts()
    meta = trace.meta
    devices = [p.get("name") for p in meta.get("device_properties", ()) if p.get("name")]
    return {
        "events": int(len(ev)),
        "kernel_count": int(len(kernels)),
        "kernel_total_us": float(kernels["dur_us"].sum()),
        "streams": int(len(streams)),
        "ranks": [int(r) for r in meta.get("ranks", ())],
        "span_us": span_us,
        "skipped_events": int(meta.get("skipped_events", 0)),
        "skipped_reasons": {str(k): int(v) for k, v in meta.get("skipped_reasons", {}).items()},
        "unread_events": most_first(meta.get("unread_events", {})),
        "events_by_kind": {str(k): int(v) for k, v in kinds.items() if v},
        "unique_kernels": int(kernels["name"].nunique()),
        "steps": sorted(int(s) for s in ev["step"].dropna().unique()),
        "memory_events": int(len(trace.memory)),
        "counter_samples": int(len(trace.counters)),
        "devices": devices[:1] + ([f"x{len(devices)}"] if len(devices) > 1 else []),
        "sources": list(meta.get("sources", ())),
        "passed_over_files": [str(m) for m in meta.get("passed_over_files", ())],
        "versions": {str(k): v for k, v in meta.get("versions", {}).items()},
    }


def unread_line(unread: Mapping[str, int], most: int = 6) -> str:
    """'4 events of kinds FusionLens does not model ("xpu_runtime" x3, ph "B" events x1)': what the
    Load page, `summary` and `analyze` say of `meta["unread_events"]`."""
    return (f"{sum(unread.values()):,} events of kinds FusionLens does not model "
            f"({describe_unread(unread, most)})")
