"""hf:MODEL_TYPE beyond the written-out entries: any text LM transformers knows, built from its
default config shrunk to the preset (no download), steps forward and backward, and captures with
its ops joined; names transformers does not know, or knows without an LM head, fail in one line."""
from __future__ import annotations

import math

import pytest

from profiler.capture import hf
from profiler.capture.backends import CapturePlan
from profiler.capture.runner import capture, loss_of
from profiler.capture.spec import SpecError, load_spec

pytest.importorskip("transformers")

# one of each family the shrinking has to get right
FAMILIES = {
    "mistral": ("MistralForCausalLM", "decoder, grouped KV heads, sliding window"),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "mixture of experts with a shared expert"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "latent attention (LoRA ranks, split rope/nope head dims), MoE groups"),
    "t5": ("T5ForConditionalGeneration", "encoder-decoder: own layer/head/FFN names, decoder start token"),
    "roberta": ("RobertaForMaskedLM", "encoder with positions offset by the pad index"),
    "falcon": ("FalconForCausalLM", "its own FFN width field; head_dim a read-only property"),
    "mamba": ("MambaForCausalLM", "state-space model: no attention heads"),
}


def test_auto_types_pick_the_lm_head_and_leave_the_written_out_ones():
    types = hf.auto_model_types()
    assert types["mistral"] == "AutoModelForCausalLM"
    assert types["bart"] == "AutoModelForSeq2SeqLM"  # listed as masked too: seq2seq wins
    assert types["roberta"] == "AutoModelForMaskedLM"  # listed as causal too: masked wins
    assert not {"gpt2", "llama", "bert"} & set(types) and "vit" not in types


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_builds_small_and_trains(name):
    lm = load_spec(f"hf:{name}", size="tiny")
    preset = hf.HF_PRESETS["tiny"]
    assert type(lm.model).__name__ == FAMILIES[name][0]
    cfg = lm.model.config
    assert cfg.vocab_size == preset["vocab"] and cfg.num_hidden_layers == preset["layers"]
    assert cfg.hidden_size == preset["dim"]
    assert sum(p.numel() for p in lm.model.parameters()) < 100_000  # shrunk, FFN and experts included
    loss = loss_of(lm.call())
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in lm.model.parameters() if p.requires_grad]
    assert sum(g is not None for g in grads) >= 0.9 * len(grads)


# hybrids and per-layer configs: (class, what the shrunk config must keep)
HYBRIDS = {
    "jamba": ("JambaForCausalLM", lambda c: set(c.layers_block_type) == {"mamba", "attention"}),
    "recurrent_gemma": ("RecurrentGemmaForCausalLM", lambda c: set(c.block_types) == {"recurrent", "attention"}),
    "bamba": ("BambaForCausalLM", lambda c: c.use_cache is False),  # all Mamba-2: no cache to count tokens
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", lambda c: c.use_cache is False),
    "falcon_h1": ("FalconH1ForCausalLM", lambda c: c.mamba_d_ssm == c.mamba_n_heads * c.mamba_d_head),
    # fields its constructor derives from the width (attention width 2x, Mamba head dim): built again
    "zamba2": ("Zamba2ForCausalLM", lambda c: c.attention_hidden_size == 2 * c.hidden_size),
    "longcat_flash": ("LongcatFlashForCausalLM", lambda c: (c.n_routed_experts, c.zero_expert_num) == (4, 4)),
    "t5gemma": ("T5GemmaForConditionalGeneration",  # the decoder's cross-attention reads the encoder's width
                lambda c: c.decoder.cross_attention_hidden_size == c.encoder.hidden_size == 32),
    "gemma4_text": ("Gemma4ForCausalLM",  # per-layer head dims, which transformers refuses to set globally
                    lambda c: set(c.layer_types) == {"sliding_attention", "full_attention"}
                    and c.vocab_size_per_layer_input == c.vocab_size),
}


