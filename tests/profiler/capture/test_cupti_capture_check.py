"""benchmarks/gpu/capture_check.py without a GPU: the Kineto-vs-CUPTI verdicts, and the files it
leaves in $OUT (the lent machine returns at most 8 files, so run dirs and caches go to scratch)."""
from __future__ import annotations

import csv
import json

import pytest

from benchmarks.gpu import capture_check as cc


def _backend(name: str, count: int, time_us: float, linked: int, names: tuple[str, ...] = ("void gemm<float>(float*)",)) -> dict:
    return {"backend": name, "kernel_count": count, "kernel_time_us": time_us, "kernels_with_external_id": linked,
            "process_s": 12.5, "kernel_names": list(names)}


HW = {"nvml_hz": {"0": 49.6}, "nvml_unavailable": None, "table_entry": "H200-SXM-141GB", "table_reason": "by name",
      "per_dtype": {"bf16": {"measured_tflops": 700.0, "table_tflops": 989.5}},
      "measured_bw_gb_s": 4300.0, "table_bw_gb_s": 4800.0}


@pytest.mark.parametrize("cupti_us,cupti_count,ok_time,ok_count", [
    (1049.0, 100, True, True),    # 4.9 % apart: inside 5 %
    (1051.0, 100, False, True),   # 5.1 % apart
    (1000.0, 99, True, False),    # one kernel missing
])
def test_verdicts_follow_the_issue_thresholds(cupti_us, cupti_count, ok_time, ok_count):
    out = cc.checks(_backend("kineto", 100, 1000.0, 0), _backend("cupti", cupti_count, cupti_us, cupti_count), HW)
    assert out["kernel_time_within_5pct"]["ok"] is ok_time
    assert out["kernel_count_equal"]["ok"] is ok_count
    assert out["nvml_rate_50hz"]["ok"] and out["cupti_kernels_linked_to_ops"]["ok"]
    assert out["kernel_names_equal"]["ok"]


def test_kernel_names_must_match_across_backends():
    """A CUPTI name left mangled (or named differently) shows up as a failed check with the names."""
    out = cc.checks(_backend("kineto", 1, 10.0, 0), _backend("cupti", 1, 10.0, 1, ("_Z4gemmIfEvPT_",)), HW)
    assert not out["kernel_names_equal"]["ok"] and "_Z4gemmIfEvPT_" in out["kernel_names_equal"]["detail"]


def test_failed_worker_and_slow_nvml_fail_with_the_reason():
    out = cc.checks({"backend": "kineto", "error": "timed out after 40 s"}, _backend("cupti", 1, 1.0, 1),
                    {**HW, "nvml_hz": {"0": 31.0}})
    assert not out["backends_ran"]["ok"] and "timed out" in out["backends_ran"]["detail"]
    assert not out["nvml_rate_50hz"]["ok"]


def test_result_files_carry_date_and_gpu(tmp_path, monkeypatch):
    import benchmarks.harness as harness

    monkeypatch.setattr(harness, "gpu_name", lambda: "NVIDIA H200")
    kineto, cupti = _backend("kineto", 100, 1000.0, 0), _backend("cupti", 100, 1010.0, 97)
    now = "2026-11-30T19:00:00Z"
    cc.write_csv(tmp_path, kineto, cupti, HW, "gpt2", now)
    rows = list(csv.DictReader((tmp_path / "capture_check.csv").open()))
    assert {r["date"] for r in rows} == {now} and all(r["machine"].startswith("NVIDIA H200;") for r in rows)
    assert {(r["variant"], r["metric"]) for r in rows} >= {("kineto", "kernel_count"), ("cupti", "kernel_time"),
                                                           ("measured", "peak_flops"), ("measured", "mem_bw"),
                                                           ("nvml", "sample_rate")}
    result = {"spec": "gpt2", "mode": "train", "dtype": "bfloat16", "kineto": kineto,
              "cupti": {"backend": "cupti", "error": "exit 1: ['ImportError']"}, "hardware": HW,
              "checks": cc.checks(kineto, cupti, HW)}
    md = cc.markdown(result, "NVIDIA H200", now)
    assert md.startswith(f"### Capture check on NVIDIA H200, {now}")
    assert "| matmul bf16 | 700.0 TFLOP/s | 989.5 TFLOP/s |" in md and "4300 GB/s" in md
    assert "| cupti | failed: exit 1: ['ImportError'] |" in md and "| kernel_time_within_5pct | PASS |" in md
    json.dumps(result)  # what main() writes must serialise
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture_check.csv"]


def test_without_cuda_it_says_so_and_exits_2(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    assert cc.main(["--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")]) == 2
    assert "no CUDA device" in capsys.readouterr().out
    assert list((tmp_path / "out").iterdir()) == []


def test_kineto_worker_smoke_on_the_cpu(tmp_path):
    """The worker the GPU check runs, on this CPU (`--device cpu`): its summary JSON has every key
    the comparison reads, and the per-module fields the GPU run reports (empty here: no kernels,
    and a CPU trace has no datasheet roofs)."""
    result = tmp_path / "kineto.json"
    assert cc.worker("kineto", "mlp", "infer", "float32", tmp_path, result, device="cpu") == 0
    summary = json.loads(result.read_text())
    for key in ("kernel_count", "kernel_time_us", "kernels_with_external_id", "kernels_with_flops",
                "kernels_with_module", "cpu_ops", "kernel_names", "roofline"):
        assert key in summary, key
    assert summary["cpu_ops"] > 0 and summary["kernel_count"] == summary["kernels_with_module"] == 0
    assert summary["roofline"]["top_modules"] == [] and "no ceilings" in summary["roofline"]["reason"]
