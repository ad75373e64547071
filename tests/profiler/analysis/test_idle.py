"""Idle time per stream: a known-answer stream (incl. a CUDA graph) and raw-JSON gaps."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from profiler.analysis import idle
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, raw_gpu, real_trace


def idle_scenario() -> SynthTrace:
    t = SynthTrace()
    for rt, ts, dur in [(0, 10, 10), (15, 25, 5), (100, 110, 10), (112, 200, 10)]:
        t.launch(None, f"k{ts}", cpu_ts=rt, rt_offset=0, rt_dur=2, kernel_ts=ts, dur=dur, stream=7)
    g = t.new_corr()  # one CUDA graph replay: three kernels share the cudaGraphLaunch correlation
    t.runtime("cudaGraphLaunch", 300, 4, corr=g)
    for ts, dur in [(305, 5), (312, 3), (350, 10)]:
        t.kernel(f"graph_k{ts}", ts, dur, corr=g, stream=7)
    t.memcpy("DtoD", 0, 50, 1 << 20, corr=t.new_corr(), stream=8)  # no runtime call recorded
    t.memcpy("DtoD", 60, 10, 1 << 20, corr=t.new_corr(), stream=8)
    return t


def test_idle_split_known_answer(tmp_path):
    tr = load(idle_scenario(), tmp_path)
    res = idle.idle_time(tr).set_index("stream")
    s7 = res.loc[7]
    # gaps: [20,25) launch 15 -> kernel wait 5; [30,110) launch 100 -> host 70 + kernel wait 10;
    # [120,200) launch 112 -> other 80; [210,305) graph launch 300 -> host 90 + kernel wait 5;
    # [310,312) -> kernel wait 2; [315,350) -> other 35 (graph kernels share the launch).
    assert (s7["span_us"], s7["idle_us"], s7["busy_us"]) == (350, 297, 53)
    assert (s7["host_wait_us"], s7["kernel_wait_us"], s7["other_us"]) == (160, 22, 115)
    assert s7["gaps"] == 6 and s7["idle_pct"] == pytest.approx(100 * 297 / 350)
    s8 = res.loc[8]
    assert (s8["span_us"], s8["idle_us"], s8["host_wait_us"], s8["kernel_wait_us"]) == (70, 10, 0, 10)
    loose = idle.idle_time(tr, kernel_wait_threshold_us=100).set_index("stream").loc[7]
    assert (loose["host_wait_us"], loose["kernel_wait_us"], loose["other_us"]) == (160, 137, 0)
    with pytest.raises(ValueError, match="kernel_wait_threshold_us"):
        idle.idle_time(tr, kernel_wait_threshold_us=-1)


def test_gap_rows_name_the_next_activity(tmp_path):
    gaps = idle.stream_gaps(load(idle_scenario(), tmp_path))
    g7 = gaps[gaps["stream"] == 7].sort_values("gap_start_us")
    assert list(g7["next_name"]) == ["k25", "k110", "k200", "graph_k305", "graph_k312", "graph_k350"]
    np.testing.assert_allclose(g7["host_wait_us"] + g7["kernel_wait_us"] + g7["other_us"], g7["gap_us"])


@pytest.mark.parametrize("name", REAL_TRACES)
def test_busiest_stream_gaps_match_raw_json(name):
    raw = raw_gpu(name)
    stream = Counter(e["args"].get("stream") for e in raw).most_common(1)[0][0]
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in raw if e["args"].get("stream") == stream)
    idle_us, n_gaps, reach = 0.0, 0, spans[0][1]
    for s, e in spans[1:]:  # plain-Python sweep
        if s > reach:
            idle_us += s - reach
            n_gaps += 1
        reach = max(reach, e)
    res = idle.idle_time(real_trace(name))
    row = res[res["stream"] == stream]
    assert len(row) == 1
    assert row["idle_us"].iloc[0] == pytest.approx(idle_us, rel=1e-7, abs=1e-3)
    assert row["span_us"].iloc[0] == pytest.approx(reach - spans[0][0], rel=1e-9, abs=1e-3)


@pytest.mark.parametrize("name", REAL_TRACES)
def test_real_traces_split_is_a_partition(name):
    res = idle.idle_time(real_trace(name))
    assert len(res) >= 1
    parts = res[["host_wait_us", "kernel_wait_us", "other_us"]].to_numpy()
    assert np.all(parts >= 0)
    np.testing.assert_allclose(parts.sum(axis=1), res["idle_us"], rtol=1e-9, atol=1e-6)
    assert np.all(res["busy_us"] >= -1e-6) and np.all(res["idle_us"] <= res["span_us"] + 1e-6)
