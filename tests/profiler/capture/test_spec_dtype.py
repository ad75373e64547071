"""Specs that build in the capture's dtype themselves keep their own precision choices.

`hf:` specs in fp16/bf16 are built in that dtype: buffers as the model makes them (rotary tables in
fp32), parameters in the dtype but those transformers' `_keep_in_fp32_modules(_strict)` keep in
fp32 (a blanket `.to(bf16)` broke Inkling 2's fp32 router and rounded the rotary tables).
A file spec whose build() declares `dtype` gets it, and its model is moved, not recast. fp16
training steps keep the weights finite (AdamW's eps representable in fp16).
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from profiler.capture import hf
from profiler.capture.backends import CapturePlan
from profiler.capture.runner import adam_eps, capture, loss_of, make_step, prepare
from profiler.capture.spec import SpecError, load_spec


def _dtypes(named) -> dict[str, torch.dtype]:
    return {n: t.dtype for n, t in named}


def test_file_build_that_takes_dtype_gets_it_and_is_not_recast(tmp_path):
    path = tmp_path / "mixed.py"
    path.write_text(textwrap.dedent("""
        import torch
        def build(dtype, device, batch=2):
            assert isinstance(dtype, torch.dtype) and device == "cpu", (dtype, device)
            body = torch.nn.Linear(8, 8).to(dtype)
            router = torch.nn.Linear(8, 4)  # kept in fp32 on purpose
            class M(torch.nn.Module):
                def __init__(s):
                    super().__init__(); s.body, s.router = body, router
                def forward(s, x):
                    return s.body(x).float().sum() + s.router(x.float()).sum()
            return M(), (torch.randn(batch, 8, dtype=dtype),)
        def plain(batch=2):
            return torch.nn.Linear(8, 8), (torch.randn(batch, 8),)
    """))
    lm = prepare(load_spec(f"{path}:build", dtype="bfloat16", device="cpu"), CapturePlan(dtype="bfloat16"))
    assert lm.dtype == "bfloat16"
    assert _dtypes(lm.model.named_parameters()) == {"body.weight": torch.bfloat16, "body.bias": torch.bfloat16,
                                                    "router.weight": torch.float32, "router.bias": torch.float32}
    assert lm.inputs[0].dtype == torch.bfloat16
    loss_of(lm.call()).backward()
    # a build without a dtype parameter is cast by the runner, as before
    plain = prepare(load_spec(f"{path}:plain", dtype="bfloat16", device="cpu"), CapturePlan(dtype="bfloat16"))
    assert plain.dtype is None and {p.dtype for p in plain.model.parameters()} == {torch.bfloat16}
    assert plain.inputs[0].dtype == torch.bfloat16


def test_file_build_told_the_dtype_is_recast_for_another_plan(tmp_path):
    path = tmp_path / "told.py"
    path.write_text("import torch\ndef build(dtype):\n    return torch.nn.Linear(4, 4).to(dtype), (torch.randn(2, 4, dtype=dtype),)\n")
    lm = load_spec(f"{path}:build", dtype="float16")
    moved = prepare(lm, CapturePlan(dtype="float64"))  # a plan in another dtype: the runner casts
    assert {p.dtype for p in moved.model.parameters()} == {torch.float64} and moved.inputs[0].dtype == torch.float64


def test_settle_dtypes_casts_the_parameters_of_plain_modules():
    m = torch.nn.BatchNorm1d(3)
    m.weight.data = m.weight.data.double()
    assert hf.settle_dtypes(m, torch.float16) == []
    assert {p.dtype for p in m.parameters()} == {torch.float16}
    assert m.running_mean.dtype == torch.float32  # buffers stay as made


def test_default_dtype_is_restored_when_the_build_raises():
    with pytest.raises(RuntimeError):
        with hf.default_dtype(torch.bfloat16):
            assert torch.get_default_dtype() == torch.bfloat16
            raise RuntimeError("boom")
    assert torch.get_default_dtype() == torch.float32


class TestHF:
    @pytest.fixture(autouse=True)
    def _needs_transformers(self):
        pytest.importorskip("transformers")
        yield
        assert torch.get_default_dtype() == torch.float32  # never left changed

    def test_llama_bf16_keeps_its_rotary_tables_in_fp32(self):
        lm = prepare(load_spec("hf:llama", size="tiny", dtype="bfloat16"), CapturePlan(dtype="bfloat16"))
        assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
        assert lm.model.model.rotary_emb.inv_freq.dtype == torch.float32  # as from_pretrained leaves it
        assert loss_of(lm.call()).dtype in (torch.bfloat16, torch.float32)

    def test_t5_keeps_its_wo_in_fp32_in_fp16_only(self):
        """T5's `_keep_in_fp32_modules = ["wo"]` applies to fp16 loads, not bf16 ones."""
        half = load_spec("hf:t5", size="tiny", dtype="float16").model
        kept = {n for n, p in half.named_parameters() if p.dtype == torch.float32}
        assert kept and all(".wo." in n for n in kept)
        assert {p.dtype for n, p in half.named_parameters() if n not in kept} == {torch.float16}
        brain = load_spec("hf:t5", size="tiny", dtype="bfloat16").model
        assert {p.dtype for p in brain.parameters()} == {torch.bfloat16}

    @pytest.mark.parametrize("name", ["xlnet", "deberta", "reformer"])
    def test_parameters_declared_fp32_but_not_kept_follow_the_dtype(self, name):
        """These declare some parameters in fp32 (legacy code, not a precision choice): kept fp32
        they failed against bf16 activations, so they follow the requested dtype."""
        lm = prepare(load_spec(f"hf:{name}", size="tiny", dtype="bfloat16"), CapturePlan(dtype="bfloat16"))
        assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
        loss_of(lm.call()).backward()

    def test_float32_and_float64_builds_are_cast_as_before(self):
        lm = load_spec("hf:llama", size="tiny", dtype="float64")
        assert lm.dtype is None
        assert {p.dtype for p in prepare(lm, CapturePlan(dtype="float64")).model.parameters()} == {torch.float64}

    def test_inkling2_trains_and_captures_in_bf16_with_its_fp32_router(self, tmp_path):
        """Its router declares fp32 weights and casts the hidden states up: recast to bf16 it failed
        with "expected m1 and m2 to have the same dtype"."""
        if "inkling2_text" not in hf.auto_model_types():
            pytest.skip("this transformers has no inkling2_text")
        plan = CapturePlan(dtype="bfloat16", active=1, wait=0, warmup=1)
        result = capture("hf:inkling2_text", plan, tmp_path, size="tiny")
        names = set(result.trace.events["name"])
        assert "aten::mm" in names or "aten::addmm" in names

    def test_a_failing_bf16_build_restores_the_default_dtype(self):
        with pytest.raises(SpecError):
            load_spec("hf:llama", size="tiny", dtype="bfloat16", overrides={"heads": 3})


@pytest.mark.parametrize("spec", ["mlp", "gpt2"])
def test_fp16_training_steps_keep_the_weights_finite(spec):
    """AdamW's default eps (1e-8) is 0 in fp16: an element whose squared grad underflowed divided
    0 by 0, and every fp16 training capture ran its profiled steps on NaN weights."""
    plan = CapturePlan(dtype="float16")
    lm = prepare(load_spec(spec, size="tiny", dtype="float16"), plan)
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    step = make_step(lm, plan)
    for i in range(3):
        step(i)
    assert all(torch.isfinite(p).all() for p in lm.model.parameters())
    assert sum(not torch.equal(before[n], p) for n, p in lm.model.named_parameters()) >= len(before) // 2
    assert adam_eps([torch.zeros(1)]) == 1e-8 and adam_eps([torch.zeros(1), torch.zeros(1).half()]) == 1e-4
