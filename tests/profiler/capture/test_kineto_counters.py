"""NVML samples written into the capture's Kineto JSON as counter tracks (profiler/capture/
kineto_counters.py): the file stays valid JSON with every Kineto event as it was, and ingesting it
gives back the samples on the trace's clock, as the capture's own Trace has them."""
from __future__ import annotations

import json
import shutil

import orjson
import pandas as pd
import pytest

from profiler.capture.backends import CapturePlan
from profiler.capture.kineto_counters import CATEGORY, base_time_us, embed_counters
from profiler.capture.runner import capture, nvml_counters
from profiler.trace import load_trace
from profiler.trace.schema import COUNTER_COLUMNS


@pytest.fixture(scope="module")
def kineto_json(tmp_path_factory):
    """A real Kineto JSON from a CPU capture (the NVML sampler itself needs a GPU)."""
    out = tmp_path_factory.mktemp("cap")
    res = capture("mlp", CapturePlan(mode="infer", wait=0, warmup=0, active=2, flops=False), out, size="tiny")
    return res.raw_path


def _samples(base_us: float, t0_us: float) -> pd.DataFrame:
    """Two GPUs, three counters, samples 0-900 µs after the trace's first event (Unix-epoch µs)."""
    rows = [(base_us + t0_us + 100.0 * i + d, d, name, float(10 * i + d))
            for i in range(10) for d in (0, 1) for name in ("gpu_util_pct", "power_w", "sm_clock_mhz")]
    df = pd.DataFrame(rows, columns=["ts_us", "device", "name", "value"]).assign(rank=0)
    return df.astype(COUNTER_COLUMNS)[list(COUNTER_COLUMNS)]


def test_counters_go_into_the_kineto_json_and_come_back_on_the_trace_clock(kineto_json, tmp_path) -> None:
    raw = tmp_path / "k.json"
    shutil.copy(kineto_json, raw)
    before = orjson.loads(raw.read_bytes())
    trace = load_trace(str(raw))
    base_us = base_time_us(raw.read_bytes())
    assert base_us == before["baseTimeNanoseconds"] / 1e3 > 1e15
    samples = _samples(base_us, trace.meta["t0_us"])

    mapped = nvml_counters(samples, raw, trace)  # what the capture's Trace keeps; writes the JSON
    after = orjson.loads(raw.read_bytes())
    ours = [e for e in after["traceEvents"] if e.get("cat") == CATEGORY]
    assert len(ours) == len(samples) and all(e["ph"] == "C" for e in ours)
    assert [e for e in after["traceEvents"] if e.get("cat") != CATEGORY] == before["traceEvents"]
    assert {k: v for k, v in after.items() if k != "traceEvents"} == {k: v for k, v in before.items() if k != "traceEvents"}

    back = load_trace(str(raw))
    assert len(back.events) == len(trace.events) and back.meta["t0_us"] == trace.meta["t0_us"]
    key = ["device", "name", "ts_us"]
    got = back.counters.astype({"name": str}).sort_values(key, ignore_index=True)
    want = mapped.astype({"name": str}).sort_values(key, ignore_index=True)
    assert got["device"].tolist() == want["device"].tolist() and got["name"].tolist() == want["name"].tolist()
    assert got["value"].tolist() == want["value"].tolist()
    assert (got["ts_us"] - want["ts_us"]).abs().max() < 1e-3
    # float64 Unix-epoch µs (~1.8e15) resolve 0.25 µs
    assert want["ts_us"].min() == pytest.approx(0.0, abs=0.5) and want["ts_us"].max() == pytest.approx(901.0, abs=0.5)


def test_an_empty_event_list_and_no_samples(tmp_path) -> None:
    raw = tmp_path / "k.json"
    raw.write_text(json.dumps({"baseTimeNanoseconds": 2_000_000_000_000_000_000, "traceEvents": []}))
    samples = _samples(2e15, 0.0).head(2)
    assert embed_counters(raw, samples) == 2e15
    assert len(orjson.loads(raw.read_bytes())["traceEvents"]) == 2  # valid JSON: no trailing comma
    untouched = raw.read_bytes()
    embed_counters(raw, samples.head(0))
    assert raw.read_bytes() == untouched
