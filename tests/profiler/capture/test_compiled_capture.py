"""A torch.compile'd model: the profile shows the compiled program, and the partial join says why.

Dynamo skips a frame it meets under a TorchDispatchMode and keeps skipping that code, so a cost
pass run plainly before the profiled steps left a compiled model eager for them (the profile
then showed aten::layer_norm, not the compiled graph). The pass now runs under the
"force_eager" stance.
"""
import pytest
import torch

from profiler.capture.backends import CapturePlan
from profiler.capture.runner import COMPILED_REGION, capture
from profiler.capture.spec import LoadedModel


def _compiled_mlp(backend: str) -> LoadedModel:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32),
                                torch.nn.LayerNorm(32))
    return LoadedModel("compiled-mlp", "module", torch.compile(model, backend=backend),
                       (torch.randn(16, 32),))


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_model_is_profiled_compiled(tmp_path, backend: str) -> None:
    torch._dynamo.reset()
    res = capture(_compiled_mlp(backend), CapturePlan(mode="train", wait=0, warmup=1, active=2), tmp_path)
    ev = res.trace.events
    names = ev["name"].astype(str)
    regions = names.str.startswith(COMPILED_REGION).sum()
    assert regions == 2, "every profiled step ran the compiled graph"
    if backend == "inductor":  # Inductor replaced the eager forward ops
        assert not names.isin(["aten::layer_norm", "aten::gelu"]).any()
    join = res.trace.meta["capture"]["join"]
    costs = res.trace.meta["capture"]["costs"]
    assert costs["flops"] > 0 and join["recorded_ops"] > 0
    note = res.sources_off["flops"]
    assert note.startswith("partial: torch.compile'd code ran (1 compiled graph(s), 2 calls)"), note
    assert f"{join['matched_ops']:,} of {join['recorded_ops']:,} ops" in note
    # what the note's share says: the FLOPs on profiled events over the pass's FLOPs x steps
    share = ev["flops"].sum() / (costs["flops"] * join["steps"])
    assert f"{share:.0%} of its FLOPs" in note
    # modules are named from the user's model, as an uncompiled capture names them (not
    # OptimizedModule._orig_mod.*): the wrapper torch.compile adds is left out
    modules = set(ev["module"].dropna().astype(str))
    assert modules and all(m.startswith("Sequential.") for m in modules), modules


def test_eager_model_has_no_compiled_note(tmp_path) -> None:
    res = capture("mlp", CapturePlan(mode="train", wait=0, warmup=1, active=1), tmp_path, size="tiny")
    assert "flops" not in res.sources_off
    assert res.trace.meta["capture"]["join"]["match_rate"] == 1.0
