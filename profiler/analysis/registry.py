"""Registry of analyses and rules, so the CLI, the pages and the report list the same set.

An analysis is a pure function `f(trace, **params) -> DataFrame | frozen result`: no I/O, no
globals, no plotting. A rule turns analysis results into findings. Registration is by decorator
and a duplicate name is an error (the `torch.utils.flop_counter` registry shape).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

ANALYSES: dict[str, "AnalysisSpec"] = {}
RULES: dict[str, "RuleSpec"] = {}


@dataclass(frozen=True)
class AnalysisSpec:
    name: str
    fn: Callable[..., Any]
    title: str
    description: str
    needs_ranks: int = 1  # minimum number of ranks for the analysis to make sense

    def __call__(self, trace: Any, **params: Any) -> Any:
        return self.fn(trace, **params)


@dataclass(frozen=True)
class RuleSpec:
    name: str
    fn: Callable[..., Any]  # (trace, results: dict[str, Any]) -> list[Finding]
    description: str


def register_analysis(name: str, title: str, description: str = "", needs_ranks: int = 1):
    """Decorator: register `fn` as analysis `name`; a duplicate name raises."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in ANALYSES:
            raise ValueError(f"analysis {name!r} is already registered")
        ANALYSES[name] = AnalysisSpec(name, fn, title, description or (fn.__doc__ or "").strip().split("\n")[0], needs_ranks)
        return fn

    return wrap


def register_rule(name: str, description: str = ""):
    """Decorator: register `fn` as rule `name`; a duplicate name raises."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in RULES:
            raise ValueError(f"rule {name!r} is already registered")
        RULES[name] = RuleSpec(name, fn, description or (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return wrap
