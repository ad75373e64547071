"""Rules: each fires on a synthetic trace built to trigger it, with the saving it should estimate."""
from __future__ import annotations

import json

import pytest

from profiler.analysis import load_all
from profiler.analysis.findings import Finding, Results
from profiler.analysis.registry import RULES
from profiler.analysis.report_json import build_report
from profiler.analysis.rules import THRESHOLDS, run_rules
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, real_trace
from tests.profiler.analysis.test_distributed import straggler_ranks

STEP_US = 10_000.0
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::{}>(int, float*)"


def findings(trace, rule):
    load_all()
    return [f for f in run_rules(trace, Results(trace), names=[rule]) if f.rule == rule]


def one_step() -> SynthTrace:
    t = SynthTrace()
    t.step(1, 0, STEP_US)
    return t


def test_every_rule_of_the_issue_is_registered():
    load_all()
    expected = {"launch_bound", "low_gpu_utilization", "h2d_copy_in_step", "comm_not_overlapped",
                "fusion_candidate", "fp32_matmul_no_tensor_cores", "stragglers", "sync_in_step"}
    assert expected <= set(RULES)
    assert expected <= set(THRESHOLDS)


def test_finding_validates():
    with pytest.raises(ValueError):
        Finding("r", "urgent", "m", 1.0, 1.0)
    with pytest.raises(ValueError):
        Finding("r", "low", "m", -1.0, 1.0)
    assert Finding("r", "low", "m", 1.0, float("nan")).as_dict()["est_saving_pct"] is None


def test_launch_bound_and_low_utilization(tmp_path):
    t = one_step()
    for i in range(300):  # 300 kernels of 3 µs, one every 30 µs: the GPU waits for each launch
        t.launch("aten::add", EW.format("AddFunctor"), cpu_ts=30 * i, kernel_ts=30 * i + 8, dur=3, op_dur=12)
    trace = load(t, tmp_path)
    (lb,) = findings(trace, "launch_bound")
    assert "300 kernels" in lb.message.replace(",", "") and "launch-bound" in lb.message
    assert 0 < lb.est_saving_us <= STEP_US and lb.est_saving_pct == pytest.approx(100 * lb.est_saving_us / STEP_US)
    (lu,) = findings(trace, "low_gpu_utilization")
    assert lu.est_saving_us == pytest.approx(STEP_US - 900, rel=1e-6)  # idle = window - 300 x 3 µs


def test_h2d_copy_in_step_saving_is_exposed_copy_time(tmp_path):
    t = one_step()
    c = t.new_corr()
    t.runtime("cudaMemcpyAsync", 10, 5, corr=c)
    t.memcpy("HtoD", 100, 200, 50_000_000, corr=c, src="Pageable", dst="Device")
    t.launch("aten::mm", "sm80_xmma_gemm_bf16", cpu_ts=20, kernel_ts=250, dur=100)  # hides 50 µs of it
    (f,) = findings(load(t, tmp_path), "h2d_copy_in_step")
    assert f.est_saving_us == pytest.approx(150)
    assert f.est_saving_pct == pytest.approx(1.5)
    assert "50.0 MB" in f.message


def test_comm_not_overlapped(tmp_path):
    t = one_step()
    t.launch("aten::mm", "sm80_xmma_gemm_bf16", cpu_ts=0, kernel_ts=0, dur=400)
    t.launch("nccl:all_reduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", cpu_ts=10, kernel_ts=300, dur=500, stream=20)
    (f,) = findings(load(t, tmp_path), "comm_not_overlapped")
    assert f.est_saving_us == pytest.approx(400)  # [400, 800) exposed
    assert f.evidence["overlap_pct"] == pytest.approx(20)


def test_fusion_candidate_names_the_chain(tmp_path):
    t = one_step()
    ts = 0.0
    for i in range(10):
        for op, kern in (("aten::mul", EW.format("MulFunctor")), ("aten::add", EW.format("AddFunctor")),
                         ("aten::native_layer_norm", "void at::native::vectorized_layer_norm_kernel<float>")):
            t.launch(op, kern, cpu_ts=ts, kernel_ts=ts + 5, dur=10)
            ts += 20
        t.launch("aten::mm", "sm80_xmma_gemm_bf16", cpu_ts=ts, kernel_ts=ts + 5, dur=10)
        ts += 20
    (f,) = findings(load(t, tmp_path), "fusion_candidate")
    assert f.evidence["ops"] == ["aten::mul", "aten::add", "aten::native_layer_norm"]
    assert f.evidence["occurrences"] == 10 and f.evidence["chain_us"] == pytest.approx(300)
    assert f.est_saving_us == pytest.approx(200)  # 300 x (1 - 1/3)


def test_fp32_matmul_without_tensor_cores(tmp_path):
    t = one_step()
    ext, corr = t.new_ext(), t.new_corr()
    t.cpu_op("aten::mm", 0, 50, ext=ext, **{"Input type": ["float", "float"], "Input Dims": [[64, 64], [64, 64]]})
    t.runtime("cudaLaunchKernel", 5, 5, corr=corr, ext=ext)
    t.kernel("volta_sgemm_128x64_nn", 20, 500, corr=corr, ext=ext)
    trace = load(t, tmp_path / "fp32")
    (f,) = findings(trace, "fp32_matmul_no_tensor_cores")
    assert f.est_saving_us == pytest.approx(250)
    t.launch("aten::mm", "sm80_xmma_gemm_bf16bf16_bf16f32", cpu_ts=600, kernel_ts=700, dur=50)
    assert findings(load(t, tmp_path / "tc"), "fp32_matmul_no_tensor_cores") == []


def test_comm_wait_for_a_straggler_is_not_counted_twice(tmp_path):
    trace = load(straggler_ranks(4, slow=2), tmp_path)
    (f,) = findings(trace, "comm_not_overlapped")
    # 3 healthy ranks x 4 collectives x 300 µs + 4 x 100 µs on the slow rank are exposed; the
    # healthy ranks wait 200 µs in each of their 12 collectives for rank 2.
    assert f.evidence["exposed_comm_us"] == pytest.approx(3 * 4 * 300 + 4 * 100)
    assert f.evidence["straggler_wait_us"] == pytest.approx(3 * 4 * 200)
    assert f.est_saving_us == pytest.approx(4000 - 2400)


def test_straggler_rule(tmp_path):
    (f,) = findings(load(straggler_ranks(4, slow=2), tmp_path), "stragglers")
    assert f.evidence["rank"] == 2 and "Rank 2" in f.message
    assert f.est_saving_us == pytest.approx(200 * 4)  # 200 µs late (or slower) in each of 4 steps


def test_sync_in_step(tmp_path):
    t = one_step()
    t.runtime("cudaStreamSynchronize", 100, 50, corr=t.new_corr())
    t.runtime("cudaDeviceSynchronize", 300, 25, corr=t.new_corr())
    (f,) = findings(load(t, tmp_path), "sync_in_step")
    assert f.est_saving_us == pytest.approx(75) and f.evidence["calls"] == 2


@pytest.mark.parametrize("name", REAL_TRACES)
def test_every_analysis_and_rule_runs_on_every_real_trace(name):
    """The full report (every registered analysis + every rule) on each committed trace,
    AMD and 2021-format ones included: no errors, strict JSON, sane findings."""
    tr = real_trace(name)
    r = build_report(tr, max_rows=5)
    assert r["errors"] == {}
    json.dumps(r, allow_nan=False)
    for f in r["findings"]:
        assert f["rule"] in RULES and f["message"] and f["est_saving_us"] >= 0
        assert f["est_saving_pct"] is None or f["est_saving_pct"] >= 0
