"""Hugging Face `transformers` models from a config: `hf:gpt2`, `hf:llama`, `hf:bert`, `hf:mistral`, ...

Random weights, no download: each entry builds a small config (presets "tiny", "small" and
"medium", overridable: layers, dim, heads, vocab, seq_len, batch, attn_implementation),
instantiates the model class, and returns `(model, {"input_ids": ..., "labels": ...})` so
`output.loss` is the training loss. `transformers` is optional: without it, `hf:` specs fail with
one line saying so.

Three entries are written out (gpt2, llama, bert). Any other text language model transformers
knows by its `model_type` (mistral, qwen2, gemma, phi3, mixtral, gpt_neox, opt, falcon, t5, bart,
roberta, ...) is built from `AutoConfig.for_model(model_type)` shrunk to the preset by
`shrink_config` (size fields under their per-family names, FFN and head dims, MoE experts,
sub-configs of multimodal models, every layer type of hybrids, token ids inside the vocabulary),
with the seq2seq, masked or causal LM head for that type, tried in that order.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from profiler.capture.spec import SpecError, describe_failure

HF_PRESETS = {"tiny": dict(layers=1, dim=32, heads=2, vocab=128, seq_len=16, batch=2),
              "small": dict(layers=2, dim=128, heads=4, vocab=2048, seq_len=64, batch=4),
              "medium": dict(layers=4, dim=256, heads=4, vocab=4096, seq_len=128, batch=4)}


@dataclass(frozen=True)
class HFEntry:
    name: str
    build: Callable[[Any, dict], tuple[torch.nn.Module, dict]]
    doc: str


HF_MODELS: dict[str, HFEntry] = {}


def register_hf(name: str):
    """Decorator: register `build(transformers_module, size) -> (model, inputs)` as `hf:name`."""

    def wrap(fn):
        if name in HF_MODELS:
            raise ValueError(f"hf model {name!r} is already registered")
        HF_MODELS[name] = HFEntry(name, fn, (fn.__doc__ or "").strip().splitlines()[0])
        return fn

    return wrap


def transformers_unavailable_reason() -> str | None:
    """None when `transformers` can be imported, else one line saying why not."""
    if importlib.util.find_spec("transformers") is None:
        return "the optional package 'transformers' is not installed (pip install transformers)"
    return None


def _lm_inputs(s: dict) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq_len"]))  # (B, T)
    return {"input_ids": ids, "labels": ids.clone()}


def _attn(s: dict) -> dict:
    return {"attn_implementation": s["attn_implementation"]} if s.get("attn_implementation") else {}


@register_hf("gpt2")
def _gpt2(tf: Any, s: dict):
    """GPT2LMHeadModel from a small GPT2Config."""
    cfg = tf.GPT2Config(n_layer=s["layers"], n_embd=s["dim"], n_head=s["heads"], vocab_size=s["vocab"],
                        n_positions=s["seq_len"], bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
                        **_attn(s))
    return tf.GPT2LMHeadModel(cfg), _lm_inputs(s)


@register_hf("llama")
def _llama(tf: Any, s: dict):
    """LlamaForCausalLM from a small LlamaConfig (RMSNorm, SwiGLU, RoPE)."""
    cfg = tf.LlamaConfig(num_hidden_layers=s["layers"], hidden_size=s["dim"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["heads"], intermediate_size=8 * s["dim"] // 3,
                         vocab_size=s["vocab"], max_position_embeddings=s["seq_len"], loss_type="ForCausalLM",
                         **_attn(s))
    return tf.LlamaForCausalLM(cfg), _lm_inputs(s)


@register_hf("bert")
def _bert(tf: Any, s: dict):
    """BertForMaskedLM from a small BertConfig."""
    cfg = tf.BertConfig(num_hidden_layers=s["layers"], hidden_size=s["dim"], num_attention_heads=s["heads"],
                        intermediate_size=4 * s["dim"], vocab_size=s["vocab"],
                        max_position_embeddings=s["seq_len"], loss_type="ForMaskedLM", **_attn(s))
    return tf.BertForMaskedLM(cfg), _lm_inputs(s)


# The LM heads an auto-built model gets, tried in this order: an encoder-decoder is seq2seq even when
# also listed as masked (bart), an encoder is masked even when also listed as causal (roberta).
AUTO_HEADS = (("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
              ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
              ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"))


@functools.lru_cache(maxsize=1)
def auto_model_types() -> dict[str, str]:
    """{model_type: Auto class} for the text LMs transformers knows, beyond the written-out entries;
    empty without transformers."""
    if transformers_unavailable_reason():
        return {}
    from transformers.models.auto import modeling_auto

    known: dict[str, str] = {}
    for mapping, auto_class in reversed(AUTO_HEADS):  # earlier heads win
        known.update(dict.fromkeys(getattr(modeling_auto, mapping, {}), auto_class))
    return {t: c for t, c in sorted(known.items()) if t not in HF_MODELS}


# Config fields set to a preset value where the config has them: preset key -> field spellings.
_SIZE_FIELDS = {
    "layers": ("num_hidden_layers", "num_layers", "num_decoder_layers", "encoder_layers", "decoder_layers"),
    "dim": ("hidden_size", "d_model", "cross_attention_hidden_size"),  # the last: T5Gemma's encoder width
    "heads": ("num_attention_heads", "num_key_value_heads", "encoder_attention_heads", "decoder_attention_heads",
              "num_heads"),
    # Gemma 3n/4's per-layer inputs, BLT's hashed byte n-grams
    "vocab": ("vocab_size", "decoder_vocab_size", "vocab_size_per_layer_input", "encoder_hash_byte_group_vocab"),
}
# at the width: Gemma 3n/4's per-layer input embeddings, RecurrentGemma's recurrent (LRU) state,
# embedding widths (SqueezeBERT's must equal the hidden size, MobileBERT's bottleneck must not
# exceed it, xLSTM's is its width)
_WIDTH_FIELDS = ("hidden_size_per_layer_input", "lru_width", "embedding_size", "intra_bottleneck_size",
                 "embedding_dim")
_FFN_FIELDS = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "hidden_dim",
               "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size", "d_inner",
               "expert_ffn_hidden_size")
# MoE: 4 experts (LongCat's identity "zero experts" too), top-2, one group
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "zero_expert_num")
_TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")


def _get(cfg: Any, field: str) -> Any:
    """cfg.field, or None where it is missing or refuses to be read (transformers raises its own
    errors for a per-layer attribute read globally, and properties may compute from other fields)."""
    try:
        return getattr(cfg, field, None)
    except Exception:  # noqa: BLE001
        return None


def _has(cfg: Any, field: str) -> bool:
    """The config has `field` (a per-layer attribute counts, though it cannot be read globally)."""
    try:
        return hasattr(cfg, field)
    except Exception:  # noqa: BLE001
        return True


def _set(cfg: Any, field: str, value: Any) -> None:
    """cfg.field = value where the config has that field and lets it be set (some are properties,
    some per-layer attributes that transformers refuses to set globally: left as they are)."""
    if _has(cfg, field):
        try:
            setattr(cfg, field, value)
        except Exception:  # noqa: BLE001  (AttributeError, TypeError, transformers' per-layer errors)
            pass


def shrink_config(cfg: Any, s: dict) -> Any:
    """`cfg` at the preset's size: layers, width, heads (KV heads too), FFN 4x width, head dim
    width/heads (latent attention's ranks and split head dims to match), MoE at 4 experts top-2,
    hybrids with every layer kind kept (and no cache where all are recurrent), Mamba-2 heads,
    positions seq_len + 2 (encoders that offset positions by the pad index), and token ids inside
    the vocabulary. Works on any object with those attributes (a per-layer override too)."""
    for key, fields in _SIZE_FIELDS.items():
        for field in fields:
            _set(cfg, field, s[key])
    for kinds_field in ("layer_types", "block_types"):  # block_types: RecurrentGemma's repeating pattern
        types = _get(cfg, kinds_field)
        if isinstance(types, (list, tuple)) and types and all(isinstance(t, str) for t in types):
            # hybrids (linear + full attention, sliding + global): every layer type at least once, in the
            # order the full model first uses them; the layer count grows to that when the preset's is less
            kinds = list(dict.fromkeys(types))
            layers = max(s["layers"], len(kinds))
            _set(cfg, kinds_field, [kinds[i % len(kinds)] for i in range(layers)])
            for field in _SIZE_FIELDS["layers"]:
                _set(cfg, field, layers)
    if _get(cfg, "num_kv_shared_layers"):
        # Gemma 3n: the last layers reuse the KV cache of the last earlier layer of their type; kept
        # (one sharing layer a type) where every type still has a layer before them, else none
        kinds = len(set(_get(cfg, "layer_types") or ["any"]))
        layers = _get(cfg, "num_hidden_layers") or s["layers"]
        _set(cfg, "num_kv_shared_layers", kinds if layers >= 2 * kinds else 0)
    if _get(cfg, "attn_layer_period") and _has(cfg, "attn_layer_offset"):
        # Jamba: one attention layer every `period` from `offset`, so the shrunk model keeps one:
        # layer 0 Mamba, layer 1 attention (and MoE every second layer from 1, as the full model)
        for field in _SIZE_FIELDS["layers"]:
            _set(cfg, field, max(s["layers"], 2))
        _set(cfg, "attn_layer_period", 2)
        _set(cfg, "attn_layer_offset", 1)
    if _get(cfg, "mamba_n_heads") and _get(cfg, "mamba_expand"):
        # Bamba, GraniteMoeHybrid: Mamba-2 heads x head dim = expand x width
        _set(cfg, "mamba_n_heads", s["heads"])
        _set(cfg, "mamba_d_head", cfg.mamba_expand * s["dim"] // s["heads"])
        if _get(cfg, "mamba_d_ssm"):  # Falcon-H1 names that product too
            _set(cfg, "mamba_d_ssm", cfg.mamba_n_heads * cfg.mamba_d_head)
    if not _has_attention_layer(cfg):
        _set(cfg, "use_cache", False)  # transformers' cache needs one attention layer to count tokens
    for field in _WIDTH_FIELDS:
        _set(cfg, field, s["dim"])
    for field in _FFN_FIELDS:  # per layer where the config lists it per layer (Gemma 3n)
        per_layer = isinstance(_get(cfg, field), (list, tuple))
        _set(cfg, field, [4 * s["dim"]] * (_get(cfg, "num_hidden_layers") or s["layers"]) if per_layer else 4 * s["dim"])
    head_dim = s["dim"] // s["heads"]
    for field in ("head_dim", "d_kv", "v_head_dim", "d_head", "index_head_dim"):  # index_*: dots3's indexer
        _set(cfg, field, head_dim)
    _set(cfg, "index_n_heads", s["heads"])
    if _has(cfg, "qk_rope_head_dim"):  # multi-head latent attention (DeepSeek): its rope dims are head_dim
        for field in ("qk_rope_head_dim", "qk_nope_head_dim", "head_dim"):
            _set(cfg, field, head_dim // 2)
        factor = _partial_rotary_factor(cfg)
        if factor < 1.0:  # dots3: the rotated dims are head_dim x factor, which must stay qk_rope_head_dim
            _set(cfg, "head_dim", int(round(head_dim // 2 / factor)))
    for field in ("q_lora_rank", "kv_lora_rank"):
        if _get(cfg, field):
            _set(cfg, field, s["dim"] // 2)
    moe = False
    for field in _EXPERT_FIELDS:
        if _get(cfg, field):
            _set(cfg, field, 4)
            moe = True
    if _get(cfg, "num_experts_per_tok") or (moe and _has(cfg, "num_experts_per_tok")):
        _set(cfg, "num_experts_per_tok", min(cfg.num_experts_per_tok or 2, 2))  # DeepSeek-V2's default is None
    for field in ("n_group", "topk_group", "n_groups"):
        _set(cfg, field, 1)
    if isinstance(_get(cfg, "expand"), int) and _has(cfg, "num_heads") and _has(cfg, "head_dim"):
        _set(cfg, "head_dim", cfg.expand * s["dim"] // s["heads"])  # Mamba-2: heads x head_dim = expand x width
    for field in ("max_position_embeddings", "n_positions"):
        _set(cfg, field, s["seq_len"] + 2)
    if _has(cfg, "d_latents") and _has(cfg, "num_latents"):
        # Perceiver: the inputs cross-attend into a latent array that self-attends; its masked-LM
        # decoder queries one position per max_position_embeddings, so that is the sequence itself
        _set(cfg, "d_latents", s["dim"])
        _set(cfg, "num_latents", s["seq_len"])
        _set(cfg, "num_self_attends_per_block", s["layers"])
        for field in ("num_self_attention_heads", "num_cross_attention_heads"):
            _set(cfg, field, s["heads"])
        _set(cfg, "max_position_embeddings", s["seq_len"])
    languages = _get(cfg, "languages")
    if _has(cfg, "default_language") and not _get(cfg, "default_language") and languages:
        _set(cfg, "default_language", languages[0])  # X-MOD routes every layer through a language adapter
    if _get(cfg, "qk_dim_factor") not in (None, 1, 1.0):
        _set(cfg, "use_cache", False)  # xLSTM's cache sizes its state by the width, not the q/k dims
    if isinstance(_get(cfg, "axial_pos_shape"), (list, tuple)):
        # Reformer's axial positions: the shape's product is the (training) sequence length, the
        # embedding dims sum to the width; its attention chunks must divide the sequence
        rows = max(d for d in range(1, int(s["seq_len"] ** 0.5) + 1) if s["seq_len"] % d == 0)
        _set(cfg, "axial_pos_shape", (rows, s["seq_len"] // rows))
        _set(cfg, "axial_pos_embds_dim", (s["dim"] // 2, s["dim"] - s["dim"] // 2))
        for field in ("local_attn_chunk_length", "lsh_attn_chunk_length"):
            _set(cfg, field, s["seq_len"] // 2)
    if _get(cfg, "rotary_dim"):  # GPT-J, CodeGen: the rotated dims, at most the head dim
        _set(cfg, "rotary_dim", head_dim)
    for name in _get(cfg, "sub_configs") or {}:  # multimodal: the text, vision, audio towers too
        sub = _get(cfg, name)
        if sub is not None and hasattr(sub, "to_dict"):
            shrink_config(sub, s)
    if _get(cfg, "cross_attn_k") and _get(cfg, "global_config") is not None:
        # BLT: the global model reads cross_attn_k patch vectors of the byte encoder per position, so
        # its width is dim x cross_attn_k (as 1024 x 2 = 2048 by default); and no cache, which
        # counts the top config's layers (BLT has none: its four models have their own)
        wide = s["dim"] * cfg.cross_attn_k
        _set(cfg.global_config, "hidden_size", wide)
        _set(cfg.global_config, "head_dim", wide // s["heads"])
        for name in ("encoder_config", "decoder_config"):
            _set(_get(cfg, name), "hidden_size_global", wide)
        _set(cfg, "use_cache", False)
    for field in _TOKEN_FIELDS:
        value = _get(cfg, field)
        if field in ("decoder_start_token_id", "pad_token_id") and value is None and _get(cfg, "is_encoder_decoder"):
            setattr(cfg, field, 0)  # seq2seq shifts the labels right: it needs both (T5 lacks the field)
        elif field == "pad_token_id" and value is None and _has(cfg, field):
            _set(cfg, field, 0)  # ESM numbers positions from the pad token
        elif isinstance(value, int) and not 0 <= value < s["vocab"]:
            _set(cfg, field, 0)
    return cfg


def _partial_rotary_factor(cfg: Any) -> float:
    """The rotated fraction of the head dim from `rope_parameters` (per layer type or flat), 1.0
    when none is given."""
    params = _get(cfg, "rope_parameters")
    if not isinstance(params, dict):
        return 1.0
    nested = [v for v in params.values() if isinstance(v, dict)]
    for p in nested or [params]:
        factor = p.get("partial_rotary_factor")
        if isinstance(factor, (int, float)) and 0 < factor:
            return float(factor)
    return 1.0


_RECURRENT_KINDS = ("linear_attention", "mamba", "recurrent", "mamba2", "ssm")


def _has_attention_layer(cfg: Any) -> bool:
    """False for a hybrid config whose layers (as shrunk) are all recurrent (Mamba, linear
    attention): Bamba without `attn_layer_indices`, GraniteMoeHybrid's default layer types."""
    if _has(cfg, "attn_layer_indices") and not _get(cfg, "attn_layer_indices"):
        return False
    for field in ("layer_types", "layers_block_type", "block_types"):
        kinds = _get(cfg, field)
        if isinstance(kinds, (list, tuple)) and kinds and all(isinstance(k, str) for k in kinds):
            return any(k not in _RECURRENT_KINDS for k in kinds)
    return True


def _auto(tf: Any, model_type: str, s: dict):
    """An LM of any text model_type transformers knows, from its default config shrunk to the preset.
    A model that cannot be built with the preset's layers gets 2, then 4 (RWKV's weight init divides
    by layers - 1; Zamba ties its shared attention block across hybrid layers, so it needs two)."""
    auto_class = getattr(tf, auto_model_types()[model_type])
    first: Exception | None = None
    for layers in [s["layers"]] + [n for n in (2, 4) if n > s["layers"]]:
        try:
            return auto_class.from_config(_shrunk_config(tf, model_type, {**s, "layers": layers})), _lm_inputs(s)
        except Exception as exc:  # noqa: BLE001
            first = first or exc
    raise first from None  # the cause at the preset's own size


def _shrunk_config(tf: Any, model_type: str, s: dict) -> Any:
    """The default config of `model_type` shrunk to the preset, then built again from the shrunk
    values, so that fields its constructor derives from them follow (Zamba2's attention width);
    per-layer overrides (Gemma 4, dots3: some layers' own heads and head dims, which the built
    config refuses to have set) are shrunk by the same rules and passed in. A constructor that
    refuses the values leaves the config as shrunk in place."""
    cfg = tf.AutoConfig.for_model(model_type, **_attn(s))
    before = cfg.to_dict()
    shrink_config(cfg, s)
    subs = set(getattr(cfg, "sub_configs", None) or {})
    changed = {k: v for k, v in cfg.to_dict().items() if k not in subs and before.get(k) != v}
    try:
        rebuilt = shrink_config(tf.AutoConfig.for_model(model_type, **_attn(s), **changed), s)
        full = rebuilt.to_dict()
        per_layer = full.get("per_layer_config")
        if isinstance(per_layer, dict) and per_layer:
            # an override equal to the shrunk global value is dropped: transformers wants every layer
            # of a type to have the same overrides, and the first layer of a type often has none
            shrunk = {layer: {k: v for k, v in vars(shrink_config(SimpleNamespace(**fields), s)).items()
                              if full.get(k) != v}
                      for layer, fields in per_layer.items()}
            shrunk = {layer: fields for layer, fields in shrunk.items() if fields}
            if shrunk != per_layer:
                rebuilt = shrink_config(tf.AutoConfig.for_model(model_type, **_attn(s), **changed,
                                                                per_layer_config=shrunk), s)
        return rebuilt
    except Exception:  # noqa: BLE001
        return cfg


def _builder(spec: str, name: str) -> Callable[[Any, dict], tuple[torch.nn.Module, dict]]:
    """The written-out entry for `name`, else the auto builder when transformers knows it as a
    text LM; SpecError otherwise (transformers missing, or the name unknown)."""
    if name in HF_MODELS:
        reason = transformers_unavailable_reason()
        if reason:
            raise SpecError(f"spec {spec!r}: {reason}")
        return HF_MODELS[name].build
    reason = transformers_unavailable_reason()
    if reason:
        raise SpecError(f"spec {spec!r}: {name!r} is not one of {', '.join(sorted(HF_MODELS))}, and other "
                        f"model types need transformers: {reason}")
    if name in auto_model_types():
        return lambda tf, s: _auto(tf, name, s)
    import transformers

    known = getattr(transformers, "CONFIG_MAPPING", {})
    why = (f"transformers knows {name!r} but has no causal, masked or seq2seq LM head for it (text models only)"
           if name in known else f"unknown Hugging Face model {name!r}")
    raise SpecError(f"spec {spec!r}: {why} (written out: {', '.join(sorted(HF_MODELS))}; or any text LM "
                    f"model_type of transformers, e.g. mistral, qwen2, gemma, t5)")


def build_hf(spec: str, name: str, size: str = "small", batch: int | None = None, **overrides: Any):
    """(model, inputs) for `hf:name`; SpecError when transformers is missing or the name unknown."""
    build = _builder(spec, name)
    if size not in HF_PRESETS:
        raise SpecError(f"spec {spec!r}: no size {size!r} (sizes: {', '.join(HF_PRESETS)})")
    settings = dict(HF_PRESETS[size])
    unknown = sorted(set(overrides) - set(settings) - {"attn_implementation"})
    if unknown:
        raise SpecError(f"spec {spec!r}: unknown setting {', '.join(unknown)} (settings: {', '.join(sorted(settings))}, attn_implementation)")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if batch is not None:
        settings["batch"] = batch
    try:
        tf = importlib.import_module("transformers")
        model, inputs = build(tf, settings)
    except SpecError:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise describe_failure(spec, f"building {name} with transformers", exc) from None
    # transformers 5 reads the loss from `model.loss_type`, which its constructors leave None (it then
    # warns on every step): take the config's explicit value instead.
    if getattr(model, "loss_type", "") is None and getattr(model.config, "loss_type", None):
        model.loss_type = model.config.loss_type
    return model, inputs
