"""Step-time and temporal breakdowns against µs-painted truths and raw-JSON recomputation."""
from __future__ import annotations

import numpy as np
import pytest

from profiler.analysis import breakdown as bd
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, raw_events, raw_gpu, real_trace

PRIORITY = ("kernel", "memcpy", "memset", "communication", "runtime", "cpu_only", "other")


def scenario() -> SynthTrace:
    """Two steps, three overlapping streams, a nested launching op, a collective, a copy, a set,
    and a kernel of step 1 that runs past the step's CPU end."""
    t = SynthTrace()
    t.step(1, 0, 100)
    t.step(2, 100, 60)
    t.launch("aten::a", "kA", cpu_ts=2, op_dur=10, rt_offset=1, rt_dur=5, kernel_ts=10, dur=30, stream=7)
    ext, corr = t.new_ext(), t.new_corr()  # aten::b -> aten::b_inner -> launch
    t.cpu_op("aten::b", 20, 10, ext=ext)
    t.cpu_op("aten::b_inner", 21, 8)
    t.runtime("cudaLaunchKernel", 22, 3, corr=corr, ext=ext)
    t.kernel("kB", 30, 30, corr=corr, ext=ext, stream=8)
    t.launch("nccl:all_reduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", cpu_ts=40, op_dur=5, rt_dur=3,
             kernel_ts=50, dur=30, stream=9, runtime_name="cudaLaunchKernelExC")
    c = t.new_corr()
    t.runtime("cudaMemcpyAsync", 82, 2, corr=c)
    t.memcpy("HtoD", 85, 5, 4096, corr=c)
    c = t.new_corr()
    t.runtime("cudaMemsetAsync", 90, 1, corr=c)
    t.memset(92, 2, 1024, corr=c)
    t.launch("aten::e", "kE", cpu_ts=94, op_dur=5, rt_dur=2, kernel_ts=98, dur=22, stream=8)
    t.annotation("## optimizer ##", 95, 4)
    t.launch("aten::d", "kD", cpu_ts=105, op_dur=5, rt_dur=2, kernel_ts=150, dur=30, stream=7)
    return t


def painted_truth(t: SynthTrace, windows) -> list[dict]:
    """Per window: µs per category by painting each integer µs with its top-priority category."""
    cover = {c: set() for c in PRIORITY}
    for e in t.events:
        if e.get("ph") != "X" or e["name"].startswith("ProfilerStep#"):
            continue
        cat = {"kernel": "communication" if "nccl" in e["name"].lower() else "kernel", "gpu_memcpy": "memcpy",
               "gpu_memset": "memset", "cuda_runtime": "runtime", "cpu_op": "cpu_only",
               "user_annotation": "other"}[e["cat"]]
        s = int(round(e["ts"] - t.base_us))
        cover[cat].update(range(s, s + int(e["dur"])))
    out = []
    for lo, hi in windows:
        row = dict.fromkeys(PRIORITY, 0)
        row["idle"] = 0
        for us in range(lo, hi):
            row[next((c for c in PRIORITY if us in cover[c]), "idle")] += 1
        out.append(row)
    return out


def test_step_breakdown_counts_each_us_once_in_priority_order(tmp_path):
    t = scenario()
    res = bd.step_breakdown(load(t, tmp_path))
    # TensorBoard's windows: step 1 ends when its late kernel kE ends (120); step 2 starts there
    # and ends when kD (launched in step 2) ends (180).
    assert list(res["step"]) == [1, 2]
    assert list(res["start_us"]) == [0, 120] and list(res["end_us"]) == [120, 180]
    for got, want in zip(res.to_dict("records"), painted_truth(t, [(0, 120), (120, 180)])):
        for cat, us in want.items():
            assert got[f"{cat}_us"] == pytest.approx(us), cat
        assert sum(got[f"{c}_us"] for c in PRIORITY + ("idle",)) == pytest.approx(got["duration_us"])


def test_temporal_breakdown_known_answer(tmp_path):
    res = bd.temporal(load(scenario(), tmp_path)).iloc[0]
    # GPU: kA[10,40) kB[30,60) nccl[50,80) memcpy[85,90) memset[92,94) kE[98,120) kD[150,180)
    assert res["span_us"] == pytest.approx(170)
    assert res["compute_us"] == pytest.approx(50 + 22 + 30)
    assert res["non_compute_us"] == pytest.approx(20 + 5 + 2)  # collective only where no compute
    assert res["idle_us"] == pytest.approx(170 - 129)
    assert res["compute_pct"] + res["non_compute_pct"] + res["idle_pct"] == pytest.approx(100)


def test_two_ranks_and_no_steps(tmp_path):
    r0, r1 = SynthTrace(rank=0, world_size=2), SynthTrace(rank=1, world_size=2)
    r0.launch("aten::x", "k", cpu_ts=0, kernel_ts=10, dur=10)
    r1.launch("aten::x", "k", cpu_ts=0, kernel_ts=10, dur=40)
    tr = load([r0, r1], tmp_path)
    res = bd.step_breakdown(tr)
    assert list(res["rank"]) == [0, 1] and list(res["step_name"]) == ["all", "all"]
    assert list(res["kernel_us"]) == [10, 40]
    tmp = bd.temporal(tr)
    assert list(tmp["compute_us"]) == [10, 40] and list(tmp["idle_us"]) == [0, 0]


