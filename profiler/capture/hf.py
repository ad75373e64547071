"""Hugging Face `transformers` models from a config: `hf:gpt2`, `hf:llama`, `hf:bert`, ...

Random weights, no download: each entry builds a small config (presets "tiny" and "small",
overridable: layers, dim, heads, vocab, seq_len, batch, attn_implementation), instantiates the
model class, and returns `(model, {"input_ids": ..., "labels": ...})` so `output.loss` is the
training loss. `transformers` is optional: without it, `hf:` specs fail with one line saying so.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
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


def build_hf(spec: str, name: str, size: str = "small", batch: int | None = None, **overrides: Any):
    """(model, inputs) for `hf:name`; SpecError when transformers is missing or the name unknown."""
    if name not in HF_MODELS:
        raise SpecError(f"spec {spec!r}: unknown Hugging Face model {name!r} (known: {', '.join(sorted(HF_MODELS))})")
    reason = transformers_unavailable_reason()
    if reason:
        raise SpecError(f"spec {spec!r}: {reason}")
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
        model, inputs = HF_MODELS[name].build(tf, settings)
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
