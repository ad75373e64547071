"""A capture whose ops beat the cached CPU roof re-measures it (the cache keeps the best figures):
no op runs faster than a real roof, so the cached one was measured on a busy machine."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from profiler.capture import ceilings as ceilings_mod
from profiler.capture import report
from profiler.capture.backends import CapturePlan
from profiler.capture.devices import Ceilings
from profiler.capture.runner import capture


def test_only_op_types_with_enough_time_and_margin_count():
    table = pd.DataFrame({"name": ["a", "b", "c", "d"], "dtype": "fp32",
                          "dur_us": [1000.0, 999.0, 5000.0, 5000.0],
                          "achieved_flops_per_s": [12e9, 50e9, 10.9e9, 11.1e9],
                          "peak_flops_per_s": [10e9] * 4})
    assert list(report.above_compute_roof(table)["name"]) == ["a", "d"]
    assert report.above_compute_roof(table.iloc[0:0]).empty


@pytest.fixture(scope="module")
def mlp_capture(tmp_path_factory):
    plan = CapturePlan(mode="infer", wait=0, warmup=0, active=1)
    out = tmp_path_factory.mktemp("mlp")
    return capture("mlp", plan, out, size="tiny"), plan


def _ceilings(peak: float, **details) -> Ceilings:
    return Ceilings({"fp32": peak, "fp64": peak / 2, "bf16": peak * 2}, 20e9, "measured", details)


def _fake_measure(monkeypatch, cached: Ceilings, fresh: Ceilings) -> list[bool]:
    """measured_ceilings returning `cached`, then `fresh` on refresh; returns the refresh flags seen."""
    calls: list[bool] = []

    def fake(device, mode="full", refresh=False, root=None):
        calls.append(refresh)
        return fresh if refresh else cached

    monkeypatch.setattr(ceilings_mod, "measured_ceilings", fake)
    monkeypatch.setattr(report, "REMEASURE_MIN_US", 0.0)  # the tiny MLP's ops are microseconds
    return calls


def test_a_roof_below_the_ops_is_measured_again(mlp_capture, tmp_path, monkeypatch):
    result, plan = mlp_capture
    calls = _fake_measure(monkeypatch, _ceilings(1e3), _ceilings(1e15, runs_merged=2))
    summary = report.write_outputs(result, plan, tmp_path, "quick")
    assert calls == [False, True]
    used = summary["roofline_ceilings"]
    assert used["peak_flops_per_s"]["fp32"] == 1e15
    because = used["details"]["remeasured_because"]
    assert "GFLOP/s, above the cached fp32 roof 0.0 GFLOP/s" in because and because.startswith("aten::")
    table = pd.read_csv(tmp_path / "roofline.csv")
    assert (table["peak_flops_per_s"] == 1e15).all()
    saved = json.loads((tmp_path / "trace" / "meta.json").read_text())
    assert saved["capture"]["roofline_ceilings"]["details"]["remeasured_because"] == because


def test_a_roof_the_ops_stay_under_is_kept(mlp_capture, tmp_path, monkeypatch):
    result, plan = mlp_capture
    calls = _fake_measure(monkeypatch, _ceilings(1e15), _ceilings(2e15))
    summary = report.write_outputs(result, plan, tmp_path, "quick")
    assert calls == [False] and summary["roofline_ceilings"]["peak_flops_per_s"]["fp32"] == 1e15


def test_a_roof_merged_often_enough_stands(mlp_capture, tmp_path, monkeypatch):
    """After REMEASURE_MAX_RUNS merged runs an op over the roof (say a FLOPs formula counting high)
    no longer costs a measurement per capture; the chart still shows it above the roof."""
    result, plan = mlp_capture
    calls = _fake_measure(monkeypatch, _ceilings(1e3, runs_merged=report.REMEASURE_MAX_RUNS), _ceilings(1e15))
    summary = report.write_outputs(result, plan, tmp_path, "measured")
    assert calls == [False] and summary["roofline_ceilings"]["peak_flops_per_s"]["fp32"] == 1e3


def test_a_failed_remeasurement_keeps_the_cached_roofs_and_says_why(mlp_capture, tmp_path, monkeypatch):
    result, plan = mlp_capture

    def fake(device, mode="full", refresh=False, root=None):
        if refresh:
            raise OSError("disk full")
        return _ceilings(1e3)

    monkeypatch.setattr(ceilings_mod, "measured_ceilings", fake)
    monkeypatch.setattr(report, "REMEASURE_MIN_US", 0.0)
    summary = report.write_outputs(result, plan, tmp_path, "quick")
    details = summary["roofline_ceilings"]["details"]
    assert summary["roofline_ceilings"]["peak_flops_per_s"]["fp32"] == 1e3 and (tmp_path / "roofline.csv").is_file()
    assert details["remeasure_failed"].endswith("OSError: disk full")