def test_names_that_only_look_like_step_markers_are_not_steps(tmp_path):
    """`ProfilerStep#0.5`, `#1e3`, `#-3` and a 20-digit number are no markers, here as in the
    trace's `step` column (found by tests/profiler/trace/fuzz_ingest.py: the Int32 cast raised)."""
    t = SynthTrace()
    t.step(1, 0, 100)
    for i, name in enumerate(("ProfilerStep#0.5", "ProfilerStep#1e3", "ProfilerStep#-3", "ProfilerStep#" + "9" * 20)):
        t.annotation(name, 10 + 10 * i, 5)
    t.launch("aten::x", "k", cpu_ts=60, kernel_ts=70, dur=10)
    tr = load(t, tmp_path)
    assert tr.events["step"].dropna().unique().tolist() == [1]
    windows = bd.step_windows(tr)
    assert list(windows["step_name"]) == ["ProfilerStep#1"]
    res = bd.step_breakdown(tr)
    assert list(res["kernel_us"]) == [10]
    assert res["other_us"].iloc[0] == 20  # the four look-alikes count as plain annotations


def sweep_union(intervals) -> float:
    """Plain-Python union length of (start, end) pairs."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


@pytest.mark.parametrize("name", REAL_TRACES)
def test_real_traces_temporal_matches_raw_json(name):
    res = bd.temporal(real_trace(name))
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in raw_gpu(name) if e.get("dur", 0) > 0]
    comp = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in raw_gpu(name)
            if e["kind"] == "kernel" and e.get("dur", 0) > 0 and "nccl" not in e["name"].lower()]
    span = max(e for _, e in gpu) - min(s for s, _ in gpu)
    row = res.iloc[0]
    assert row["span_us"] == pytest.approx(span, rel=1e-7, abs=1e-3)  # raw ts parse as floats near 1e12 µs
    assert row["compute_us"] == pytest.approx(sweep_union(comp), rel=1e-7, abs=1e-3)  # raw ts parse as floats near 1e12 µs
    assert row["idle_us"] == pytest.approx(span - sweep_union(gpu), rel=1e-7, abs=1e-3)  # raw ts parse as floats near 1e12 µs


@pytest.mark.parametrize("name", REAL_TRACES)
def test_real_traces_step_breakdown_is_a_partition(name):
    tr = real_trace(name)
    res = bd.step_breakdown(tr)
    cats = [f"{c}_us" for c in PRIORITY] + ["idle_us"]
    assert len(res) >= 1
    assert np.all(res[cats].to_numpy() >= 0)
    np.testing.assert_allclose(res[cats].sum(axis=1), res["duration_us"], rtol=1e-9, atol=1e-3)
    # Windows are disjoint and ordered per rank.
    for _, w in res.groupby("rank"):
        assert np.all(w["start_us"].to_numpy()[1:] >= w["end_us"].to_numpy()[:-1] - 1e-9)


def test_step_windows_stay_disjoint_when_gpu_work_lags_two_steps(tmp_path):
    t = SynthTrace()
    for n, ts in ((1, 0), (2, 100), (3, 200)):
        t.step(n, ts, 100)
    t.launch("aten::slow", "slow", cpu_ts=10, kernel_ts=20, dur=250)  # step 1's kernel ends at 270
    t.launch("aten::quick", "quick", cpu_ts=110, kernel_ts=120, dur=10)
    t.launch("aten::last", "last", cpu_ts=210, kernel_ts=280, dur=10)
    w = bd.step_windows(load(t, tmp_path))
    assert list(zip(w["start_us"], w["end_us"])) == [(0, 270), (270, 270), (270, 300)]


def test_launched_only_matches_an_independent_raw_recomputation():
    """HTA drops GPU activity with no matching runtime call; `launched_only=True` does the same.
    (HTA 0.2 itself printed span 1229072, compute 179676, non-compute 201180 µs on this trace.)"""
    name = "hta_a100_80gb_rank0of16_queue_length.json.gz"
    raw = raw_gpu(name)
    corr = {e["args"]["correlation"] for e in raw_events(name)
            if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    launched = [e for e in raw if e["args"].get("correlation") in corr]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in launched]
    comp = [(e["ts"], e["ts"] + e["dur"]) for e in launched if e["kind"] == "kernel" and "nccl" not in e["name"].lower()]
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    row = bd.temporal(real_trace(name), launched_only=True).iloc[0]
    assert (row["span_us"], row["compute_us"]) == (span, sweep_union(comp)) == (1229072.0, 179676.0)
    assert row["non_compute_us"] == sweep_union(spans) - sweep_union(comp) == 201180.0
    assert len(launched) < len(raw)  # the trace really has GPU work enqueued before profiling