# models with shapes of their own (2026-12-02 04:00 UTC: each failed before its rule in shrink_config)
OWN_SHAPES = {
    "reformer": ("ReformerForMaskedLM",  # axial positions: shape product = sequence, dims sum = width
                 lambda c: math.prod(c.axial_pos_shape) == 16 and sum(c.axial_pos_embds_dim) == 32),
    "blt": ("BltForCausalLM",  # the global model reads cross_attn_k patch vectors a position
            lambda c: c.global_config.hidden_size == 32 * c.cross_attn_k == c.encoder_config.hidden_size_global),
    "perceiver": ("PerceiverForMaskedLM",  # its decoder queries max_position_embeddings positions
                  lambda c: c.max_position_embeddings == 16 and c.d_latents == 32),
    "xlstm": ("xLSTMForCausalLM", lambda c: c.use_cache is False),  # its cache ignores the q/k dims
    "esm": ("EsmForMaskedLM", lambda c: c.pad_token_id == 0),  # positions count from the pad token
    "gemma3n_text": ("Gemma3nForCausalLM",  # FFN width per layer; KV sharing needs layers to share from
                     lambda c: c.intermediate_size == [128, 128] and c.num_kv_shared_layers == 0),
    "xmod": ("XmodForMaskedLM", lambda c: c.default_language == "en_XX"),  # a language adapter per layer
    # grouped KV heads keep their grouping (64 over 4: 1 KV head); its sliding layers double them
    "mimo_v2_flash": ("MiMoV2FlashForCausalLM", lambda c: (c.num_attention_heads, c.num_key_value_heads) == (2, 1)),
    "mistral": ("MistralForCausalLM", lambda c: c.num_key_value_heads == 1),  # 32 over 8
    # a stack run H x (L + 1) times, a cache slot a layer and run: 1 layer x 2 x (3 + 1) slots
    "hrm_text": ("HrmTextForCausalLM", lambda c: (c.num_layers_per_stack, c.num_hidden_layers) == (1, 8)),
    # no LayerDrop: the profiled steps run the ops the FLOPs pass counted
    "m2m_100": ("M2M100ForConditionalGeneration", lambda c: c.encoder_layerdrop == c.decoder_layerdrop == 0),
}


@pytest.mark.parametrize("name, cls", [("musicgen", "MusicgenForCausalLM"),
                                       ("musicgen_melody", "MusicgenMelodyForCausalLM")])
def test_a_causal_lm_on_a_sub_config_builds_with_codebook_inputs(name, cls):
    """MusicGen's causal LM is its decoder alone, on the decoder sub-config, over 4 codebooks of
    audio tokens: ids (B * 4, T), labels (B, T, 4). Built from the whole config it failed (until
    2026-12-02 17:00 UTC). Unconditioned, only MusicGen's cross-attention to the text encoder gets
    no grad (MusicGen-Melody prepends its conditioning and has none)."""
    lm = load_spec(f"hf:{name}", size="tiny")
    cfg = lm.model.config
    assert type(lm.model).__name__ == cls and cfg.model_type.endswith("_decoder") and cfg.num_codebooks == 4
    assert lm.inputs["input_ids"].shape == (2 * 4, 16) and lm.inputs["labels"].shape == (2, 16, 4)
    loss = loss_of(lm.call())
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    no_grad = {n for n, p in lm.model.named_parameters() if p.grad is None}
    assert all(".encoder_attn" in n for n in no_grad), no_grad


def test_git_gets_an_image_at_its_shrunk_vision_size():
    """GIT's loss reads only the text positions after the image tokens: without pixels it compared
    0 logits to 30 labels (ValueError until 2026-12-02 19:40 UTC). It gets one 4 x 4-patch image a
    sequence, and every tower trains."""
    lm = load_spec("hf:git", size="tiny")
    v = lm.model.config.vision_config
    assert type(lm.model).__name__ == "GitForCausalLM" and v.image_size == 4 * v.patch_size
    assert lm.inputs["pixel_values"].shape == (2, v.num_channels, v.image_size, v.image_size)
    loss = loss_of(lm.call())
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    assert lm.model.git.image_encoder.vision_model.embeddings.patch_embedding.weight.grad.abs().sum() > 0


