"""Shrinking any `transformers` config to a preset's size: the rules behind `hf:MODEL_TYPE`.

A default config (`AutoConfig.for_model`) describes a full-size model. `shrink_config` applies
`SHRINK_RULES` in order, each a small function for one thing configs share (sizes under their
per-family names, FFN widths, head dims, experts, positions, token ids) or one family's own
constraint (Reformer's axial positions, BLT's global width, Perceiver's latents, ...). A rule
touches only fields the config has, so every rule runs on every config; sub-configs of multimodal
and composite models are shrunk by the same rules. `benchmarks/hf_sweep.py` measures the outcome
over every text LM type (docs/capture.md has the last sweep).
"""
from __future__ import annotations

from typing import Any, Callable

# Config fields set to a preset value where the config has them: preset key -> field spellings.
SIZE_FIELDS = {
    "layers": ("num_hidden_layers", "num_layers", "num_decoder_layers", "encoder_layers", "decoder_layers"),
    "dim": ("hidden_size", "d_model", "cross_attention_hidden_size"),  # the last: T5Gemma's encoder width
    "heads": ("num_attention_heads", "num_key_value_heads", "encoder_attention_heads", "decoder_attention_heads",
              "num_heads"),
    # Gemma 3n/4's per-layer inputs, BLT's hashed byte n-grams, LUKE's entities, RoCBert's glyphs and sounds
    "vocab": ("vocab_size", "decoder_vocab_size", "vocab_size_per_layer_input", "encoder_hash_byte_group_vocab",
              "entity_vocab_size", "pronunciation_vocab_size", "shape_vocab_size"),
}
# at the width: Gemma 3n/4's per-layer input embeddings, RecurrentGemma's recurrent (LRU) state,
# embedding widths (SqueezeBERT's must equal the hidden size, MobileBERT's bottleneck must not
# exceed it, xLSTM's is its width; LUKE's entity and RoCBert's glyph and sound embeddings)
WIDTH_FIELDS = ("hidden_size_per_layer_input", "lru_width", "embedding_size", "intra_bottleneck_size",
                "embedding_dim", "entity_emb_size", "pronunciation_embed_dim", "shape_embed_dim")
FFN_FIELDS = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "hidden_dim",
              "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size", "d_inner",
              "expert_ffn_hidden_size")
# MoE: 4 experts (LongCat's identity "zero experts" too), top-2, one group
EXPERT_COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERT_FIELDS = (*EXPERT_COUNT_FIELDS, "zero_expert_num")
TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")
RECURRENT_KINDS = ("linear_attention", "mamba", "recurrent", "mamba2", "ssm")

Rule = Callable[[Any, dict], None]
SHRINK_RULES: list[Rule] = []


def shrink_rule(fn: Rule) -> Rule:
    """Decorator: append `fn(cfg, preset)` to the rules, which run in the order they are defined."""
    SHRINK_RULES.append(fn)
    return fn


def shrink_config(cfg: Any, s: dict) -> Any:
    """`cfg` at the preset's size `s` (layers, dim, heads, vocab, seq_len), shrunk in place by every
    rule and returned. Works on any object with those attributes (a per-layer override too)."""
    for rule in SHRINK_RULES:
        rule(cfg, s)
    return cfg


def get(cfg: Any, field: str) -> Any:
    """cfg.field, or None where it is missing or refuses to be read (transformers raises its own
    errors for a per-layer attribute read globally, and properties may compute from other fields)."""
    try:
        return getattr(cfg, field, None)
    except Exception:  # noqa: BLE001
        return None


def has(cfg: Any, field: str) -> bool:
    """The config has `field` (a per-layer attribute counts, though it cannot be read globally)."""
    try:
        return hasattr(cfg, field)
    except Exception:  # noqa: BLE001
        return True


def put(cfg: Any, field: str, value: Any) -> None:
    """cfg.field = value where the config has that field and lets it be set (some are properties,
    some per-layer attributes that transformers refuses to set globally: left as they are)."""
    if has(cfg, field):
        try:
            setattr(cfg, field, value)
        except Exception:  # noqa: BLE001  (AttributeError, TypeError, transformers' per-layer errors)
            pass


@shrink_rule
def _sizes(cfg: Any, s: dict) -> None:
    """Layers, width, heads and vocabulary, under every family's spelling; grouped KV heads keep
    the full model's grouping (64 query heads over 4 KV heads -> 1 KV head at 2 or 4 heads), so the
    shrunk model runs the same KV repeat (and MiMo's sliding layers, which double the KV heads,
    still have at most as many as query heads)."""
    kv_heads = grouped_kv_heads(get(cfg, "num_attention_heads"), get(cfg, "num_key_value_heads"), s["heads"])
    for key, fields in SIZE_FIELDS.items():
        for field in fields:
            put(cfg, field, s[key])
    if kv_heads:
        put(cfg, "num_key_value_heads", kv_heads)


