"""NVML samples written into the capture's Kineto JSON as counter tracks, for Perfetto.

The capture keeps NVML samples in its Parquet Trace (`counters.parquet`), but the Kineto JSON it
also writes is the file users open in Perfetto, and Kineto knows nothing of NVML. Each sample
becomes a Chrome-trace counter event (`"ph": "C"`) on the Kineto clock (µs after the trace's
`baseTimeNanoseconds`), with `pid` = the GPU's index, the pid Kineto gives that GPU's kernel
streams, so utilization, power, SM clock, temperature and throttle reasons draw as tracks beside
the kernels they sampled. FusionLens's own ingestion reads the same events back as counters
(one series per event name), so an upload of the JSON alone keeps them too.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

CATEGORY = "nvml"  # the events' `cat`: what made them (Kineto's own events never use it)
_BASE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
HEAD_BYTES = 1 << 16  # Kineto writes its header (base time, device properties) before the events


def base_time_us(raw: bytes) -> float:
    """Kineto's clock origin in Unix-epoch µs, from the JSON's header (0 when it does not say)."""
    m = _BASE.search(raw, 0, HEAD_BYTES) or _BASE.search(raw)
    return int(m.group(1)) / 1e3 if m else 0.0


def counter_events(samples: pd.DataFrame, base_us: float) -> list[dict]:
    """COUNTER_COLUMNS rows (ts_us in Unix-epoch µs) -> Chrome-trace counter events on the Kineto
    clock, in time order; samples without a device go on pid 0."""
    if samples is None or samples.empty:
        return []
    s = samples.sort_values("ts_us", kind="stable")
    ts = (s["ts_us"].astype("float64") - base_us).round(3).tolist()
    devices = s["device"].astype("Int64").fillna(0).astype("int64").tolist()
    names, values = s["name"].astype(str).tolist(), s["value"].astype("float64").tolist()
    return [{"ph": "C", "cat": CATEGORY, "name": n, "pid": d, "tid": 0, "ts": t, "args": {n: v}}
            for t, d, n, v in zip(ts, devices, names, values)]


def embed_counters(raw_path: Path | str, samples: pd.DataFrame) -> float:
    """Insert `samples` (Unix-epoch µs) at the head of the Kineto JSON's `traceEvents` at
    `raw_path` as counter events, and return Kineto's base time in µs (what puts the samples on
    the trace's clock). The rest of the file is kept byte for byte (no parse, no re-dump); it is
    rewritten only when there is something to add and a `traceEvents` list to add it to."""
    import orjson

    path = Path(raw_path)
    raw = path.read_bytes()
    base_us = base_time_us(raw)
    events = counter_events(samples, base_us)
    m = _EVENTS.search(raw)
    if not events or m is None:
        return base_us
    rest = raw[m.end():]
    empty = rest.lstrip()[:1] == b"]"
    body = b",\n".join(orjson.dumps(e) for e in events) + (b"" if empty else b",")
    path.write_bytes(raw[:m.end()] + b"\n" + body + rest)
    return base_us
