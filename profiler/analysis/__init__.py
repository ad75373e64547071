"""Analyses of a Trace: pure functions registered by name (see `registry.py`).

Importing this package registers nothing; `load_all()` imports every analysis module so that
`registry.ANALYSES` / `registry.RULES` list the full set (the CLI, the pages and the report call it).
"""
from __future__ import annotations

import importlib

# Every module that registers analyses or rules, by name (relative to this package).
ANALYSIS_MODULES: tuple[str, ...] = (
    "breakdown",
    "kernels",
    "idle",
    "launch",
    "gpu_metrics",
    "memcpy",
    "attribution",
    "distributed",
    "diff",
    "rules",
    "roofline",
)


def load_all() -> None:
    """Import every analysis module (idempotent: Python caches modules, so nothing registers twice)."""
    for name in ANALYSIS_MODULES:
        importlib.import_module(f"{__name__}.{name}")
