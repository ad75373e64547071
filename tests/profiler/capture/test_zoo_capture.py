"""Every zoo model captures on CPU in train and infer mode, with FLOPs and bytes joined."""
import gzip
import json

import pytest
import torch

from profiler.capture.backends import CapturePlan
from profiler.capture.flops import record_costs
from profiler.capture.runner import capture, loss_of
from profiler.capture.spec import load_spec
from profiler.capture.zoo import build_zoo, zoo_config, zoo_models
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


# Odd sizes on purpose (C = 32 splits into 2 heads; SwiGLU's hidden 8C/3 = 85 is odd).
ANALYTIC_SIZES = dict(layers=2, dim=32, heads=2, seq_len=12, vocab=80, batch=3)
ATTENTION_OPS = {"aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


def analytic_matmul_flops(name: str, mode: str) -> tuple[float, float]:
    """(projection + LM-head FLOPs, attention FLOPs) of one step, from the config alone.

    Every weight matrix costs 2 x tokens x its size forward, and twice that backward (the input's
    and the weight's gradient). Attention's two batched products (Q K^T, then P V) cost
    2 x B x T^2 x C each per layer over the full T x T (the causal mask is applied to the scores,
    not skipped); backward, the naive attention's autograd runs two products for each, while the
    fused CPU kernel's backward also recomputes the scores (5 products: torch's own count)."""
    cfg = zoo_config(name, "tiny", **ANALYTIC_SIZES)
    tokens, c = cfg.batch * cfg.seq_len, cfg.dim
    per_layer = 4 * c * c + (3 * c * (8 * c // 3) if name == "llama" else 8 * c * c)  # attention + MLP weights
    weights = cfg.layers * per_layer + c * cfg.vocab  # + the tied LM head
    linear = 2 * tokens * weights
    attention = cfg.layers * 2 * (2 * cfg.batch * cfg.seq_len ** 2 * c)
    if mode == "infer":
        return linear, attention
    return 3 * linear, attention * (1 + (2.5 if name == "gpt2" else 2))


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", ["gpt2-naive", "gpt2", "llama", "bert"])
def test_captured_matmul_flops_equal_the_analytic_count(name, mode, tmp_path):
    """Independent of any per-op formula: the matmul FLOPs the capture joined onto the Trace's
    ops add up to the count worked out from the model's sizes (6 x params x tokens in training)."""
    res = capture(name, CapturePlan(mode=mode, wait=0, warmup=0, active=1), tmp_path, size="tiny",
                  overrides=ANALYTIC_SIZES)
    ev = res.trace.events
    ops = ev[ev["kind"] == "cpu_op"]
    flops = ops.groupby(ops["name"].astype(str), observed=True)["flops"].sum()
    linear, attention = analytic_matmul_flops(name, mode)
    assert flops.reindex(["aten::mm", "aten::addmm"]).fillna(0).sum() == linear
    assert flops.reindex(sorted(ATTENTION_OPS)).fillna(0).sum() == attention


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


class LayerMix(torch.nn.Module):
    """Layers beyond the zoo's transformers and conv-BN-ReLU: a conv-transpose and grouped dilated
    conv, group norm, bilinear upsampling, pooling, an LSTM and a GRU, PReLU, an embedding bag,
    nn.Bilinear, in-place SiLU, and BCE, smooth-L1 and a scalar `where` in the loss."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.up = nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.norm = nn.GroupNorm(2, 8)
        self.act = nn.SiLU(inplace=True)
        self.lstm = nn.LSTM(16, 12, batch_first=True)
        self.gru = nn.GRU(12, 8, batch_first=True)
        self.prelu = nn.PReLU()
        self.bag = nn.EmbeddingBag(20, 8, mode="mean")
        self.bilinear = nn.Bilinear(8, 8, 4)

    def forward(self, img, seq, ids):
        y = self.act(self.norm(self.conv(self.up(img))))
        y = torch.nn.functional.interpolate(y, scale_factor=1.5, mode="bilinear", align_corners=False)
        y = torch.nn.functional.adaptive_max_pool2d(torch.nn.functional.pad(y, (1, 1, 1, 1), mode="reflect"), 1).flatten(1)
        s = self.prelu(self.gru(self.lstm(seq)[0])[0].mean(1))
        z = self.bilinear(y, s) + self.bag(ids)[:, :4]
        p = torch.sigmoid(z)
        return (torch.nn.functional.binary_cross_entropy(p, torch.full_like(p, 0.25))
                + torch.nn.functional.smooth_l1_loss(z, torch.where(z > 0, z.detach(), 0.0)))


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_a_layer_mix_has_every_op_counted_and_joined(mode, tmp_path):
    """Before the layer rules and the join's composite, nested-clone and new_zeros matches, such a
    model trained with 10 ops a step without FLOPs (the LSTM's among them) and 97.5% joined."""
    from profiler.capture.spec import LoadedModel

    torch.manual_seed(0)
    loaded = LoadedModel("layer-mix", "file", LayerMix(),
                         (torch.randn(2, 4, 6, 6), torch.randn(2, 5, 16), torch.randint(0, 20, (2, 6))))
    res = capture(loaded, CapturePlan(mode=mode, wait=0, warmup=1, active=1), tmp_path)
    meta = res.trace.meta["capture"]
    assert meta["costs"]["unknown_flop_ops"] == {}
    assert meta["join"]["match_rate"] == 1.0, meta["join"]
    ops = res.trace.events[res.trace.events["kind"] == "cpu_op"]
    assert ops.loc[ops["name"] == "aten::mkldnn_rnn_layer", "flops"].gt(0).all()
