"""Measured CPU ceilings (quick mode): positive finite numbers, cached per machine, re-read."""
from __future__ import annotations

import json
import math

from profiler.capture.ceilings import machine_fingerprint, measured_ceilings


def test_quick_cpu_ceilings_measure_then_hit_cache(tmp_path):
    first = measured_ceilings("cpu", "quick", root=tmp_path)
    assert first.source == "measured" and first.details["cache"] == "miss"
    for dtype in ("fp32", "fp64"):
        peak = first.peak_flops_per_s[dtype]
        assert math.isfinite(peak) and 1e8 < peak < 1e14  # 0.1 GFLOP/s .. 100 TFLOP/s on any CPU
    assert math.isfinite(first.mem_bw_bytes_per_s) and 1e8 < first.mem_bw_bytes_per_s < 1e13
    assert len(first.details["load_avg"]) == 3 and first.details["threads"] >= 1
    assert first.details["fingerprint"] == machine_fingerprint("cpu")

    cached = json.loads(open(first.details["cache_path"]).read())
    assert cached["fingerprint"]["cpu_count"] and cached["ceilings"]["source"] == "measured"
    second = measured_ceilings("cpu", "quick", root=tmp_path)
    assert second.details["cache"] == "hit"
    assert dict(second.peak_flops_per_s) == dict(first.peak_flops_per_s)
    assert second.mem_bw_bytes_per_s == first.mem_bw_bytes_per_s


def test_damaged_cache_is_remeasured(tmp_path):
    first = measured_ceilings("cpu", "quick", root=tmp_path)
    with open(first.details["cache_path"], "w") as fh:
        fh.write("{not json")
    again = measured_ceilings("cpu", "quick", root=tmp_path)
    assert again.details["cache"] == "miss" and again.mem_bw_bytes_per_s > 0
