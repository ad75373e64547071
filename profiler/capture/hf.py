"""Hugging Face `transformers` models from a config: `hf:gpt2`, `hf:llama`, `hf:bert`, `hf:mistral`, ...

Random weights, no download: each entry builds a small config (presets "tiny", "small" and
"medium", overridable: layers, dim, heads, vocab, seq_len, batch, attn_implementation),
instantiates the model class, and returns `(model, {"input_ids": ..., "labels": ...})` so
`output.loss` is the training loss. `transformers` is optional: without it, `hf:` specs fail with
one line saying so.

Three entries are written out (gpt2, llama, bert). Any other text language model transformers
knows by its `model_type` (mistral, qwen2, gemma, phi3, mixtral, gpt_neox, opt, falcon, t5, bart,
roberta, ...) is built from `AutoConfig.for_model(model_type)` shrunk to the preset by
`shrink_config` (its rules in `hf_shrink`), with the seq2seq, masked or causal LM head for that
type, tried in that order. Types that need more than tokens get their other inputs from
`EXTRA_INPUTS` (GIT's pixels, Voxtral Realtime's audio frames); types that cannot run alone
(`NOT_STANDALONE`) are refused with the reason.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from profiler.capture.hf_shrink import shrink_config
from profiler.capture.hub_kernels import keep_transformers_off_our_kernels
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


def _lm_inputs(s: dict, cfg: Any = None) -> dict[str, torch.Tensor]:
    """Token ids and labels: (B, T); a decoder over K codebooks of audio tokens (MusicGen's) takes
    ids (B * K, T) and labels (B, T, K)."""
    k = getattr(cfg, "num_codebooks", None)
    if isinstance(k, int) and k > 0:
        ids = torch.randint(0, s["vocab"], (s["batch"] * k, s["seq_len"]))
        return {"input_ids": ids, "labels": ids.view(s["batch"], k, s["seq_len"]).transpose(1, 2).contiguous()}
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq_len"]))  # (B, T)
    return {"input_ids": ids, "labels": ids.clone()}


# Model types whose forward needs more than tokens: model_type -> fn(config, preset) -> extra inputs.
EXTRA_INPUTS: dict[str, Callable[[Any, dict], dict[str, torch.Tensor]]] = {}


def extra_inputs(model_type: str):
    """Decorator: register the non-token inputs `hf:model_type` needs, from its (shrunk) config."""

    def wrap(fn):
        EXTRA_INPUTS[model_type] = fn
        return fn

    return wrap


@extra_inputs("git")
def _git_pixels(cfg: Any, s: dict) -> dict[str, torch.Tensor]:
    """GIT captions an image: its loss skips the image tokens' logits, so without pixels it is
    empty. One random image per sequence at the vision tower's (shrunk) size, (B, C, H, W)."""
    v = cfg.vision_config
    return {"pixel_values": torch.randn(s["batch"], v.num_channels, v.image_size, v.image_size)}


@extra_inputs("voxtral_realtime")
def _voxtral_realtime_audio(cfg: Any, s: dict) -> dict[str, torch.Tensor]:
    """Voxtral Realtime transcribes while it listens: every text position adds the audio embedding
    of `audio_length_per_tok` mel frames, so the features are (B, mel bins, T x that)."""
    frames = cfg.audio_length_per_tok * s["seq_len"]
    return {"input_features": torch.randn(s["batch"], cfg.audio_config.num_mel_bins, frames)}


# Types transformers lists as causal LMs that cannot run alone: refused with the reason, not listed.
NOT_STANDALONE = {
    "gemma4_assistant": "Gemma 4's drafting assistant runs on a main model's embeddings and shared KV states, not alone",
    "gemma4_unified_assistant": "Gemma 4 Unified's drafting assistant runs on a main model's embeddings and shared KV "
                                "states, not alone",
}


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
    keep_transformers_off_our_kernels()
    from transformers.models.auto import modeling_auto

    known: dict[str, str] = {}
    for mapping, auto_class in reversed(AUTO_HEADS):  # earlier heads win
        known.update(dict.fromkeys(getattr(modeling_auto, mapping, {}), auto_class))
    return {t: c for t, c in sorted(known.items()) if t not in HF_MODELS and t not in NOT_STANDALONE}


def _auto(tf: Any, model_type: str, s: dict):
    """An LM of any text model_type transformers knows, from its default config shrunk to the preset.
    A model that cannot be built with the preset's layers gets 2, then 4 (RWKV's weight init divides
    by layers - 1; Zamba ties its shared attention block across hybrid layers, so it needs two)."""
    auto_class = getattr(tf, auto_model_types()[model_type])
    first: Exception | None = None
    for layers in [s["layers"]] + [n for n in (2, 4) if n > s["layers"]]:
        try:
            cfg = _shrunk_config(tf, model_type, {**s, "layers": layers})
            head, sub = _head_for_sub_config(auto_class, cfg)
            dtype = {"dtype": torch.get_default_dtype()}  # else a config's own dtype field would win
            model = head._from_config(sub, **dtype) if head is not None else auto_class.from_config(cfg, **dtype)
            extra = EXTRA_INPUTS[model_type](cfg, s) if model_type in EXTRA_INPUTS else {}
            return model, {**_lm_inputs(s, sub), **extra}
        except Exception as exc:  # noqa: BLE001
            first = first or exc
    raise first from None  # the cause at the preset's own size


def _head_for_sub_config(auto_class: Any, cfg: Any) -> tuple[Any, Any]:
    """(head class, the sub-config it takes) where the Auto class maps a composite config to a head
    built from one of its sub-configs (MusicGen's causal LM is its decoder alone, on the decoder
    config; given the whole config it fails on a field only the decoder has); (None, cfg) otherwise."""
    try:
        head = auto_class._model_mapping[type(cfg)]
    except Exception:  # noqa: BLE001 (not mapped, or a transformers without the lazy mapping)
        return None, cfg
    wanted = getattr(head, "config_class", None)
    if wanted is None or isinstance(cfg, wanted):
        return None, cfg
    for name in getattr(cfg, "sub_configs", None) or {}:
        sub = getattr(cfg, name, None)
        if isinstance(sub, wanted):
            return head, sub
    return None, cfg


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
    if name in NOT_STANDALONE:
        raise SpecError(f"spec {spec!r}: {NOT_STANDALONE[name]}")
    import transformers

    known = getattr(transformers, "CONFIG_MAPPING", {})
    why = (f"transformers knows {name!r} but has no causal, masked or seq2seq LM head for it (text models only)"
           if name in known else f"unknown Hugging Face model {name!r}")
    raise SpecError(f"spec {spec!r}: {why} (written out: {', '.join(sorted(HF_MODELS))}; or any text LM "
                    f"model_type of transformers, e.g. mistral, qwen2, gemma, t5)")


def build_hf(spec: str, name: str, size: str = "small", batch: int | None = None,
             dtype: torch.dtype | None = None, **overrides: Any):
    """(model, inputs) for `hf:name`; SpecError when transformers is missing or the name unknown.

    dtype: build in it, much as `from_pretrained(dtype=...)` loads a checkpoint: torch's default
    dtype while the model is made (buffers it makes in fp32, such as rotary tables, stay fp32),
    then its parameters settled (`settle_dtypes`: the requested dtype, but those transformers
    keeps in fp32 in fp32).
    """
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
        keep_transformers_off_our_kernels()
        tf = importlib.import_module("transformers")
        with default_dtype(dtype):
            model, inputs = build(tf, settings)
        if dtype is not None:
            settle_dtypes(model, dtype)
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


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None):
    """torch's default dtype set to `dtype` inside (no change for None), restored on the way out."""
    before = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def settle_dtypes(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """Parameters in `dtype`, but those transformers keeps in fp32 when it loads `model` in `dtype`
    (its `_keep_in_fp32_modules` in fp16; `_keep_in_fp32_modules_strict` in fp16 and bf16; each name a
    glob searched for in the tensor's name, as transformers matches them) in fp32; buffers stay as the
    model made them (rotary tables in fp32), those lists' upcast. Parameters a model declares in fp32
    without listing them (DeBERTa's q/v biases, XLNet's projections) are cast: transformers would keep
    them fp32 too, and they then fail against bf16 activations. Returns the names kept in fp32."""
    plan = getattr(model, "_get_dtype_plan", None)
    globs = list(plan(dtype)) if callable(plan) else []
    pattern = re.compile("|".join(f"(?:{g.replace('*', '.*')})" for g in globs)) if globs else None
    kept = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if not t.is_floating_point():
            continue
        if pattern is not None and pattern.search(name):
            want = torch.float32
            kept.append(name)
        elif isinstance(t, torch.nn.Parameter):
            want = dtype
        else:
            continue
        if t.dtype != want:
            t.data = t.data.to(want)
    return kept
