"""Every zoo model captures on CPU in train and infer mode, with FLOPs and bytes joined."""
import gzip
import json

import pytest
import torch

from profiler.capture.backends import CapturePlan
from profiler.capture.flops import record_costs
from profiler.capture.runner import capture, loss_of
from profiler.capture.spec import load_spec
from profiler.capture.zoo import build_zoo, zoo_models
from profiler.capture.zoo.layers import NaiveAttention, NaiveGELU, NaiveLayerNorm, NaiveRMSNorm, RotaryEmbedding, SwiGLU

MODELS = sorted(zoo_models())


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_captures(name, mode, tmp_path):
    seen = []
    res = capture(name, CapturePlan(mode=mode, wait=0, warmup=1, active=1), tmp_path, size="tiny",
                  progress=lambda done, total, msg: seen.append((done, total)))
    ev = res.trace.events
    raw = json.loads(res.raw_path.read_text())  # the Kineto JSON on disk is plain, Perfetto-openable JSON
    raw_ops = [e for e in raw["traceEvents"] if e.get("cat") == "cpu_op"]
    assert len(raw_ops) == (ev["kind"] == "cpu_op").sum() > 0
    assert ev["name"].astype(str).str.startswith("ProfilerStep#").sum() == 1
    backward = ev["name"].astype(str).str.contains("autograd::engine::evaluate_function").any()
    optimizer = ev["name"].astype(str).str.startswith("Optimizer.step").any()
    assert backward == optimizer == (mode == "train")
    ops = ev[ev["kind"] == "cpu_op"]
    assert ops["flops"].sum() > 0 and ops["bytes_moved"].sum() > 0
    join = res.trace.meta["capture"]["join"]
    assert join["match_rate"] == 1.0, join
    # the joined FLOPs equal the recorded FLOPs of the matched ops: none invented, none doubled
    assert ops["flops"].sum() <= res.trace.meta["capture"]["costs"]["flops"] + 1e-6
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (2, 2)
    assert res.sources_off["nvml"].startswith("device is cpu")


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_hf_model_captures_with_every_op_joined(name, mode, tmp_path):
    pytest.importorskip("transformers")
    res = capture(f"hf:{name}", CapturePlan(mode=mode, wait=0, warmup=1, active=1), tmp_path, size="tiny")
    join = res.trace.meta["capture"]["join"]
    # The one known miss: GPT-2's torch.where(mask, x, scalar) is a composite the profiler shows
    # whole with its scalar_tensor nested inside, while the recorder sees that scalar_tensor.
    assert set(join["unmatched_names"]) <= {"aten::scalar_tensor"}, join
    assert join["match_rate"] >= 0.99, join
    ops = res.trace.events[res.trace.events["kind"] == "cpu_op"]
    # ops with a kernel of their own (LLaMA's SwiGLU backward) joined whole, with their FLOPs
    silu_bwd = ops[ops["name"] == "aten::silu_backward"]
    assert (len(silu_bwd) > 0) == (name == "llama" and mode == "train")
    assert (silu_bwd["flops"] > 0).all(), silu_bwd[["name", "flops"]]


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", MODELS)
def test_flops_agree_with_torch_flop_counter(name, mode):
    """An independent count: on every op torch.utils.flop_counter counts (matmuls, convolutions,
    their backwards), the cost pass has the same FLOPs; it adds the ops torch counts as 0."""
    lm = load_spec(name, size="tiny")
    lm.model.train(mode == "train")

    def step(_):
        if mode == "train":
            loss_of(lm.call()).backward()
        else:
            with torch.inference_mode():
                lm.call()

    counter = torch.utils.flop_counter.FlopCounterMode(display=False)
    with counter:
        step(0)
    theirs = {str(op).replace("aten.", "aten::"): n for op, n in counter.get_flop_counts()["Global"].items()}
    ours = record_costs(step, 1).groupby("name")["flops"].sum()
    assert theirs and sum(theirs.values()) > 0
    assert {op: ours.get(op) for op in theirs} == theirs


def test_naive_modules_are_plain_named_modules():
    model, _ = build_zoo("gpt2-naive", "tiny")
    kinds = {type(m) for m in model.modules()}
    assert {NaiveLayerNorm, NaiveGELU, NaiveAttention} <= kinds
    model, _ = build_zoo("llama", "tiny")
    kinds = {type(m) for m in model.modules()}
    assert {NaiveRMSNorm, SwiGLU, RotaryEmbedding, NaiveAttention} <= kinds


def test_naive_layers_match_native_ops():
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    ln = NaiveLayerNorm(16).double()
    torch.testing.assert_close(ln(x), torch.nn.functional.layer_norm(x, (16,), eps=1e-5))
    torch.testing.assert_close(NaiveGELU()(x), torch.nn.functional.gelu(x, approximate="tanh"))
    rms = NaiveRMSNorm(16).double()
    torch.testing.assert_close(rms(x), torch.nn.functional.rms_norm(x, (16,), eps=1e-6))
    att = NaiveAttention(16, 2, 5).double()
    q, k, v = att.split_heads(x)
    torch.testing.assert_close(att.attend(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_zoo_sizes_are_configurable():
    model, (idx, _) = build_zoo("gpt2", "tiny", layers=3, batch=5, seq_len=12)
    assert len(model.blocks) == 3 and idx.shape == (5, 12)
