"""Memcpy/memset statistics by direction: known bandwidths and raw-JSON byte counts."""
from __future__ import annotations

from collections import defaultdict

import pytest

from profiler.analysis import memcpy
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, raw_gpu, real_trace


def copies_scenario() -> SynthTrace:
    t = SynthTrace()
    specs = [("HtoD", 0, 100, 1_000_000, "Pageable", "Device"), ("HtoD", 200, 100, 2_000_000, "Pinned", "Device"),
             ("DtoH", 400, 200, 4_000_000, "Device", "Pinned"), ("DtoD", 700, 10, 8_000_000, "Device", "Device"),
             ("PtoP", 800, 50, 1_000_000, "Device", "Device")]
    for direction, ts, dur, nbytes, src, dst in specs:
        t.memcpy(direction, ts, dur, nbytes, corr=t.new_corr(), src=src, dst=dst)
    t.memset(900, 5, 1_000_000, corr=t.new_corr())
    t._x("gpu_memcpy", "Memcpy HostToDevice", 1000, 10, t.device, 7, {"bytes": 500, "stream": 7, "device": 0})
    t._x("gpu_memcpy", "Memcpy XtoY", 1100, 10, t.device, 7, {"bytes": 100, "stream": 7, "device": 0})
    return t


def test_directions_bytes_and_bandwidth(tmp_path):
    res = memcpy.memcpy_stats(load(copies_scenario(), tmp_path)).set_index(["op", "direction"])
    htod = res.loc[("memcpy", "HtoD")]
    assert htod["count"] == 3 and htod["bytes"] == 3_000_500 and htod["total_us"] == 210
    assert htod["gb_per_s"] == pytest.approx(3_000_500 / 210e3)
    assert htod["min_gb_per_s"] == pytest.approx(0.05) and htod["max_gb_per_s"] == pytest.approx(20.0)
    assert res.loc[("memcpy", "DtoH"), "gb_per_s"] == pytest.approx(20.0)
    assert res.loc[("memcpy", "DtoD"), "gb_per_s"] == pytest.approx(800.0)
    assert res.loc[("memcpy", "PtoP"), "gb_per_s"] == pytest.approx(20.0)
    assert res.loc[("memset", "memset"), "gb_per_s"] == pytest.approx(200.0)
    assert res.loc[("memcpy", "unknown"), "count"] == 1


def test_a_byte_sum_past_int64_is_unknown(tmp_path):
    """Two copies of 2^62 + 2^61 bytes each sum past int64 (a damaged trace; trace fuzzer seed
    301495): memcpy_stats raised TypeError casting the sum; now that group's bytes are unknown."""
    t = SynthTrace()
    for ts in (0, 100):
        t.memcpy("HtoD", ts, 10, 2**62 + 2**61, corr=t.new_corr())
    t.memcpy("DtoH", 300, 10, 1000, corr=t.new_corr())
    res = memcpy.memcpy_stats(load(t, tmp_path)).set_index(["op", "direction"])
    assert res.loc[("memcpy", "HtoD"), "count"] == 2 and res["bytes"].isna().sum() == 1
    assert res.loc[("memcpy", "DtoH"), "bytes"] == 1000


def test_memory_kinds(tmp_path):
    res = memcpy.memcpy_stats(load(copies_scenario(), tmp_path), by_memory_kind=True)
    htod = res[(res["direction"] == "HtoD") & (res["src_kind"] == "Pageable")].iloc[0]
    assert htod["count"] == 1 and htod["gb_per_s"] == pytest.approx(10.0) and htod["dst_kind"] == "Device"
    pinned = res[(res["direction"] == "HtoD") & (res["src_kind"] == "Pinned")].iloc[0]
    assert pinned["gb_per_s"] == pytest.approx(20.0)


@pytest.mark.parametrize("name", REAL_TRACES)
def test_counts_and_bytes_match_raw_json(name):
    truth = defaultdict(lambda: [0, 0, 0.0])
    for e in raw_gpu(name):
        if e["kind"] == "kernel":
            continue
        key = "memset" if e["kind"] == "gpu_memset" else e["name"].split()[1]
        truth[key][0] += 1
        truth[key][1] += int(e["args"].get("bytes", 0))
        truth[key][2] += e["dur"]
    res = memcpy.memcpy_stats(real_trace(name))
    got = {d: (c, b, t) for d, c, b, t in zip(res["direction"], res["count"], res["bytes"].fillna(0), res["total_us"])}
    assert set(got) == set(truth)
    for d, (c, b, t) in truth.items():
        assert got[d][0] == c and got[d][1] == b
        assert got[d][2] == pytest.approx(t, rel=1e-9, abs=1e-6)
