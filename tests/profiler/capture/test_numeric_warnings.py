"""A capture says when its steps ran on NaN or inf: the first step's loss (or output) and, after
training, the parameters. The profile then times non-finite arithmetic (and MoE routing over NaN
scores), not the model's real work. Checked through the CLI (stdout, summary.json) on real runs."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from profiler.capture.runner import nonfinite_output, nonfinite_parameters
from profiler.cli import main as cli

MODELS = textwrap.dedent("""
    import torch

    def nan_weight():
        m = torch.nn.Linear(4, 2)
        with torch.no_grad():
            m.weight[0, 0] = float("nan")
        return m, (torch.randn(3, 4),)

    class LogOfWeight(torch.nn.Module):
        '''Finite at first; one AdamW step (lr 1e-4) takes w from 5e-5 below 0, where sqrt and its
        grad are NaN, and the next step makes w NaN.'''
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((2,), 5e-5))
            self.v = torch.nn.Parameter(torch.ones(3))
        def forward(self, x):
            return torch.sqrt(self.w).sum() * x.sum() + self.v.sum()

    def diverges():
        return LogOfWeight(), (torch.ones(3),)

    def healthy():
        return torch.nn.Linear(4, 2), (torch.randn(3, 4),)
""")


def _capture(tmp_path, name: str, *flags: str, capsys) -> tuple[dict, str]:
    (tmp_path / "models.py").write_text(MODELS)
    out = tmp_path / f"out_{name}_{'_'.join(flags) or 'train'}"
    rc = cli(["capture", f"{tmp_path / 'models.py'}:{name}", "--steps", "2", "--wait", "0", "--ceilings", "none",
              "--quiet", "--out", str(out), *flags])
    assert rc == 0
    return json.loads((out / "summary.json").read_text()), capsys.readouterr().out


def test_nan_in_the_first_step_and_in_the_weights_is_said(tmp_path, capsys):
    summary, said = _capture(tmp_path, "nan_weight", capsys=capsys)
    first, params = summary["warnings"]
    assert first.startswith("the first step's loss was nan")
    # the bias's grad (1/N a row) does not read the NaN: only the weight holds one
    assert params.startswith("after the profiled steps 1 of 2 parameters hold NaN or inf (first: weight)")
    assert f"  warning: {first}" in said and f"  warning: {params}" in said
    assert summary["capture"]["warnings"] == summary["warnings"]  # kept with the Trace's meta too


def test_inference_output_is_checked(tmp_path, capsys):
    summary, said = _capture(tmp_path, "nan_weight", "--mode", "infer", capsys=capsys)
    assert summary["warnings"] == ["the first step's output (mean of its first floating-point tensor) was nan: "
                                   "the profiled steps ran non-finite arithmetic"]


def test_a_run_that_diverges_after_its_first_step_names_the_parameter(tmp_path, capsys):
    summary, _ = _capture(tmp_path, "diverges", capsys=capsys)
    assert len(summary["warnings"]) == 1
    assert summary["warnings"][0].startswith("after the profiled steps 1 of 2 parameters hold NaN or inf (first: w)")


def test_a_healthy_run_has_no_warnings(tmp_path, capsys):
    summary, said = _capture(tmp_path, "healthy", capsys=capsys)
    assert summary["warnings"] == [] and "warning:" not in said


def test_helpers_on_their_own():
    assert nonfinite_output(torch.tensor(1.0), "train") == []
    assert nonfinite_output((torch.tensor([1, 2]),), "infer") == []  # nothing floating: nothing to check
    assert "inf" in nonfinite_output({"logits": torch.tensor([float("inf")])}, "infer")[0]
    ddp_like = torch.nn.Linear(2, 2)
    assert nonfinite_parameters(ddp_like) == []


def test_fp16_warnings_suggest_bf16():
    said = nonfinite_output(torch.tensor(float("inf")), "train", "float16")[0]
    assert said.endswith("(fp16 overflows where fp32 would not: --dtype bfloat16 keeps fp32's range)")
    m = torch.nn.Linear(2, 2).half()
    with torch.no_grad():
        m.weight[0, 0] = float("inf")
    assert nonfinite_parameters(m, "float16")[0].endswith("--dtype bfloat16 keeps fp32's range)")
    assert "bfloat16" not in nonfinite_parameters(m, "bfloat16")[0]
