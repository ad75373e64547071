"""GPU utilization, est. SM efficiency, est. occupancy, tensor-core share (TensorBoard definitions)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import gpu_metrics as gm
from tests.profiler.analysis.synth import REAL_TRACES, TRACES_DIR, SynthTrace, load, raw_gpu, real_trace


class NoSmCount(SynthTrace):
    def to_json(self):
        doc = super().to_json()
        del doc["deviceProperties"][0]["numSms"]
        return doc


def metrics_scenario(cls=SynthTrace) -> SynthTrace:
    t = cls()
    t.step(1, 0, 1000)
    t.launch("aten::a", "kA", cpu_ts=10, kernel_ts=100, dur=100, grid=(54, 1, 1), occupancy_pct=50.0, stream=7)
    t.launch("aten::b", "kB", cpu_ts=20, kernel_ts=150, dur=200, grid=(216, 1, 1), occupancy_pct=25.0, stream=8)
    t.launch("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", cpu_ts=30,
             kernel_ts=500, dur=100, grid=(108, 1, 1), stream=7)
    t.launch("aten::late", "kD", cpu_ts=1050, kernel_ts=1100, dur=100, grid=(1, 1, 1), stream=7)  # after the step
    return t


def test_known_answer(tmp_path):
    m = gm.gpu_metrics(load(metrics_scenario(), tmp_path)).iloc[0]
    assert m["window_us"] == 1000 and m["kernel_us"] == 400  # kD lies outside all steps
    assert m["busy_us"] == 350 and m["gpu_utilization"] == pytest.approx(0.35)
    # min(54/108, 1)*100 + min(216/108, 1)*200 + min(108/108, 1)*100, over the step time
    assert m["sm_efficiency"] == pytest.approx((0.5 * 100 + 200 + 100) / 1000)
    assert m["achieved_occupancy_pct"] == pytest.approx((50 * 100 + 25 * 200) / 300)
    assert m["tensor_core_us"] == 100 and m["tensor_core_share"] == pytest.approx(0.25)
    assert m["num_sms"] == 108 and m["sm_efficiency_source"] == "grid/numSms"


def test_an_occupancy_outside_0_to_100_is_unknown(tmp_path):
    """One kernel's "est. achieved occupancy %" of 1e308 made the device's weighted mean inf (found
    by tests/profiler/trace/fuzz_ingest.py); -5 would have pulled it down. Both count as unknown."""
    t = metrics_scenario()
    t.launch("aten::c", "kC", cpu_ts=40, kernel_ts=700, dur=100, occupancy_pct=1e308, stream=9)
    t.launch("aten::d", "kE", cpu_ts=45, kernel_ts=800, dur=100, occupancy_pct=-5.0, stream=9)
    m = gm.gpu_metrics(load(t, tmp_path)).iloc[0]
    assert m["achieved_occupancy_pct"] == pytest.approx((50 * 100 + 25 * 200) / 300)


def test_falls_back_to_blocks_per_sm_without_sm_count(tmp_path):
    m = gm.gpu_metrics(load(metrics_scenario(NoSmCount), tmp_path)).iloc[0]
    assert m["sm_efficiency_source"] == "blocks per SM" and pd.isna(m["num_sms"])
    assert m["sm_efficiency"] == pytest.approx(0.35)  # synth writes Kineto's blocks per SM = blocks/108


def test_num_sms_from_meta():
    meta = {"per_rank": {0: {"device_properties": ({"id": 0, "numSms": 132}, {"id": 1, "numSms": 0})},
                         3: {"device_properties": ({"id": 2, "numSms": 80},)}}}
    assert gm.num_sms(meta) == {(0, 0): 132, (3, 2): 80}


@pytest.mark.parametrize("name", ["hta_a100_alexnet_benchmark_trace.json.gz", "param_rtx2080ti_linear_kineto.json.gz"])
def test_no_step_traces_match_raw_json(name):
    with gzip.open(TRACES_DIR / name, "rt") as f:
        sms = json.load(f)["deviceProperties"][0]["numSms"]
    ks = [e for e in raw_gpu(name) if e["kind"] == "kernel"]
    eff = sum(e["dur"] * min(np.prod(e["args"]["grid"]) / sms, 1.0) for e in ks)
    occ = [(e["args"]["est. achieved occupancy %"], e["dur"]) for e in ks if "est. achieved occupancy %" in e["args"]]
    m = gm.gpu_metrics(real_trace(name)).iloc[0]
    assert m["num_sms"] == sms
    assert m["kernel_us"] == pytest.approx(sum(e["dur"] for e in ks))
    assert m["sm_efficiency"] * m["window_us"] == pytest.approx(eff, rel=1e-9)
    assert m["achieved_occupancy_pct"] == pytest.approx(sum(o * d for o, d in occ) / sum(d for _, d in occ), rel=1e-9)


@pytest.mark.parametrize("name", REAL_TRACES)
def test_real_traces_in_range(name):
    res = gm.gpu_metrics(real_trace(name))
    assert len(res) >= 1
    for col in ("gpu_utilization", "tensor_core_share"):
        v = res[col].dropna()
        assert ((v >= 0) & (v <= 1 + 1e-9)).all(), col
    occ = res["achieved_occupancy_pct"].dropna()
    assert ((occ >= 0) & (occ <= 100)).all()
    assert (res["busy_us"] <= res["window_us"] + 1e-6).all()


class RocmDevice2(SynthTrace):
    """ROCm-style: kernels on device 2, properties listing only device 0 (as in the MI300X trace)."""

    def to_json(self):
        doc = super().to_json()
        doc["deviceProperties"][0].update(id=0, numSms=304, warpSize=64)
        return doc


def test_rocm_work_item_grids_and_unlisted_device(tmp_path):
    t = RocmDevice2(device=2, num_sms=304)
    t.step(1, 0, 1000)
    # hipBLASLt/Tensile: grid is a global work size, 76800 work-items / 256 = 300 workgroups.
    t.launch("aten::mm", "Cijk_Alik_Bljk_BBS_BH_MT256x192x64_MI16x16x1_SN", cpu_ts=0, kernel_ts=100, dur=100,
             runtime_name="hipExtModuleLaunchKernel", grid=(76800, 1, 1), block=(256, 1, 1))
    # Triton through hipModuleLaunchKernel: grid counts blocks, 152 of them.
    t.launch("triton", "triton_poi_fused_add_0", cpu_ts=10, kernel_ts=300, dur=100,
             runtime_name="hipModuleLaunchKernel", grid=(152, 1, 1), block=(512, 1, 1))
    m = gm.gpu_metrics(load(t, tmp_path)).iloc[0]
    assert m["device"] == 2 and m["num_sms"] == 304 and m["sm_efficiency_source"] == "grid/numSms"
    assert m["sm_efficiency"] == pytest.approx((100 * 300 / 304 + 100 * 152 / 304) / 1000)
    assert m["tensor_core_us"] == 100  # the MFMA Tensile kernel


def test_sm_count_fallback():
    assert gm.sm_count({(0, 0): 304}, 0, 2) == 304
    assert gm.sm_count({(0, 0): 108, (0, 1): 132}, 0, 2) == 0  # ambiguous: no guess
    assert gm.sm_count({(1, 0): 108}, 0, 0) == 0
