"""Launch delay, launch CPU time, short kernels and the launch-bound verdict."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

from profiler.analysis import launch
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, raw_events, real_trace


def test_nested_op_and_cuda_graph_delays(tmp_path):
    t = SynthTrace()
    ext, corr = t.new_ext(), t.new_corr()
    t.cpu_op("aten::linear", 0, 20, ext=ext)
    t.cpu_op("aten::addmm", 2, 14, ext=ext)
    t.runtime("cudaLaunchKernel", 5, 3, corr=corr, ext=ext)
    t.kernel("gemm", 30, 8, corr=corr, ext=ext)
    g = t.new_corr()
    t.runtime("cudaGraphLaunch", 50, 10, corr=g)
    for ts in (70, 80, 90):
        t.kernel(f"graph_k{ts}", ts, 4, corr=g, stream=9)
    d = launch.launch_delays(load(t, tmp_path)).set_index("name")
    assert d.loc["gemm", "launch_delay_us"] == 25  # from the runtime call, not the op
    assert d.loc["gemm", "launch_name"] == "cudaLaunchKernel"
    assert list(d.loc[["graph_k70", "graph_k80", "graph_k90"], "launch_delay_us"]) == [20, 30, 40]
    assert set(d.loc[["graph_k70", "graph_k80", "graph_k90"], "launch_name"]) == {"cudaGraphLaunch"}
    # The first graph kernel found its stream empty; the next ones were queued behind it.
    assert list(d.loc[["graph_k70", "graph_k80", "graph_k90"], "empty_queue"]) == [True, False, False]
    s = launch.launch_stats(load(t, tmp_path / "b"))
    apis = s.launch_apis.set_index("launch_name")
    assert apis.loc["cudaGraphLaunch", "calls"] == 1 and apis.loc["cudaGraphLaunch", "total_us"] == 10
    assert s.launch_cpu_us == 13 and s.launch_calls == 2 and s.kernels == 4 and s.kernels_with_launch == 4


def test_outliers_and_short_kernels(tmp_path):
    t = SynthTrace()
    for i in range(40):
        delay = 500.0 if i == 17 else 10.0 + (i % 3)
        dur = 5.0 if i < 10 else (20.0 if i < 30 else 100.0)
        t.launch(None, f"k{i}", cpu_ts=i * 1000.0, rt_offset=0, kernel_ts=i * 1000.0 + delay, dur=dur)
    s = launch.launch_stats(load(t, tmp_path))
    assert s.outlier_count == 1 and s.outliers["name"].tolist() == ["k17"]
    assert s.outliers["launch_delay_us"].iloc[0] == 500
    assert s.delay_p50_us == pytest.approx(11.0)
    short = s.short_kernels.set_index("threshold_us")
    assert short.loc[10.0, "count"] == 10 and short.loc[10.0, "total_us"] == 50
    assert short.loc[50.0, "count"] == 30 and short.loc[50.0, "total_us"] == 450
    assert short.loc[50.0, "time_share"] == pytest.approx(450 / (450 + 10 * 100))


def test_launch_bound_verdict(tmp_path):
    tiny = SynthTrace()  # 3 µs kernels, one launch every 20 µs, each into an empty queue
    for i in range(200):
        tiny.launch(None, "tiny", cpu_ts=i * 20.0, rt_offset=0, rt_dur=4, kernel_ts=i * 20.0 + 6, dur=3)
    s = launch.launch_stats(load(tiny, tmp_path / "tiny"))
    assert s.launch_bound is True
    assert s.gpu_busy_share == pytest.approx(3 * 200 / (199 * 20 + 9 - 6), rel=1e-9)
    assert s.empty_queue_share == 1.0 and s.short_share_10us == 1.0
    assert all(r.startswith("yes") for r in s.reasons)
    # Each 17 µs gap: 11 µs before the next launch call (host wait), then 6 µs launch latency.
    assert s.host_wait_us == pytest.approx(199 * 11)

    big = SynthTrace()  # 500 µs kernels queued far ahead: the GPU never waits for the host
    for i in range(200):
        big.launch(None, "big", cpu_ts=i * 10.0, rt_offset=0, kernel_ts=5 + i * 500.0, dur=500)
    s = launch.launch_stats(load(big, tmp_path / "big"))
    assert s.launch_bound is False and s.gpu_busy_share == pytest.approx(1.0)
    assert s.reasons[0].startswith("no: GPU busy 100%")


@pytest.mark.parametrize("name", REAL_TRACES)
def test_delays_and_launch_cpu_match_raw_json(name):
    raw = raw_events(name)
    runtime = {}
    launch_cpu = 0.0
    for e in sorted((e for e in raw if e["cat"] in ("cuda_runtime", "Runtime", "cuda_driver")), key=lambda e: e["ts"]):
        corr = e.get("args", {}).get("correlation")
        if corr is not None:
            runtime.setdefault(corr, e["ts"])
        if e["name"].startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "hipLaunchKernel",
                                 "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipGraphLaunch",
                                 "hipExtLaunchKernel", "cudaLaunchCooperativeKernel")):
            launch_cpu += e["dur"]
    delays = [e["ts"] - runtime[e["args"]["correlation"]] for e in raw
              if e["cat"] in ("kernel", "Kernel") and e["args"].get("correlation") in runtime]
    s = launch.launch_stats(real_trace(name))
    assert s.kernels_with_launch == len(delays)
    assert s.delay_p50_us == pytest.approx(statistics.median(delays), abs=1e-3)
    assert s.delay_max_us == pytest.approx(max(delays), abs=1e-3)
    assert s.launch_cpu_us == pytest.approx(launch_cpu, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("name", REAL_TRACES)
def test_real_traces_give_a_consistent_verdict(name):
    s = launch.launch_stats(real_trace(name))
    assert isinstance(s.launch_bound, bool) and len(s.reasons) == 3
    assert s.outlier_count >= len(s.outliers)
    assert np.all(s.outliers["launch_delay_us"] > s.outlier_threshold_us)
    assert s.kernels_with_launch <= s.kernels


def test_known_real_verdicts():
    # Tiny bf16 BERT inference on an H100: the GPU is 8% busy on 60 kernels of mostly < 10 µs.
    assert launch.launch_stats(real_trace("tracelens_h100_bert_small.json.gz")).launch_bound is True
    # ResNet-style training on a V100 with the GPU ~98% busy: not launch-bound.
    assert launch.launch_stats(real_trace("hta_v100_ns_resolution_rank-0.pt.trace.json.gz")).launch_bound is False
