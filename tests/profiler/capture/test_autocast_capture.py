"""`--autocast bfloat16|float16`: mixed-precision steps as AMP trains (fp32 weights, forward and loss
under torch.autocast, fp16 training with a GradScaler), captured and joined like any other."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from profiler.capture.backends import CaptureError, CapturePlan
from profiler.capture.runner import capture
from profiler.capture.spec import load_spec
from profiler.cli import main as cli


def _matmul_types(events: pd.DataFrame) -> set[str]:
    mm = events[events["name"].astype(str).isin(["aten::mm", "aten::addmm"])]
    return {json.loads(t)[0] for t in mm["input_types"].dropna()}


@pytest.mark.parametrize("amp, kernel_type", [("bfloat16", "c10::BFloat16"), ("float16", "c10::Half")])
def test_training_under_autocast_keeps_fp32_weights_and_joins(tmp_path, amp, kernel_type):
    loaded = load_spec("gpt2", size="tiny")
    plan = CapturePlan(autocast=amp, wait=0, warmup=1, active=2)
    result = capture(loaded, plan, tmp_path)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}  # master weights
    events = result.trace.events
    assert _matmul_types(events) == {kernel_type}  # the GEMMs ran in the autocast dtype
    names = set(events["name"].astype(str))
    scaler_ops = {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}
    assert scaler_ops <= names if amp == "float16" else not scaler_ops & names
    assert result.trace.meta["capture"]["join"]["match_rate"] == 1.0
    assert result.trace.meta["capture"]["costs"]["unknown_flop_ops"] == {}  # the scaler's ops have rules
    assert result.trace.meta["capture"]["plan"]["autocast"] == amp


def test_inference_under_autocast_and_the_cli_flag(tmp_path, capsys):
    out = tmp_path / "infer"
    assert cli(["capture", "mlp", "--size", "tiny", "--mode", "infer", "--autocast", "bf16", "--steps", "1",
                "--ceilings", "none", "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plan"]["autocast"] == "bfloat16" and summary["plan"]["dtype"] == "float32"
    assert _matmul_types(pd.read_parquet(out / "trace" / "events.parquet")) == {"c10::BFloat16"}


def test_autocast_needs_fp32_weights_and_a_known_dtype(capsys):
    with pytest.raises(CaptureError, match="runs over fp32 weights: use dtype float32, not bfloat16"):
        CapturePlan(dtype="bfloat16", autocast="float16")
    with pytest.raises(CaptureError, match="autocast must be one of"):
        CapturePlan(autocast="float64")
    assert cli(["capture", "mlp", "--autocast", "fp16", "--dtype", "bf16", "--quiet"]) == 2
    assert "use dtype float32" in capsys.readouterr().err