def test_voxtral_realtime_gets_audio_frames_for_every_text_position():
    """Voxtral Realtime adds the audio embedding of 8 mel frames to each text position: it refused
    to run without input_features (until 2026-12-02 19:40 UTC)."""
    lm = load_spec("hf:voxtral_realtime", size="tiny")
    cfg = lm.model.config
    assert lm.inputs["input_features"].shape == (2, cfg.audio_config.num_mel_bins, cfg.audio_length_per_tok * 16)
    loss = loss_of(lm.call())
    assert math.isfinite(loss.item())
    loss.backward()
    audio = [p.grad for n, p in lm.model.named_parameters() if "audio_tower" in n]
    assert audio and all(g is not None for g in audio)


@pytest.mark.parametrize("name", ["gemma4_assistant", "gemma4_unified_assistant"])
def test_drafting_assistants_are_refused_with_the_reason_and_not_listed(name):
    """Gemma 4's drafting assistants take a main model's embeddings and shared KV states: not a
    model to profile alone (one failed its own default config's validation, the other asked for
    shared_kv_states)."""
    assert name not in hf.auto_model_types()
    with pytest.raises(SpecError, match="drafting assistant runs on a main model's embeddings") as info:
        load_spec(f"hf:{name}", size="tiny")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", list(HYBRIDS) + list(OWN_SHAPES))
def test_hybrid_and_per_layer_configs_build_small_and_train(name):
    """Until 2026-12-02 these failed: Jamba and RecurrentGemma shrunk to Mamba/recurrent layers
    only (transformers' cache then cannot count tokens), Bamba's and GraniteMoeHybrid's Mamba-2
    heads stayed at full size, Gemma 4 refused a global head_dim and kept 262144 x 256 per-layer
    input embeddings per layer (134 M parameters at "tiny"); Zamba2 kept the attention width and
    Mamba head dims its constructor had derived from the full width, LongCat-Flash 256 zero experts."""
    lm = load_spec(f"hf:{name}", size="tiny")
    cls, keeps = {**HYBRIDS, **OWN_SHAPES}[name]
    assert type(lm.model).__name__ == cls
    cfg = lm.model.config
    assert keeps(cfg) and cfg.vocab_size == hf.HF_PRESETS["tiny"]["vocab"]
    assert sum(p.numel() for p in lm.model.parameters()) < 200_000
    loss = loss_of(lm.call())
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in lm.model.parameters() if p.requires_grad]
    assert sum(g is not None for g in grads) >= 0.8 * len(grads)


# default configs that leave a size the model needs None or empty (2026-12-02 13:10 UTC: each
# failed to build before its rule, or kept full-size heads): (class, what the shrunk config holds)
UNSET_DEFAULTS = {
    "dots1": ("Dots1ForCausalLM", lambda c: (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts) == (4, 2, 1)),
    "lfm2_moe": ("Lfm2MoeForCausalLM", lambda c: c.layer_types == ["full_attention", "conv"]),
    "cohere_compass_text": ("CohereCompassForCausalLM",
                            lambda c: c.rope_parameters["full_attention"]["rope_theta"] == 10000.0),
    "qwen4_exp_text": ("Qwen4ExpForCausalLM", lambda c: (c.indexer_budget, c.indexer_compress_ratio) == (8, 4)
                       and c.linear_num_key_heads == 2 and c.linear_value_head_dim == 16),
    # Gated DeltaNet heads: 16 key heads and 32 value heads of 128 -> 2 and 4 of 16
    "qwen3_next": ("Qwen3NextForCausalLM", lambda c: (c.linear_num_key_heads, c.linear_num_value_heads,
                                                      c.linear_key_head_dim) == (2, 4, 16)),
    # its attention read attn_config.rope_theta (moved to rope_parameters) and clamped by clip_qkv=None
    "dbrx": ("DbrxForCausalLM", lambda c: c.attn_config.clip_qkv == 8.0
             and c.attn_config.rope_theta == c.rope_parameters["rope_theta"]),
}


@pytest.mark.parametrize("name", list(UNSET_DEFAULTS))
def test_sizes_a_default_config_leaves_unset_get_the_presets(name):
    lm = load_spec(f"hf:{name}", size="tiny")
    cls, holds = UNSET_DEFAULTS[name]
    assert type(lm.model).__name__ == cls and holds(lm.model.config)
    assert sum(p.numel() for p in lm.model.parameters()) < 600_000  # Qwen4-Exp's hyper-connections: 558 k
    loss = loss_of(lm.call())
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()