def grouped_kv_heads(heads: Any, kv_heads: Any, preset_heads: int) -> int | None:
    """KV heads for `preset_heads` query heads at the ratio of the full model's `heads` over its
    `kv_heads` (the largest divisor of preset_heads at or under it, at least 1); None where the full
    model is not grouped (or the counts are not plain ints)."""
    if not (isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads < heads):
        return None
    target = max(preset_heads * kv_heads // heads, 1)
    return max(d for d in range(1, target + 1) if preset_heads % d == 0)


def unset(cfg: Any, field: str) -> bool:
    """The config has `field` and it reads as None (a default config that leaves a size the model
    needs to the checkpoint); False where reading it raises (a per-layer attribute)."""
    try:
        return has(cfg, field) and getattr(cfg, field) is None
    except Exception:  # noqa: BLE001
        return False


@shrink_rule
def _lfm2_layer_kinds(cfg: Any, s: dict) -> None:
    """LFM2-MoE's default config leaves layer_types None, which its layers index: its two kinds,
    attention and short convolution, alternate from an attention layer (with a convolution first,
    the model's cache raises StopIteration measuring its length at two layers); at least one of each
    (the next rule grows the layer count to match)."""
    if unset(cfg, "layer_types") and has(cfg, "conv_L_cache"):
        put(cfg, "layer_types", ["full_attention" if i % 2 == 0 else "conv" for i in range(max(s["layers"], 2))])


@shrink_rule
def _every_layer_kind(cfg: Any, s: dict) -> None:
    """Hybrids (linear + full attention, sliding + global; RecurrentGemma's repeating block_types):
    every layer type at least once, in the order the full model first uses them; the layer count
    grows to that when the preset's is less."""
    for kinds_field in ("layer_types", "block_types"):
        types = get(cfg, kinds_field)
        if isinstance(types, (list, tuple)) and types and all(isinstance(t, str) for t in types):
            kinds = list(dict.fromkeys(types))
            layers = max(s["layers"], len(kinds))
            put(cfg, kinds_field, [kinds[i % len(kinds)] for i in range(layers)])
            for field in SIZE_FIELDS["layers"]:
                put(cfg, field, layers)


@shrink_rule
def _kv_sharing(cfg: Any, s: dict) -> None:
    """Gemma 3n: the last layers reuse the KV cache of the last earlier layer of their type; kept
    (one sharing layer a type) where every type still has a layer before them, else none."""
    if get(cfg, "num_kv_shared_layers"):
        kinds = len(set(get(cfg, "layer_types") or ["any"]))
        layers = get(cfg, "num_hidden_layers") or s["layers"]
        put(cfg, "num_kv_shared_layers", kinds if layers >= 2 * kinds else 0)


@shrink_rule
def _attention_period(cfg: Any, s: dict) -> None:
    """Jamba: one attention layer every `period` from `offset`, so the shrunk model keeps one:
    layer 0 Mamba, layer 1 attention (and MoE every second layer from 1, as the full model)."""
    if get(cfg, "attn_layer_period") and has(cfg, "attn_layer_offset"):
        for field in SIZE_FIELDS["layers"]:
            put(cfg, field, max(s["layers"], 2))
        put(cfg, "attn_layer_period", 2)
        put(cfg, "attn_layer_offset", 1)


@shrink_rule
def _recurrent_stacks(cfg: Any, s: dict) -> None:
    """HRM: a stack of `num_layers_per_stack` layers runs H_cycles x (L_cycles + 1) times, one cache
    slot a layer and run, so num_hidden_layers is that product (16 x 2 x 4 = 128 by default): the
    preset's layers make the stack, the cycles stay."""
    h, low = get(cfg, "H_cycles"), get(cfg, "L_cycles")
    if isinstance(get(cfg, "num_layers_per_stack"), int) and isinstance(h, int) and isinstance(low, int):
        put(cfg, "num_layers_per_stack", s["layers"])
        put(cfg, "num_hidden_layers", s["layers"] * h * (low + 1))


@shrink_rule
def _hybrid_mamba2_heads(cfg: Any, s: dict) -> None:
    """Bamba, GraniteMoeHybrid: Mamba-2 heads x head dim = expand x width (Falcon-H1 names that
    product `mamba_d_ssm` too)."""
    if get(cfg, "mamba_n_heads") and get(cfg, "mamba_expand"):
        put(cfg, "mamba_n_heads", s["heads"])
        put(cfg, "mamba_d_head", cfg.mamba_expand * s["dim"] // s["heads"])
        if get(cfg, "mamba_d_ssm"):
            put(cfg, "mamba_d_ssm", cfg.mamba_n_heads * cfg.mamba_d_head)


@shrink_rule
def _no_cache_without_attention(cfg: Any, s: dict) -> None:
    """transformers' cache needs one attention layer to count tokens: none where all are recurrent."""
    if not has_attention_layer(cfg):
        put(cfg, "use_cache", False)


@shrink_rule
def _widths(cfg: Any, s: dict) -> None:
    """Embedding and recurrent-state widths at the width; FFNs 4x the width (per layer where the
    config lists them per layer, as Gemma 3n)."""
    for field in WIDTH_FIELDS:
        put(cfg, field, s["dim"])
    for field in FFN_FIELDS:
        per_layer = isinstance(get(cfg, field), (list, tuple))
        put(cfg, field, [4 * s["dim"]] * (get(cfg, "num_hidden_layers") or s["layers"]) if per_layer else 4 * s["dim"])


@shrink_rule
def _head_dims(cfg: Any, s: dict) -> None:
    """Head dim = width / heads (dots3's indexer too); multi-head latent attention (DeepSeek) splits
    it into rope and nope halves, with LoRA ranks at half the width. A latent-attention config whose
    RoPE rotates only part of the head (dots3) gets the head dim that keeps the rotated dims equal
    to its rope head dim."""
    head_dim = s["dim"] // s["heads"]
    for field in ("head_dim", "d_kv", "v_head_dim", "d_head", "index_head_dim"):
        put(cfg, field, head_dim)
    put(cfg, "index_n_heads", s["heads"])
    if has(cfg, "qk_rope_head_dim"):
        for field in ("qk_rope_head_dim", "qk_nope_head_dim", "head_dim"):
            put(cfg, field, head_dim // 2)
        factor = partial_rotary_factor(cfg)
        if factor < 1.0:
            put(cfg, "head_dim", int(round(head_dim // 2 / factor)))
    for field in ("q_lora_rank", "kv_lora_rank"):
        if get(cfg, field):
            put(cfg, field, s["dim"] // 2)


@shrink_rule
def _experts(cfg: Any, s: dict) -> None:
    """Mixture of experts: 4 experts, top-2, one group."""
    moe = False
    for field in EXPERT_FIELDS:
        if get(cfg, field):
            put(cfg, field, 4)
            moe = True
    if not moe and get(cfg, "moe_intermediate_size"):  # dots.llm1: an expert width, counts left None
        for field in EXPERT_COUNT_FIELDS:
            if unset(cfg, field):
                put(cfg, field, 4)
                moe = True
        if moe and unset(cfg, "n_shared_experts"):
            put(cfg, "n_shared_experts", 1)
    if get(cfg, "num_experts_per_tok") or (moe and has(cfg, "num_experts_per_tok")):
        put(cfg, "num_experts_per_tok", min(cfg.num_experts_per_tok or 2, 2))  # DeepSeek-V2's default is None
    for field in ("n_group", "topk_group", "n_groups"):
        put(cfg, field, 1)


@shrink_rule
def _rope_per_layer_type(cfg: Any, s: dict) -> None:
    """Cohere Compass's default config has layer types but empty rope_parameters, which its rotary
    embedding reads per layer type: the default RoPE (theta 10000) for each type."""
    types = get(cfg, "layer_types")
    if get(cfg, "rope_parameters") == {} and isinstance(types, list) and types:
        put(cfg, "rope_parameters", {t: {"rope_type": "default", "rope_theta": 10000.0} for t in dict.fromkeys(types)})


@shrink_rule
def _linear_attention_heads(cfg: Any, s: dict) -> None:
    """Gated DeltaNet layers (Qwen3-Next, Qwen3.5, Qwen4-Exp, OLMo-Hybrid, Lara) size their own
    heads: the preset's heads as key heads, value heads at the full model's ratio to them (32 over
    16 -> 2 a key head), head dims of the width over the heads (they kept 16-32 heads of 128)."""
    key_heads, value_heads = get(cfg, "linear_num_key_heads"), get(cfg, "linear_num_value_heads")
    if not (isinstance(key_heads, int) and isinstance(value_heads, int) and key_heads > 0):
        return
    put(cfg, "linear_num_key_heads", s["heads"])
    put(cfg, "linear_num_value_heads", s["heads"] * max(value_heads // key_heads, 1))
    for field in ("linear_key_head_dim", "linear_value_head_dim"):
        if get(cfg, field):
            put(cfg, field, s["dim"] // s["heads"])


@shrink_rule
def _sparse_attention_indexer(cfg: Any, s: dict) -> None:
    """Qwen4-Exp's default config leaves the sizes of its sparse-attention indexer None (the model
    divides them): 2 heads over 1 KV head at the model's head dim, a budget of 8 tokens in blocks
    of 4 (a fraction of the preset's sequence, so the indexer still selects)."""
    sizes = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": s["dim"] // s["heads"],
             "indexer_budget": 8, "indexer_compress_ratio": 4}
    for field, value in sizes.items():
        if unset(cfg, field):
            put(cfg, field, value)


@shrink_rule
def _dbrx_attention(cfg: Any, s: dict) -> None:
    """DBRX's default attention config breaks its own model: the attention reads
    `attn_config.rope_theta`, which transformers 5 moved to the top config's `rope_parameters`
    (copied down), and clamps q/k/v with `clip_qkv`, None by default, which torch.clamp refuses
    (8, the released DBRX's value)."""
    attn, params = get(cfg, "attn_config"), get(cfg, "rope_parameters")
    if attn is None or not has(attn, "clip_qkv"):
        return
    if not has(attn, "rope_theta") and isinstance(params, dict) and "rope_theta" in params:
        attn.rope_theta = params["rope_theta"]
    if attn.clip_qkv is None:
        attn.clip_qkv = 8.0


@shrink_rule
def _git_image(cfg: Any, s: dict) -> None:
    """GIT's vision tower: a 4 x 4-patch image (17 image tokens with the class token, not 197 at
    224 px), so the image does not outweigh the preset's sequence."""
    if get(cfg, "model_type") == "git_vision_model" and isinstance(get(cfg, "patch_size"), int):
        put(cfg, "image_size", 4 * cfg.patch_size)


@shrink_rule
def _mamba2_heads(cfg: Any, s: dict) -> None:
    """Mamba-2: heads x head_dim = expand x width."""
    if isinstance(get(cfg, "expand"), int) and has(cfg, "num_heads") and has(cfg, "head_dim"):
        put(cfg, "head_dim", cfg.expand * s["dim"] // s["heads"])


@shrink_rule
def _positions(cfg: Any, s: dict) -> None:
    """Positions for the sequence + 2 (encoders that offset positions by the pad index); GPT-J's and
    CodeGen's rotated dims at most the head dim."""
    for field in ("max_position_embeddings", "n_positions"):
        put(cfg, field, s["seq_len"] + 2)
    if get(cfg, "rotary_dim"):
        put(cfg, "rotary_dim", s["dim"] // s["heads"])


@shrink_rule
def _perceiver_latents(cfg: Any, s: dict) -> None:
    """Perceiver: the inputs cross-attend into a latent array that self-attends; its masked-LM
    decoder queries one position per max_position_embeddings, so that is the sequence itself."""
    if has(cfg, "d_latents") and has(cfg, "num_latents"):
        put(cfg, "d_latents", s["dim"])
        put(cfg, "num_latents", s["seq_len"])
        put(cfg, "num_self_attends_per_block", s["layers"])
        for field in ("num_self_attention_heads", "num_cross_attention_heads"):
            put(cfg, field, s["heads"])
        put(cfg, "max_position_embeddings", s["seq_len"])


@shrink_rule
def _reformer_axial_positions(cfg: Any, s: dict) -> None:
    """Reformer's axial positions: the shape's product is the (training) sequence length, the
    embedding dims sum to the width; its attention chunks must divide the sequence."""
    if isinstance(get(cfg, "axial_pos_shape"), (list, tuple)):
        rows = max(d for d in range(1, int(s["seq_len"] ** 0.5) + 1) if s["seq_len"] % d == 0)
        put(cfg, "axial_pos_shape", (rows, s["seq_len"] // rows))
        put(cfg, "axial_pos_embds_dim", (s["dim"] // 2, s["dim"] - s["dim"] // 2))
        for field in ("local_attn_chunk_length", "lsh_attn_chunk_length"):
            put(cfg, field, s["seq_len"] // 2)


@shrink_rule
def _default_language(cfg: Any, s: dict) -> None:
    """X-MOD routes every layer through a language adapter: the first language when none is set."""
    languages = get(cfg, "languages")
    if has(cfg, "default_language") and not get(cfg, "default_language") and languages:
        put(cfg, "default_language", languages[0])


@shrink_rule
def _xlstm_cache(cfg: Any, s: dict) -> None:
    """xLSTM's cache sizes its state by the width, not the q/k dims: no cache when they differ."""
    if get(cfg, "qk_dim_factor") not in (None, 1, 1.0):
        put(cfg, "use_cache", False)


@shrink_rule
def _conv_stages(cfg: Any, s: dict) -> None:
    """Convolutional towers (VibeVoice's audio tokenizers, ConvNeXt-like vision stages): one block a
    stage, and a base channel count that doubles per downsampling stage up to about the width
    (VibeVoice's 32 filters doubled 6 times made 2048-channel convolutions: 687 M parameters at
    "tiny")."""
    depths = get(cfg, "depths")
    if isinstance(depths, (list, tuple)) and depths and all(isinstance(d, int) for d in depths):
        put(cfg, "depths", [1] * len(depths))
    ratios = get(cfg, "downsampling_ratios")
    if isinstance(get(cfg, "num_filters"), int) and isinstance(ratios, (list, tuple)):
        put(cfg, "num_filters", max(s["dim"] >> len(ratios), 1))


@shrink_rule
def _no_layer_drop(cfg: Any, s: dict) -> None:
    """Every layer runs every step: LayerDrop (M2M100, NLLB-MoE, SeamlessM4T) skipped random layers
    in training, so the profiled steps ran other ops than the FLOPs pass, and half of them went
    unjoined (M2M100 at "small": 50-71% of ops joined)."""
    for field in ("layerdrop", "encoder_layerdrop", "decoder_layerdrop", "speech_encoder_layerdrop"):
        if get(cfg, field):
            put(cfg, field, 0.0)


@shrink_rule
def _sub_configs(cfg: Any, s: dict) -> None:
    """Multimodal and composite models: the text, vision, audio, encoder and decoder towers too."""
    for name in get(cfg, "sub_configs") or {}:
        sub = get(cfg, name)
        if sub is not None and hasattr(sub, "to_dict"):
            shrink_config(sub, s)


@shrink_rule
def _blt_global_width(cfg: Any, s: dict) -> None:
    """BLT: the global model reads cross_attn_k patch vectors of the byte encoder per position, so
    its width is dim x cross_attn_k (as 1024 x 2 = 2048 by default); and no cache, which counts the
    top config's layers (BLT has none: its four models have their own). After the sub-configs."""
    if get(cfg, "cross_attn_k") and get(cfg, "global_config") is not None:
        wide = s["dim"] * cfg.cross_attn_k
        put(cfg.global_config, "hidden_size", wide)
        put(cfg.global_config, "head_dim", wide // s["heads"])
        for name in ("encoder_config", "decoder_config"):
            put(get(cfg, name), "hidden_size_global", wide)
        put(cfg, "use_cache", False)


@shrink_rule
def _token_ids(cfg: Any, s: dict) -> None:
    """Token ids inside the vocabulary; seq2seq gets pad and decoder-start 0 (it shifts the labels
    right: it needs both; T5 lacks the field), and any config a pad token 0 where it has none (ESM
    numbers positions from it)."""
    for field in TOKEN_FIELDS:
        value = get(cfg, field)
        if field in ("decoder_start_token_id", "pad_token_id") and value is None and get(cfg, "is_encoder_decoder"):
            setattr(cfg, field, 0)
        elif field == "pad_token_id" and value is None and has(cfg, field):
            put(cfg, field, 0)
        elif isinstance(value, int) and not 0 <= value < s["vocab"]:
            put(cfg, field, 0)


def partial_rotary_factor(cfg: Any) -> float:
    """The rotated fraction of the head dim from `rope_parameters` (per layer type or flat), 1.0
    when none is given."""
    params = get(cfg, "rope_parameters")
    if not isinstance(params, dict):
        return 1.0
    nested = [v for v in params.values() if isinstance(v, dict)]
    for p in nested or [params]:
        factor = p.get("partial_rotary_factor")
        if isinstance(factor, (int, float)) and 0 < factor:
            return float(factor)
    return 1.0


def has_attention_layer(cfg: Any) -> bool:
    """False for a hybrid config whose layers (as shrunk) are all recurrent (Mamba, linear
    attention): Bamba without `attn_layer_indices`, GraniteMoeHybrid's default layer types."""
    if has(cfg, "attn_layer_indices") and not get(cfg, "attn_layer_indices"):
        return False
    for field in ("layer_types", "layers_block_type", "block_types"):
        kinds = get(cfg, field)
        if isinstance(kinds, (list, tuple)) and kinds and all(isinstance(k, str) for k in kinds):
            return any(k not in RECURRENT_KINDS for k in kinds)
    return True
