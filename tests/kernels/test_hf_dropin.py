"""The kernels as a user drops them into a Hugging Face Llama: RMSNorm modules, SwiGLU in the MLP,
RoPE on the attention's strided q/k, fused linear + cross-entropy for the loss, and the fused
AdamW. Training steps match transformers' own model with torch.optim.AdamW, step by step: the C++
provider on the CPU, Triton on a GPU (the GPU check runs the cuda case)."""
import copy
import types

import pytest
import torch

import kernels

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402



def _llama(seed: int = 0):
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, attn_implementation="eager")
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).float()


def _mlp_forward(provider):
    def forward(self, x):
        return self.down_proj(kernels.swiglu(self.gate_proj(x), self.up_proj(x), provider=provider))
    return forward


def _swap_in(model, provider):
    """Replace every LlamaRMSNorm by kernels.RMSNorm (same weight) and route each MLP through swiglu."""
    swapped = {"norm": 0, "mlp": 0}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, modeling_llama.LlamaRMSNorm):
                norm = kernels.RMSNorm(child.weight.shape[0], eps=child.variance_epsilon, provider=provider,
                                       device=child.weight.device, dtype=child.weight.dtype)
                norm.load_state_dict(child.state_dict())
                setattr(parent, name, norm)
                swapped["norm"] += 1
            elif isinstance(child, modeling_llama.LlamaMLP):
                child.forward = types.MethodType(_mlp_forward(provider), child)
                swapped["mlp"] += 1
    return swapped


def _fused_loss(model, ids, provider):
    hidden = model.model(input_ids=ids).last_hidden_state  # [B, T, H]
    return kernels.fused_linear_cross_entropy(hidden[:, :-1].reshape(-1, hidden.shape[-1]), model.lm_head.weight,
                                              ids[:, 1:].reshape(-1), chunk_size=7, provider=provider)


@pytest.mark.parametrize("device, provider", [("cpu", "cpu"), ("cuda", "triton")])
def test_llama_training_with_the_kernels_dropped_in_matches_transformers(device, provider, monkeypatch,
                                                                         cpu_provider):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ref = _llama().to(device)
    ours = copy.deepcopy(ref)
    assert _swap_in(ours, provider) == {"norm": 2 * 2 + 1, "mlp": 2}
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.01)
    our_opt = kernels.AdamW(ours.parameters(), lr=3e-3, weight_decay=0.01, provider=provider)
    hf_rope = modeling_llama.apply_rotary_pos_emb
    calls = []

    def rope(q, k, cos, sin, unsqueeze_dim=1):
        assert unsqueeze_dim == 1
        calls.append(q.is_contiguous())
        return kernels.rope(q, k, cos, sin, provider=provider)

    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        ids = torch.randint(0, 101, (3, 13), generator=generator).to(device)  # odd batch and length
        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", hf_rope)
        ref_loss = ref(input_ids=ids, labels=ids).loss
        ref_loss.backward()
        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", rope)
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
    for name, p in ref.named_parameters():
        torch.testing.assert_close(dict(ours.named_parameters())[name], p, rtol=1e-4, atol=2e-5, msg=name)


@pytest.mark.parametrize("device, provider", [("cpu", "cpu"), ("cuda", "triton")])
def test_bf16_llama_with_the_kernels_is_as_close_to_float64_as_transformers(device, provider, monkeypatch,
                                                                             cpu_provider):
    """In bf16, HF's RMSNorm (fp32 math, cast before the weight) and loss (fp32 logits) against ours,
    both judged by their distance to the same model in float64 (loss and every gradient)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    truth = _llama().double().to(device)
    hf = _llama().to(device, torch.bfloat16)
    ours = copy.deepcopy(hf)
    _swap_in(ours, provider)
    ids = torch.randint(0, 101, (2, 17), generator=torch.Generator().manual_seed(3)).to(device)
    truth_loss = truth(input_ids=ids, labels=ids).loss
    truth_loss.backward()
    hf_loss = hf(input_ids=ids, labels=ids).loss
    hf_loss.backward()
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb",
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
