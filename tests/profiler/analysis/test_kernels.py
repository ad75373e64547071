"""Kernel breakdowns: per-name totals recomputed from raw JSON, type overlaps on known inputs."""
from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np
import pytest

from profiler.analysis import kernels as kb
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, raw_gpu, real_trace


@pytest.mark.parametrize("name", REAL_TRACES)
def test_per_name_totals_match_raw_json(name):
    trace = real_trace(name)
    shown = {mangled: readable for readable, mangled in trace.meta["demangled_names"].items()}  # ROCm names
    per = defaultdict(list)
    for e in raw_gpu(name):
        per[shown.get(e["name"], e["name"])].append(float(e.get("dur", 0)))
    res = kb.kernel_breakdown(trace).set_index("name")
    assert set(res.index) == set(per)
    grand = sum(sum(v) for v in per.values())
    for kname, durs in per.items():
        row = res.loc[kname]
        assert row["count"] == len(durs)
        assert row["total_us"] == pytest.approx(sum(durs), rel=1e-9, abs=1e-6)
        assert row["min_us"] == pytest.approx(min(durs)) and row["max_us"] == pytest.approx(max(durs))
        assert row["std_us"] == pytest.approx(statistics.pstdev(durs), rel=1e-6, abs=1e-6)
        assert row["share"] == pytest.approx(sum(durs) / grand, rel=1e-9)
    assert res["total_us"].is_monotonic_decreasing


def test_type_breakdown_and_overlaps_known_answer(tmp_path):
    t = SynthTrace()
    t.launch("aten::mm", "kcomp", cpu_ts=0, kernel_ts=0, dur=100, stream=7)
    t.launch("c10d::allreduce", "void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 4>",
             cpu_ts=1, kernel_ts=50, dur=100, stream=8)
    c = t.new_corr()
    t.memcpy("DtoD", 120, 10, 1 << 20, corr=c, stream=9, src="Device", dst="Device")
    t.launch("aten::add", "kcomp", cpu_ts=2, kernel_ts=200, dur=10, stream=7)
    res = kb.kernel_type_breakdown(load(t, tmp_path))
    assert res.total_us == {"computation": 110.0, "communication": 100.0, "memory": 10.0}
    assert res.overlap_us == {"computation&communication": 50.0, "computation&memory": 0.0,
                              "communication&memory": 10.0}
    tab = res.table.set_index("kernel_type")
    assert tab.loc["computation", "count"] == 2 and tab.loc["computation", "busy_us"] == 110.0
    assert tab["share"].sum() == pytest.approx(1.0)
    per_name = kb.kernel_breakdown(load(t, tmp_path / "b")).set_index("name")
    assert per_name.loc["kcomp", "count"] == 2 and per_name.loc["kcomp", "mean_us"] == 55.0
    assert per_name.loc["kcomp", "std_us"] == pytest.approx(45.0)
    assert per_name.loc["Memcpy DtoD (Device -> Device)", "kernel_type"] == "memory"


def test_launch_config_grouping_and_by_rank(tmp_path):
    r0, r1 = SynthTrace(rank=0, world_size=2), SynthTrace(rank=1, world_size=2)
    r0.launch(None, "k", cpu_ts=0, kernel_ts=0, dur=10, grid=(4, 1, 1), block=(256, 1, 1))
    r0.launch(None, "k", cpu_ts=1, kernel_ts=20, dur=30, grid=(8, 2, 1), block=(128, 1, 1))
    r1.launch(None, "k", cpu_ts=0, kernel_ts=0, dur=5, grid=(4, 1, 1), block=(256, 1, 1))
    r1.launch(None, "j", cpu_ts=0, kernel_ts=10, dur=15, grid=(1, 1, 1), block=(32, 1, 1))
    tr = load([r0, r1], tmp_path)
    cfg = kb.kernel_launch_config_breakdown(tr)
    k4 = cfg[(cfg["name"] == "k") & (cfg["grid_x"] == 4)].iloc[0]
    assert k4["count"] == 2 and k4["total_us"] == 15 and k4["blocks"] == 4 and k4["threads_per_block"] == 256
    assert cfg[(cfg["name"] == "k") & (cfg["grid_x"] == 8)].iloc[0]["blocks"] == 16
    by_rank = kb.kernel_breakdown(tr, by_rank=True)
    assert list(by_rank["rank"]) == [0, 1, 1]
    np.testing.assert_allclose(by_rank.groupby("rank")["share"].sum(), [1.0, 1.0])
    r1_rows = by_rank[by_rank["rank"] == 1].set_index("name")
    assert r1_rows.loc["j", "share"] == pytest.approx(15 / 20)


@pytest.mark.parametrize("name", REAL_TRACES)
def test_type_breakdown_totals_match_raw_json(name):
    raw = raw_gpu(name)
    comm = sum(float(e["dur"]) for e in raw if e["kind"] == "kernel" and "nccl" in e["name"].lower())
    mem = sum(float(e["dur"]) for e in raw if e["kind"] != "kernel")
    comp = sum(float(e["dur"]) for e in raw if e["kind"] == "kernel") - comm
    tot = kb.kernel_type_breakdown(real_trace(name)).total_us
    assert tot["communication"] == pytest.approx(comm, abs=1e-6)
    assert tot["memory"] == pytest.approx(mem, rel=1e-9, abs=1e-6)
    assert tot["computation"] == pytest.approx(comp, rel=1e-9, abs=1e-6)
