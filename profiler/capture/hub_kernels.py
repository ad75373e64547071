"""Keep FusionLens's `kernels` package from breaking `transformers` when Hugging Face's `kernels`
distribution is installed too.

The two share an import name, and FusionLens's package (the repository root is first on
sys.path) is the one `import kernels` finds. transformers checks for the hub package by its
distribution metadata, and when a version it supports is installed, imports names from `kernels`
as soon as a model module loads: every model then fails with "cannot import name 'CUDAProperties'
from 'kernels'". The hub kernels are GPU layers transformers uses only on request
(`use_kernels=True`), and in this process they cannot be imported at all, so FusionLens tells
transformers they are not there: its `is_kernels_available` reports False, as it does when the
distribution is absent. Nothing changes when there is no clash.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

OUR_KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def shadowed_hub_kernels() -> str | None:
    """The installed version of Hugging Face's `kernels` distribution when `import kernels` finds
    FusionLens's package instead; None when there is no clash."""
    try:
        version = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return None
    module = sys.modules.get("kernels")
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec("kernels")
        origin = spec.origin if spec is not None else None
    if origin is None or Path(origin).resolve().parent != OUR_KERNELS:
        return None
    return version


def _unavailable(*args, **kwargs) -> bool:
    """transformers' `is_kernels_available` while FusionLens's `kernels` shadows the hub package."""
    return False


def keep_transformers_off_our_kernels() -> str | None:
    """Before transformers loads a model: on a clash, make every `is_kernels_available` transformers
    holds (its own, and the copies modules imported by name) report False. Returns the shadowed
    version (for a message), or None when there was nothing to do."""
    version = shadowed_hub_kernels()
    if version is None or importlib.util.find_spec("transformers") is None:
        return None
    import transformers.utils.import_utils as import_utils

    original = getattr(import_utils, "is_kernels_available", None)
    if original is None or original is _unavailable:
        return version
    for name, module in list(sys.modules.items()):
        # each module's own namespace, not getattr: transformers' lazy modules import on getattr
        if (name == "transformers" or name.startswith("transformers.")) and \
                getattr(module, "__dict__", {}).get("is_kernels_available") is original:
            setattr(module, "is_kernels_available", _unavailable)
    return version
