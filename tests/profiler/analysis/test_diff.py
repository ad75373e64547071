"""Trace diff: a synthetic pair with known deltas, and two real traces against raw-JSON totals."""
from __future__ import annotations

import pytest

from profiler.analysis.diff import diff
from tests.profiler.analysis.synth import SynthTrace, load, real_trace
from tests.profiler.analysis.raw_json import raw_events

GPU_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")


def pair(tmp_path):
    a, b = SynthTrace(), SynthTrace()
    for i in range(2):
        a.launch("aten::mul", "k1", cpu_ts=100 * i, kernel_ts=100 * i + 20, dur=10)
    a.launch("aten::add", "k2", cpu_ts=300, kernel_ts=320, dur=5)
    for i in range(3):
        b.launch("aten::mul", "k1", cpu_ts=100 * i, kernel_ts=100 * i + 20, dur=10)
    b.launch("aten::gelu", "k3", cpu_ts=400, kernel_ts=420, dur=40)
    return load(a, tmp_path / "a"), load(b, tmp_path / "b")


def test_synthetic_deltas_new_and_vanished(tmp_path):
    d = diff(*pair(tmp_path))
    k = d.kernels
    assert k["name"].tolist() == ["k3", "k1", "k2"]  # sorted by |Δ time|: 40, 10, 5
    row = k.set_index("name")
    assert row.loc["k1", ["count_a", "count_b", "delta_count"]].tolist() == [2, 3, 1]
    assert row.loc["k1", "delta_us"] == pytest.approx(10) and row.loc["k1", "delta_pct"] == pytest.approx(50)
    assert row.loc["k3", "status"] == "new" and row.loc["k2", "status"] == "vanished"
    assert d.new == ["k3"] and d.vanished == ["k2"]
    assert row.loc["k3", "delta_pct"] != row.loc["k3", "delta_pct"]  # NaN: no baseline
    ops = d.ops.set_index("name")
    assert ops.loc["aten::gelu", "status"] == "new" and ops.loc["aten::add", "status"] == "vanished"
    assert ops.loc["aten::mul", "delta_us"] == pytest.approx(10)
    assert d.totals["delta_kernel_us"] == pytest.approx(70 - 25)


def raw_totals(name: str) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for e in raw_events(name):
        if e.get("cat") in GPU_CATS:
            n, t = out.get(e["name"], (0, 0.0))
            out[e["name"]] = (n + 1, t + float(e.get("dur", 0)))
    return out


def test_real_pair_matches_raw_json_totals():
    a_name, b_name = "hta_v100_ns_resolution_rank-0.pt.trace.json.gz", "hta_v100_rank1of2_trace_diff_test.json.gz"
    d = diff(real_trace(a_name), real_trace(b_name))
    ta, tb = raw_totals(a_name), raw_totals(b_name)
    k = d.kernels.set_index("name")
    assert set(k.index) == set(ta) | set(tb)
    for n in k.index:
        ca, ua = ta.get(n, (0, 0.0))
        cb, ub = tb.get(n, (0, 0.0))
        assert (k.loc[n, "count_a"], k.loc[n, "count_b"]) == (ca, cb)
        assert k.loc[n, "delta_us"] == pytest.approx(ub - ua, rel=1e-6, abs=1e-3)
        assert k.loc[n, "status"] == ("both" if ca and cb else "new" if cb else "vanished")
    deltas = d.kernels["delta_us"].abs().to_numpy()
    assert (deltas[:-1] >= deltas[1:]).all()
    # ops: calls per name from the raw cpu_ops
    calls_b: dict[str, int] = {}
    for e in raw_events(b_name):
        if e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#"):
            calls_b[e["name"]] = calls_b.get(e["name"], 0) + 1
    ops = d.ops.set_index("name")
    assert {n: int(c) for n, c in ops["count_b"].items() if c} == calls_b
