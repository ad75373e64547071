"""A model on our kernels with activation checkpointing, captured in the users' default mode.

The unprofiled first step measures the kernels' providers (FUSIONLENS_PROVIDER_CHOICE=measure, the
default; the rest of the suite runs "order"). Inside torch.utils.checkpoint those timing runs
were packed by the checkpoint's saved-tensor hooks, so the recomputation saved fewer tensors and
`python -m profiler capture` stopped with "the first (unprofiled) step raised CheckpointError".
"""
import json

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import kernels
from kernels import tuning, tuning_store
from kernels.norms import RMSNorm
from profiler.capture.backends import CapturePlan
from profiler.capture.runner import capture
from profiler.capture.spec import LoadedModel


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = RMSNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.up(self.norm(x)).chunk(2, -1)
        return x + self.down(kernels.swiglu(a, b))


class _Checkpointed(torch.nn.Module):
    def __init__(self, layers: int = 2, d: int = 64) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(layers))
        self.norm = RMSNorm(d)  # outside the checkpoints, same key as the blocks' norms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return self.norm(x)


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    reason = kernels.available_providers()["cpu"]  # load (or build) the extension in the usual data dir
    if reason:
        pytest.skip(f"cpu provider unavailable: {reason}")
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(tuning.ENV_MODE, "measure")
    tuning.forget_decisions()
    yield
    tuning.forget_decisions()


def test_checkpointed_model_on_our_kernels_captures_in_measure_mode(tmp_path, measuring) -> None:
    torch.manual_seed(0)
    model = LoadedModel("checkpointed", "module", _Checkpointed(), (torch.randn(4, 32, 64),))
    res = capture(model, CapturePlan(mode="train", wait=1, warmup=1, active=2), tmp_path / "out")
    # which provider each kernel got is the measurement's call (at these sizes the reference can win)
    assert res.trace.meta["capture"]["costs"]["flops"] > 0
    assert res.trace.meta["capture"]["join"]["match_rate"] == 1.0
    doc = json.loads(tuning_store.store_path().read_text())
    keys = [k for section in doc["machines"].values() for k in section["decisions"]]
    assert any(k.startswith("rms_norm|") and "|fwd+bwd|" in k for k in keys)  # measured inside checkpoint
    assert any(k.startswith("swiglu|") for k in keys)
