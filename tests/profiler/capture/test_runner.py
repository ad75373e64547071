"""Runner pieces: backend registry, plan validation, NVML clock mapping, Parquet round trip,
heavier profiler modes, and the degradation paths on a machine without a GPU."""
import json
import math

import pandas as pd
import pytest
import torch

from profiler.capture import backends
from profiler.capture.artifacts import load_saved_trace, save_trace
from profiler.capture.backends import CaptureError, CapturePlan, register_backend
from profiler.capture.runner import capture, nvml_counters
from profiler.trace.model import Trace, TraceError, empty_frame
from profiler.trace.schema import COLUMNS, COUNTER_COLUMNS


def test_backend_registry_rejects_duplicates_and_unknown_names():
    backends.load_builtin_backends()
    with pytest.raises(ValueError, match="already registered"):
        register_backend("kineto")(lambda *a, **k: None)
    with pytest.raises(CaptureError, match="unknown capture backend 'nope'"):
        backends.get_backend("nope")
    assert backends.available_backends()["kineto"] is None


def test_plan_validates():
    assert CapturePlan(wait=2, warmup=1, active=4).steps == 7
    for bad in (dict(mode="fly"), dict(device="tpu"), dict(device="cuda:x"), dict(device="cpu:1"),
                dict(device="cuda:-1"), dict(device="cuda:"), dict(active=0), dict(wait=-1), dict(dtype="int8")):
        with pytest.raises(CaptureError):
            CapturePlan(**bad)


