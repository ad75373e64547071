"""The kernels as a user drops them into Hugging Face Llama and Gemma models: RMSNorm modules
(Gemma's 1 + w offset and cast), SwiGLU / tanh-GeGLU in the MLP, RoPE on the attention's strided
q/k, fused linear + cross-entropy for the loss, and the fused AdamW. Training steps match
transformers' own model with torch.optim.AdamW, step by step: the C++ provider on the CPU, Triton
on a GPU (the GPU check runs the cuda cases)."""
import copy
import importlib
import types

import pytest
import torch

import kernels

transformers = pytest.importorskip("transformers")

# family -> (config class, model class, transformers module, RMSNorm offset, MLP activation)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "transformers.models.llama.modeling_llama", 0.0,
              lambda gate, up, provider: kernels.swiglu(gate, up, provider=provider)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "transformers.models.gemma.modeling_gemma", 1.0,
              lambda gate, up, provider: kernels.geglu(gate, up, approximate="tanh", provider=provider)),
}
CASES = [("cpu", "cpu"), ("cuda", "triton")]


def _family(name: str):
    config_cls, model_cls, module, offset, act = FAMILIES[name]
    return getattr(transformers, config_cls), getattr(transformers, model_cls), importlib.import_module(module), \
        offset, act


def _model(family: str, seed: int = 0):
    config_cls, model_cls, _, _, _ = _family(family)
    cfg = config_cls(vocab_size=101, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                     rms_norm_eps=1e-5, attn_implementation="eager")
    torch.manual_seed(seed)
    model = model_cls(cfg).float()
    for p in model.parameters():  # Gemma's norms start at 0 (= weight 1): make them count
        if p.dim() == 1:
            torch.nn.init.uniform_(p, -0.5, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    return model


def _swap_in(model, family: str, provider: str) -> dict:
    """Replace every RMSNorm of the family by kernels.RMSNorm (same weight, dtype, device) and route
    each MLP's activation through the fused GLU."""
    _, _, module, offset, act = _family(family)
    norm_cls = getattr(module, f"{family.capitalize()}RMSNorm")
    mlp_cls = getattr(module, f"{family.capitalize()}MLP")

    def mlp_forward(self, x):
        return self.down_proj(act(self.gate_proj(x), self.up_proj(x), provider))

    swapped = {"norm": 0, "mlp": 0}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, norm_cls):
                eps = getattr(child, "variance_epsilon", getattr(child, "eps", None))
                norm = kernels.RMSNorm(child.weight.shape[0], eps=eps, offset=offset, provider=provider,
                                       device=child.weight.device, dtype=child.weight.dtype)
                norm.load_state_dict(child.state_dict())
                setattr(parent, name, norm)
                swapped["norm"] += 1
            elif isinstance(child, mlp_cls):
                child.forward = types.MethodType(mlp_forward, child)
                swapped["mlp"] += 1
    return swapped


def _fused_loss(model, ids, provider):
    hidden = model.model(input_ids=ids).last_hidden_state  # [B, T, H]
    return kernels.fused_linear_cross_entropy(hidden[:, :-1].reshape(-1, hidden.shape[-1]), model.lm_head.weight,
                                              ids[:, 1:].reshape(-1), chunk_size=7, provider=provider)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("device, provider", CASES)
def test_training_with_the_kernels_dropped_in_matches_transformers(family, device, provider, monkeypatch,
                                                                   cpu_provider):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    modeling = _family(family)[2]
    ref = _model(family).to(device)
    ours = copy.deepcopy(ref)
    assert _swap_in(ours, family, provider) == {"norm": 2 * 2 + 1, "mlp": 2}
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.01)
    our_opt = kernels.AdamW(ours.parameters(), lr=3e-3, weight_decay=0.01, provider=provider)
    hf_rope = modeling.apply_rotary_pos_emb
    calls = []

    def rope(q, k, cos, sin, unsqueeze_dim=1):
        assert unsqueeze_dim == 1
        calls.append(q.is_contiguous())
        return kernels.rope(q, k, cos, sin, provider=provider)

    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        ids = torch.randint(0, 101, (3, 13), generator=generator).to(device)  # odd batch and length
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", hf_rope)
        ref_loss = ref(input_ids=ids, labels=ids).loss
        ref_loss.backward()
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", rope)
        our_loss = _fused_loss(ours, ids, provider)
        our_loss.backward()
        torch.testing.assert_close(our_loss, ref_loss, rtol=2e-5, atol=2e-6, msg=f"loss at step {step}")
        ref_grads = dict(ref.named_parameters())
        for name, p in ours.named_parameters():
            torch.testing.assert_close(p.grad, ref_grads[name].grad, rtol=1e-3, atol=2e-5,
                                       msg=lambda m, n=name, s=step: f"grad of {n} at step {s}: {m}")
        ref_opt.step()
        our_opt.step()
        ref_opt.zero_grad()
        our_opt.zero_grad()
    assert calls and not any(calls)  # HF hands RoPE transposed (strided) q; the kernel read it in place
    # Adam moves an element by about lr each step whatever its gradient's size, so gradients near
    # zero (vocabulary rows no target names) that differ in their last bits move apart by a
    # fraction of lr: the bound is 2% of one step
    for name, p in ref.named_parameters():
        torch.testing.assert_close(dict(ours.named_parameters())[name], p, rtol=1e-4, atol=0.02 * 3e-3, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("device, provider", CASES)
def test_bf16_with_the_kernels_is_as_close_to_float64_as_transformers(family, device, provider, monkeypatch,
                                                                      cpu_provider):
    """In bf16, HF's RMSNorm (fp32 math; Llama casts before the weight, Gemma after 1 + w) and loss
    (fp32 logits) against ours, both judged by their distance to the same model in float64 (loss
    and every gradient)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    modeling = _family(family)[2]
    truth = _model(family).double().to(device)
    hf = _model(family).to(device, torch.bfloat16)
    ours = copy.deepcopy(hf)
    _swap_in(ours, family, provider)
    ids = torch.randint(0, 101, (2, 17), generator=torch.Generator().manual_seed(3)).to(device)
    truth_loss = truth(input_ids=ids, labels=ids).loss
    truth_loss.backward()
    hf_loss = hf(input_ids=ids, labels=ids).loss
    hf_loss.backward()
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb",
                        lambda q, k, cos, sin, unsqueeze_dim=1: kernels.rope(q, k, cos, sin, provider=provider))
    our_loss = _fused_loss(ours, ids, provider)
    our_loss.backward()
    bf16_step = 2.0 ** -8  # the loss comes back in x's dtype, as F.cross_entropy's does
    assert abs(our_loss.double() - truth_loss) <= 2 * abs(hf_loss.double() - truth_loss) + bf16_step * truth_loss
    truths = dict(truth.named_parameters())
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    for name, p in ours.named_parameters():
        want = truths[name].grad
        ours_err = (p.grad.double() - want).norm()
        hf_err = (hf_grads[name].double() - want).norm()
        assert ours_err <= 2 * hf_err + 1e-3 * want.norm() + 1e-6, (name, float(ours_err), float(hf_err))
