"""Model specs: turn "gpt2", "hf:llama", "path/to/file.py:build" or "pkg.mod:build" into a model.

A spec's build function returns `(model, inputs)`: `model` an `nn.Module`, `inputs` a tuple of
positional tensors or a dict of keyword tensors (a single tensor is taken as a 1-tuple). It gets
`batch` and the `--set` settings when asked for them (refused when it cannot take them), and
`dtype` (a torch.dtype) and `device` (a string) when it declares them. A build that takes `dtype`
chooses its own precision (say bf16 with an fp32 router), and the runner then moves model and
inputs to the device without casting them; `hf:` specs build that way in fp16 and bf16, keeping
the parts transformers keeps in fp32.

Importing a spec runs the user's code, so only specs given locally (command line, the UI's
local-path field) are resolved; nothing from an upload is ever imported. Every failure (missing
file, import error, wrong return, a raising build, out of memory) is one `SpecError` line that
names the spec and the cause.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Union

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from profiler.errors import FusionLensError

Inputs = Union[tuple, Mapping[str, Any]]


class SpecError(FusionLensError):
    """A model spec that cannot be used: one line naming the spec and the cause."""


def setting_value(text: str) -> Any:
    """A zoo/hf setting typed in as text (`--set`, the Profile page): '4' -> 4, '0.5' -> 0.5,
    'true'/'false' -> bool, anything else stays text (the config then checks its own fields)."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def setting_item(item: str) -> tuple[str, Any]:
    """One 'KEY=VALUE' setting (`--set`, the Profile page) -> (key, typed value); ValueError
    naming the item when the key is not an identifier or the value is empty."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip().isidentifier() or not value.strip():
        raise ValueError(f"expected KEY=VALUE, got {item!r}")
    return key.strip(), setting_value(value)


@dataclass(frozen=True)
class LoadedModel:
    """A resolved spec: the model, its inputs, and how it was made (kind: zoo, hf, file, module)."""

    spec: str
    kind: str
    model: nn.Module
    inputs: Inputs
    dtype: str | None = None  # the capture dtype the spec built in itself (its own mixed precision): not recast

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise SpecError(f"spec {self.spec!r}: model must be a torch.nn.Module")

    def call(self) -> Any:
        """Run the model's forward on its inputs."""
        if isinstance(self.inputs, Mapping):
            return self.model(**self.inputs)
        return self.model(*self.inputs)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_oom(exc: BaseException) -> bool:
    """True for host or device out-of-memory errors."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(exc).lower()


def describe_failure(spec: str, what: str, exc: BaseException) -> SpecError:
    """A SpecError for `exc` raised while doing `what` (e.g. "build()", "step 0")."""
    if is_oom(exc):
        return SpecError(f"spec {spec!r}: {what} ran out of memory ({_one_line(exc)}); try a smaller --batch or size")
    return SpecError(f"spec {spec!r}: {what} raised {_one_line(exc)}")


def _one_batch(spec: str, batch: Any, setting: Any) -> Any:
    """The batch size asked for by `--batch` (the Profile page's Batch) or by a `batch=` setting:
    either one, or both when they agree; SpecError when they differ (neither silently wins)."""
    if batch is None:
        return setting
    if setting is not None and setting != batch:
        raise SpecError(f"spec {spec!r}: batch given twice, {batch!r} and batch={setting!r} in the settings; give one")
    return batch


def _import_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise SpecError(f"spec {spec!r}: file not found: {path}")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"fusionlens_user_spec_{path.stem}_{digest}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise SpecError(f"spec {spec!r}: cannot import {path} (not a Python source file)")
    module = importlib.util.module_from_spec(mod_spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # so the spec can import its sibling modules
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except BaseException as exc:  # user code: any failure (incl. SystemExit) becomes one line
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise SpecError(f"spec {spec!r}: importing {path.name} failed: {_one_line(exc)}") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _import_module(spec: str, dotted: str) -> Any:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and dotted.startswith(exc.name):
            raise SpecError(f"spec {spec!r}: no module named {exc.name!r}") from None
        raise SpecError(f"spec {spec!r}: importing {dotted} failed: {_one_line(exc)}") from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise SpecError(f"spec {spec!r}: importing {dotted} failed: {_one_line(exc)}") from None


def _call_build(spec: str, build: Callable[..., Any], options: Mapping[str, Any]) -> Any:
    try:
        params = inspect.signature(build).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): pass everything asked for
        params = None
    accepts_any = params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = {k: v for k, v in options.items() if v is not None}
    unknown = [k for k in given if not accepts_any and k not in params]
    if unknown:  # asked for (--batch, --set) but build() cannot take it: say so rather than ignore it
        raise SpecError(f"spec {spec!r}: build() does not take {', '.join(map(repr, unknown))} "
                        f"(its parameters: {', '.join(params) or 'none'})")
    kwargs = given
    try:
        return build(**kwargs)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise describe_failure(spec, "build()", exc) from None


def validate_output(spec: str, out: Any) -> tuple[nn.Module, Inputs]:
    """Check a build's return value: (nn.Module, tuple-of-tensors | dict-of-tensors)."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise SpecError(f"spec {spec!r}: build() must return (model, inputs), got {type(out).__name__}")
    model, inputs = out
    if not isinstance(model, nn.Module):
        raise SpecError(f"spec {spec!r}: build() returned a {type(model).__name__} as model; expected torch.nn.Module")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if isinstance(inputs, Mapping):
        bad = [k for k, v in inputs.items() if not isinstance(k, str)]
        if bad:
            raise SpecError(f"spec {spec!r}: input dict keys must be strings, got {bad[0]!r}")
        values = list(inputs.values())
    elif isinstance(inputs, tuple):
        values = list(inputs)
    else:
        raise SpecError(f"spec {spec!r}: inputs must be a tuple of tensors or a dict of tensors, got {type(inputs).__name__}")
    if not any(isinstance(v, torch.Tensor) for v in tree_flatten(values)[0]):  # nested lists/dicts too
        raise SpecError(f"spec {spec!r}: inputs contain no tensor")
    return model, inputs


def split_spec(spec: str) -> tuple[str, str, str]:
    """(kind, target, attr): kind is 'hf', 'file', 'module' or 'zoo'."""
    if spec.startswith("hf:"):
        return "hf", spec[3:], ""
    target, sep, attr = spec.rpartition(":")
    if sep and attr.isidentifier():
        is_file = target.endswith(".py") or "/" in target or "\\" in target
        return ("file" if is_file else "module"), target, attr
    if spec.endswith(".py"):
        return "file", spec, "build"
    return "zoo", spec, ""


def load_spec(spec: str, *, size: str = "small", batch: int | None = None,
              overrides: Mapping[str, Any] | None = None, dtype: str | None = None,
              device: str | None = None) -> LoadedModel:
    """Resolve `spec` to a LoadedModel (the runner moves it). Raises SpecError.

    dtype/device: the capture's ("bfloat16", "cuda:0"), for the builds that take them (module doc).
    """
    spec = spec.strip()
    if not spec:
        raise SpecError("empty model spec (give a zoo name, hf:NAME, file.py:build or package.module:build)")
    kind, target, attr = split_spec(spec)
    overrides = dict(overrides or {})
    batch = _one_batch(spec, batch, overrides.pop("batch", None))
    built_in = None  # the dtype the build made the model in itself, if it did
    if kind == "zoo":
        from profiler.capture.zoo import ZooError, build_zoo, zoo_models

        if target not in zoo_models():
            raise SpecError(f"spec {spec!r}: not a zoo model ({', '.join(sorted(zoo_models()))}), "
                            "hf:NAME, file.py:build or package.module:build")
        try:
            out = build_zoo(target, size, batch=batch, **overrides)
        except ZooError as exc:
            raise SpecError(f"spec {spec!r}: {exc}") from None
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise describe_failure(spec, "building the zoo model", exc) from None
    elif kind == "hf":
        from profiler.capture.hf import build_hf

        built_in = dtype if dtype in NATIVE_HF_DTYPES else None
        out = build_hf(spec, target, size=size, batch=batch, dtype=getattr(torch, built_in) if built_in else None,
                       **overrides)
    else:
        from profiler.capture.hub_kernels import keep_transformers_off_our_kernels

        keep_transformers_off_our_kernels()  # the user's code may build a transformers model
        module = _import_file(spec, Path(target).expanduser()) if kind == "file" else _import_module(spec, target)
        build = getattr(module, attr, None)
        if not callable(build):
            raise SpecError(f"spec {spec!r}: {target} has no function {attr!r}")
        declared = _declared(build, {"dtype": getattr(torch, dtype) if dtype else None, "device": device})
        out = _call_build(spec, build, {"batch": batch, **overrides, **declared})
        built_in = dtype if "dtype" in declared else None
    model, inputs = validate_output(spec, out)
    return LoadedModel(spec, kind, model, inputs, dtype=built_in)


# The dtypes an hf: spec is built in directly (as from_pretrained(dtype=...) loads one): others are cast.
NATIVE_HF_DTYPES = ("float16", "bfloat16")


def _declared(build: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The options (dtype, device) that `build` names as parameters and that are set."""
    try:
        params = inspect.signature(build).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in options.items() if v is not None and k in params}
