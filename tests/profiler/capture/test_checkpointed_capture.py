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


class _Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class _TwoPairs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Pair() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return x.square().mean()


def test_recomputed_ops_are_named_for_the_module_that_recomputes_them(tmp_path) -> None:
    """Under activation checkpointing a block's forward is recomputed inside the backward of its
    last layer (`b`), while `b` is still active: sibling modules, the same depth. The recomputed
    addmm belongs to `a` (entered last), so each module's FLOPs per step are those counted by hand:
    a: forward and recomputed addmm (2*8*32*64 each), weight grad, input grad for the second block
    only (the first block's input needs none; there also the add summing that input's two grads,
    residual and a's), bias grad sum; b: addmm, input and weight grads,
    bias grad sum; the blocks themselves: relu twice (forward, recompute), its backward, the
    residual add."""
    torch.manual_seed(0)
    loaded = LoadedModel("two-pairs", "module", _TwoPairs(), (torch.randn(8, 32),))
    res = capture(loaded, CapturePlan(mode="train", wait=0, warmup=0, active=1), tmp_path)
    ev = res.trace.events
    per_module = ev[ev["kind"] == "cpu_op"].groupby(ev["module"].astype(object), dropna=True)["flops"].sum()
    mm = 2 * 8 * 32 * 64
    want = {"_TwoPairs.blocks.0.a": 3 * mm + 8 * 64, "_TwoPairs.blocks.1.a": 4 * mm + 8 * 64 + 8 * 32,
            "_TwoPairs.blocks.0.b": 3 * mm + 8 * 32, "_TwoPairs.blocks.1.b": 3 * mm + 8 * 32,
            "_TwoPairs.blocks.0": 3 * 8 * 64 + 8 * 32, "_TwoPairs.blocks.1": 3 * 8 * 64 + 8 * 32,
            "_TwoPairs": 2 * 8 * 32}
    assert per_module.to_dict() == want
    assert res.trace.meta["capture"]["join"]["match_rate"] == 1.0


def test_innermost_module_rules() -> None:
    """The tie rules on their own: nesting wins in forward; a parent entered in backward (sharing
    its child's output) is not inner; a forward re-entered after a sibling's backward began is;
    without an entry order, the deepest name."""
    from profiler.capture.flops import innermost_module

    fwd = {"M": (0, False), "M.blk": (1, False), "M.blk.a": (2, False)}
    assert innermost_module({"Global", "M", "M.blk", "M.blk.a"}, fwd) == "M.blk.a"
    shared = {"M.blk.b": (5, True), "M.blk": (6, True), "M": (7, True)}  # hooks on one tensor, child first
    assert innermost_module({"Global", "M", "M.blk", "M.blk.b"}, shared) == "M.blk.b"
    recompute = {"M": (7, True), "M.blk.b": (8, True), "M.blk": (9, False)}  # blk's forward inside b's backward
    assert innermost_module({"M", "M.blk", "M.blk.b"}, recompute) == "M.blk"
    recompute["M.blk.a"] = (10, False)
    assert innermost_module({"M", "M.blk", "M.blk.b", "M.blk.a"}, recompute) == "M.blk.a"
    assert innermost_module({"Global", "M", "M.blk.a"}) == "M.blk.a" and innermost_module({"Global"}) is None


def test_costs_without_a_module_tracker_still_count(monkeypatch) -> None:
    """On a torch without torch.utils.module_tracker the pass still counts FLOPs; rows name no module."""
    import sys

    from profiler.capture.flops import costs_of

    monkeypatch.setitem(sys.modules, "torch.utils.module_tracker", None)  # import raises ImportError
    lin = torch.nn.Linear(4, 3)
    rows = costs_of(lambda: lin(torch.randn(2, 4)))
    addmm = rows[rows["name"] == "aten::addmm"]
    assert addmm["flops"].tolist() == [2 * 2 * 4 * 3] and rows["module"].isna().all()


def test_a_module_run_on_a_tensor_autograd_cannot_hook_is_still_counted() -> None:
    """A view taken under no_grad of a tensor that requires grad is a leaf that requires grad but
    has no grad accumulator: torch's ModuleTracker raised on it, and the whole cost pass failed
    (Reformer's reversible layers run their blocks that way: `hf:reformer` could not be captured).
    The module is still entered and named; only its backward goes unnamed."""
    from profiler.capture.flops import costs_of

    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 8, requires_grad=True)

    def step() -> torch.Tensor:
        with torch.no_grad():
            return lin(x[:, :4])

    rows = costs_of(step)
    addmm = rows[rows["name"] == "aten::addmm"]
    assert addmm["flops"].tolist() == [2 * 2 * 4 * 3] and addmm["module"].tolist() == ["Linear"]


def test_a_module_given_a_parameter_view_in_inference_mode_is_still_counted() -> None:
    """In inference mode a view of a parameter requires grad and has no grad_fn, and its own view
    has none either: torch's ModuleTracker raised AttributeError on a module given one (DBRX's
    experts take slices of their stacked weights: `hf:dbrx --mode infer` could not be captured)."""
    from profiler.capture.flops import costs_of

    class Expert(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x @ w

    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.expert = torch.nn.Parameter(torch.randn(2, 4, 3)), Expert()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.expert(x, self.w.view(2, 4, 3)[1])

    model, x = Experts(), torch.randn(5, 4)

    def step() -> torch.Tensor:
        with torch.inference_mode():
            return model(x)

    rows = costs_of(step)
    mm = rows[rows["name"] == "aten::mm"]
    assert mm["flops"].tolist() == [2 * 5 * 4 * 3] and mm["module"].tolist() == ["Experts.expert"]