def test_a_gpu_index_past_the_machines_gpus_is_one_line(monkeypatch):
    from profiler.capture.runner import prepare
    from profiler.capture.spec import load_spec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(CaptureError, match=r"--device cuda:3 requested but this machine has 1 CUDA device \(cuda:0\)$"):
        prepare(load_spec("mlp", size="tiny"), CapturePlan(device="cuda:3"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(CaptureError, match=r"has 2 CUDA devices \(cuda:0 to cuda:1\)$"):
        prepare(load_spec("mlp", size="tiny"), CapturePlan(device="cuda:2"))


def test_cupti_backend_degrades_with_a_reason_here(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    reason = backends.unavailable_reason("cupti")
    assert reason and "\n" not in reason
    with pytest.raises(CaptureError):
        capture("mlp", CapturePlan(device="cuda", backend="cupti"), tmp_path / "out", size="tiny")
    assert not (tmp_path / "out").exists()


def test_nvml_samples_map_onto_the_trace_clock(tmp_path):
    base_ns = 1_790_000_000_000_000_000
    raw = tmp_path / "k.json"
    raw.write_text(json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": []}))
    trace = Trace(empty_frame(COLUMNS), {"t0_us": 5_000.0})
    epoch_us = base_ns / 1e3 + 5_000.0 + 250.0  # 250 µs after the trace's first event
    samples = pd.DataFrame({"rank": [0], "ts_us": [epoch_us], "device": [0], "name": ["sm_clock_mhz"],
                            "value": [1980.0]}).astype(COUNTER_COLUMNS)
    out = nvml_counters(samples, raw, trace)
    assert math.isclose(out["ts_us"].iloc[0], 250.0, abs_tol=1e-3)


def test_parquet_round_trip_and_damaged_folder(tmp_path):
    res = capture("cnn", CapturePlan(mode="infer", wait=0, warmup=0, active=1), tmp_path / "c", size="tiny")
    save_trace(res.trace, tmp_path / "saved")
    back = load_saved_trace(tmp_path / "saved")
    pd.testing.assert_frame_equal(back.events, res.trace.events)
    assert back.meta["capture"]["spec"] == "cnn"
    assert back.events["module"].notna().any()  # the cost pass named the ops' modules
    # a folder saved before the module column existed still loads, with it all NA
    old = tmp_path / "saved" / "events.parquet"
    pd.read_parquet(old).drop(columns="module").to_parquet(old)
    assert load_saved_trace(tmp_path / "saved").events["module"].isna().all()
    (tmp_path / "saved" / "events.parquet").write_bytes(b"not parquet")
    with pytest.raises(TraceError):
        load_saved_trace(tmp_path / "saved")


def test_memory_and_stack_modes(tmp_path):
    plan = CapturePlan(mode="train", wait=0, warmup=0, active=1, profile_memory=True, with_stack=True)
    res = capture("mlp", plan, tmp_path, size="tiny")
    assert len(res.trace.memory) > 0  # [memory] instant events were recorded
    assert (res.trace.events["kind"] == "python_function").any()  # stacks were recorded


def test_flops_pass_can_be_turned_off(tmp_path):
    res = capture("mlp", CapturePlan(mode="infer", wait=0, warmup=0, active=1, flops=False), tmp_path, size="tiny")
    assert res.trace.events["flops"].isna().all()
    assert "turned off" in res.sources_off["flops"]
    from profiler.capture.report import empty_roofline_reason

    # an empty roofline says why: the pass was off, or (pass on) no op was joined to it
    assert "the FLOPs pass was off" in empty_roofline_reason(res.trace, CapturePlan(flops=False))
    assert "none of the profiled ops was joined" in empty_roofline_reason(res.trace, CapturePlan(mode="infer"))


@pytest.mark.parametrize("forward, note", [
    ("return 3", "the profiled steps ran no tensor op (nothing to place on the roofline)"),
    ("return x.transpose(0, 1)", "the profiled ops did no FLOPs and moved no bytes (views only), or took no "
                                 "measurable time")])
def test_an_empty_roofline_says_why(tmp_path, forward, note):
    """A forward without a tensor op, or with views only: the note used to ask whether the FLOPs
    pass was off, though it was on."""
    spec = tmp_path / "model.py"
    spec.write_text(f"import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        {forward}\n"
                    "def build():\n    return M(), (torch.zeros(2, 3),)\n")
    from profiler.cli import main

    assert main(["capture", f"{spec}:build", "--mode", "infer", "--steps", "1", "--ceilings", "quick",
                 "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert (tmp_path / "out" / "roofline_missing.txt").read_text().strip() == note


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_a_step_waits_for_the_plans_gpu(monkeypatch, mode):
    """Each step ends with a synchronize of the plan's device: a bare synchronize() waits for the
    current device only, so under --device cuda:1 the steps (and their ProfilerStep spans) ended
    before cuda:1's kernels did. (The model runs on the CPU here; only the wait is checked.)"""
    from profiler.capture.runner import make_step
    from profiler.capture.spec import load_spec

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    make_step(load_spec("mlp", size="tiny"), CapturePlan(device="cuda:1", mode=mode))(0)
    assert waited == [torch.device("cuda:1")]


def test_an_inference_capture_joins_a_linear_on_a_seq_first_input(tmp_path):
    """A linear on a non-contiguous 3-D input (FSMT's seq-first projections): ATen folds it into
    one mm after a copy; the FLOPs pass, run under inference_mode inside its dispatch mode, saw it
    expanded to bmm instead, and 15% of FSMT's ops went unjoined. It now records under no_grad."""
    spec = tmp_path / "model.py"
    spec.write_text("import torch\n"
                    "class M(torch.nn.Module):\n"
                    "    def __init__(self):\n        super().__init__(); self.proj = torch.nn.Linear(16, 8)\n"
                    "    def forward(self, x):\n        return self.proj(x.transpose(0, 1))\n"
                    "def build():\n    return M(), (torch.randn(4, 5, 16),)\n")
    res = capture(f"{spec}:build", CapturePlan(mode="infer", wait=0, warmup=0, active=1), tmp_path / "out")
    join = res.trace.meta["capture"]["join"]
    assert join["match_rate"] == 1.0, join
    ops = res.trace.events[res.trace.events["kind"] == "cpu_op"]
    mm = ops[ops["name"] == "aten::mm"]
    assert mm["flops"].tolist() == [2 * 20 * 16 * 8]