@pytest.mark.parametrize("name, cls, layers", [("rwkv", "RwkvForCausalLM", 2), ("zamba", "ZambaForCausalLM", 4)])
def test_a_model_that_cannot_have_the_presets_layers_gets_more(name, cls, layers):
    """RWKV's weight init divides by layers - 1: at the tiny preset (1 layer) it gets 2. Zamba ties
    one shared attention block across its hybrid layers: it needs two of them, so 4 layers."""
    lm = load_spec(f"hf:{name}", size="tiny")
    assert type(lm.model).__name__ == cls and lm.model.config.num_hidden_layers == layers
    loss = loss_of(lm.call())
    assert math.isfinite(loss.item())
    loss.backward()


def test_convolutional_towers_shrink_too():
    """VibeVoice-ASR's audio tokenizers: 32 filters doubled over 6 stages, 3-8 blocks a stage made
    687 M parameters at "tiny"; one block a stage from a base that doubles up to about the width."""
    lm = load_spec("hf:vibevoice_asr", size="tiny")
    tok = lm.model.config.acoustic_tokenizer_encoder_config
    assert set(tok.depths) == {1} and tok.num_filters == 1
    assert sum(p.numel() for p in lm.model.parameters()) < 1_000_000
    loss = loss_of(lm.call())
    assert math.isfinite(loss.item())


def test_grouped_kv_heads_keep_the_full_models_grouping():
    from profiler.capture.hf_shrink import grouped_kv_heads

    assert grouped_kv_heads(64, 4, 2) == 1 and grouped_kv_heads(32, 8, 4) == 1 and grouped_kv_heads(8, 4, 4) == 2
    assert grouped_kv_heads(12, 4, 6) == 2 and grouped_kv_heads(40, 16, 6) == 2  # a divisor of the heads
    assert grouped_kv_heads(12, 12, 4) is None and grouped_kv_heads(None, 4, 4) is None  # not grouped


def test_settings_override_the_preset():
    lm = load_spec("hf:qwen2", size="tiny", overrides={"layers": 2, "dim": 64, "heads": 4, "seq_len": 8})
    cfg = lm.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 64, 4, 4)
    assert cfg.intermediate_size == 256
    assert tuple(lm.inputs["input_ids"].shape) == (hf.HF_PRESETS["tiny"]["batch"], 8)


@pytest.mark.parametrize("name, message", [
    ("vit", "transformers knows 'vit' but has no causal, masked or seq2seq LM head for it"),
    ("not_a_model", "unknown Hugging Face model 'not_a_model'"),
])
def test_names_without_an_lm_fail_in_one_line(name, message):
    with pytest.raises(SpecError, match=message) as info:
        load_spec(f"hf:{name}", size="tiny")
    assert "\n" not in str(info.value) and "mistral" in str(info.value)


def test_without_transformers_an_auto_name_says_it_needs_it(monkeypatch):
    monkeypatch.setattr(hf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecError, match="other model types need transformers: the optional package"):
        load_spec("hf:mistral", size="tiny")


@pytest.mark.parametrize("name", ["mistral", "t5"])
def test_auto_model_captures_with_its_ops_joined(name, tmp_path):
    res = capture(f"hf:{name}", CapturePlan(mode="train", wait=0, warmup=1, active=1), tmp_path, size="tiny")
    join = res.trace.meta["capture"]["join"]
    assert join["match_rate"] >= 0.99, join
    ops = res.trace.events[res.trace.events["kind"] == "cpu_op"]
    costed = ops[ops["flops"] > 0]
    # the model's ops name their module; AdamW's and the loss backward's are outside any module
    assert costed.loc[costed["module"].notna(), "flops"].sum() > 0.9 * costed["flops"].sum()
    names = costed["module"].dropna().astype(str)
    inside = names.str.startswith(res.trace.meta["capture"]["model_class"] + ".")
    assert inside.mean() > 0.9 and not names[~inside].str.contains(".", regex=False).any()  # outside: e.g. T5's CrossEntropyLoss
