"""Measured CPU ceilings (quick mode): positive finite numbers, cached per machine, re-read; each
figure timed for a minimum time; re-measurements keep the best figure."""
from __future__ import annotations

import json
import math
import time

from profiler.capture import ceilings as ceilings_mod
from profiler.capture.ceilings import _best_s, machine_fingerprint, measured_ceilings
from profiler.capture.devices import Ceilings


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


def test_each_cpu_figure_runs_for_its_minimum_time():
    """A figure is the best of at least `repeats` runs and at least `min_s` seconds of runs, so one
    busy moment (a 1 ms matmul preempted three times) cannot set a roof."""
    calls = []

    def work():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    best = _best_s(work, repeats=3, min_s=0.06)
    assert len(calls) - 1 >= 20 and calls[-1] - calls[1] >= 0.05  # minus the warm-up
    assert 0.002 <= best < 0.06
    calls.clear()
    _best_s(work, repeats=3)
    assert len(calls) == 4


def _fixed(peak: float, bw: float) -> Ceilings:
    return Ceilings({"fp32": peak, "fp64": peak / 2}, bw, "measured", {"load_avg": [1.0, 1.0, 1.0]})


def test_a_refresh_keeps_the_best_figure_of_each_run(tmp_path, monkeypatch):
    runs = iter([_fixed(100e9, 20e9), _fixed(30e9, 25e9), _fixed(150e9, 10e9)])
    monkeypatch.setattr(ceilings_mod, "measure_cpu", lambda sizes, device: next(runs))
    first = measured_ceilings("cpu", "quick", root=tmp_path)
    assert first.peak_flops_per_s["fp32"] == 100e9 and "runs_merged" not in first.details
    busy = measured_ceilings("cpu", "quick", refresh=True, root=tmp_path)  # measured low: the roof stays
    assert busy.peak_flops_per_s == {"fp32": 100e9, "fp64": 50e9} and busy.mem_bw_bytes_per_s == 25e9
    assert busy.details["runs_merged"] == 2 and busy.details["this_run"]["peak_flops_per_s"]["fp32"] == 30e9
    best = measured_ceilings("cpu", "quick", refresh=True, root=tmp_path)
    assert best.peak_flops_per_s["fp32"] == 150e9 and best.mem_bw_bytes_per_s == 25e9
    assert best.details["runs_merged"] == 3
    hit = measured_ceilings("cpu", "quick", root=tmp_path)
    assert hit.details["cache"] == "hit" and hit.peak_flops_per_s["fp32"] == 150e9 and hit.details["runs_merged"] == 3
