"""The zoo registry: `@register_zoo(name, config_cls, presets)`; a duplicate name is an error.

`build_zoo(name, size="small", **overrides)` builds the config from a preset plus overrides
(e.g. batch=8, layers=4), validates it, and calls the builder, which returns `(model, inputs)`.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from profiler.errors import FusionLensError


class ZooError(FusionLensError):
    """Unknown zoo model, preset or size override."""


@dataclass(frozen=True)
class ZooEntry:
    name: str
    config_cls: type
    presets: Mapping[str, Mapping[str, Any]]
    build: Callable[[Any], tuple]
    doc: str


ZOO: dict[str, ZooEntry] = {}

# A config field's annotation (a string under `from __future__ import annotations`) -> what a value
# for it must be and how the check names it, so `--set layers=abc` or `layers=2.5` fails naming
# the setting instead of inside the builder.
_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool) or v in (0, 1), "true/false (or 1/0)"),
    "str": (lambda v: isinstance(v, str), "text"),
}


def _check_types(name: str, config_cls: type, values: Mapping[str, Any]) -> None:
    """ZooError naming the first setting whose value is not of its field's annotated type."""
    for f in dataclasses.fields(config_cls):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        check = _FIELD_TYPES.get(kind)
        if check and f.name in values and not check[0](values[f.name]):
            raise ZooError(f"zoo model {name!r}: setting {f.name} must be {check[1]}, got {values[f.name]!r}")


def register_zoo(name: str, config_cls: type, presets: Mapping[str, Mapping[str, Any]]):
    """Decorator: register `build(config) -> (model, inputs)` as zoo model `name`."""

    def wrap(build: Callable[[Any], tuple]) -> Callable[[Any], tuple]:
        if name in ZOO:
            raise ValueError(f"zoo model {name!r} is already registered")
        doc = (build.__doc__ or "").strip().splitlines()
        ZOO[name] = ZooEntry(name, config_cls, dict(presets), build, doc[0] if doc else "")
        return build

    return wrap


def zoo_models() -> dict[str, ZooEntry]:
    """Every registered zoo model (imports the model module on first use)."""
    importlib.import_module("profiler.capture.zoo.models")
    return dict(ZOO)


def zoo_config(name: str, size: str = "small", **overrides: Any) -> Any:
    """The validated config of zoo model `name` at preset `size` with `overrides` applied."""
    entries = zoo_models()
    if name not in entries:
        raise ZooError(f"unknown zoo model {name!r} (known: {', '.join(sorted(entries))})")
    entry = entries[name]
    if size not in entry.presets:
        raise ZooError(f"zoo model {name!r} has no size {size!r} (sizes: {', '.join(entry.presets)})")
    fields = {f.name for f in dataclasses.fields(entry.config_cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ZooError(f"zoo model {name!r} has no setting {', '.join(unknown)} (settings: {', '.join(sorted(fields))})")
    values = {**entry.presets[size], **{k: v for k, v in overrides.items() if v is not None}}
    _check_types(name, entry.config_cls, values)
    try:
        return entry.config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise ZooError(f"zoo model {name!r}: {exc}") from None


def build_zoo(name: str, size: str = "small", **overrides: Any) -> tuple:
    """(model, inputs) of zoo model `name`; see `zoo_config` for size and overrides."""
    cfg = zoo_config(name, size, **overrides)
    return ZOO[name].build(cfg)
