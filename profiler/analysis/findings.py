"""Findings (what a rule concludes) and the lazy result set rules read from.

A `Finding` is one actionable sentence with numbers and an estimated saving. `Results` is a
read-only mapping {analysis name: result} that runs a registered analysis the first time a rule
(or the report) asks for it, so a rule names the analyses it needs instead of re-computing them,
and each analysis runs at most once per trace.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator

SEVERITIES: tuple[str, ...] = ("info", "low", "medium", "high")


@dataclass(frozen=True)
class Finding:
    """rule: registered rule name; severity: one of SEVERITIES; message: one sentence with numbers;
    est_saving_us: estimated time saved (µs, summed over ranks); est_saving_pct: that saving as % of
    step time (NaN when there is no step time); evidence: the numbers behind it."""

    rule: str
    severity: str
    message: str
    est_saving_us: float
    est_saving_pct: float
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding.severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not self.rule or not self.message:
            raise ValueError("Finding needs a rule name and a message")
        if not (self.est_saving_us >= 0 and math.isfinite(self.est_saving_us)):
            raise ValueError(f"Finding.est_saving_us must be finite and >= 0, got {self.est_saving_us}")
        object.__setattr__(self, "evidence", MappingProxyType(dict(self.evidence)))

    def as_dict(self) -> dict[str, Any]:
        pct = self.est_saving_pct if math.isfinite(self.est_saving_pct) else None
        return {"rule": self.rule, "severity": self.severity, "message": self.message,
                "est_saving_us": float(self.est_saving_us), "est_saving_pct": pct,
                "evidence": dict(self.evidence)}


def severity_for(pct: float) -> str:
    """Severity from the saving as % of step time: >= 10 high, >= 3 medium, >= 0.5 low, else info."""
    if not math.isfinite(pct):
        return "info"
    return "high" if pct >= 10 else "medium" if pct >= 3 else "low" if pct >= 0.5 else "info"


class Results(Mapping):
    """{analysis name: result}, computed on first access through the analysis registry.

    `params` maps an analysis name to keyword arguments for it (e.g. {"diff": {"other": t2}}).
    """

    def __init__(self, trace: Any, params: Mapping[str, Mapping[str, Any]] | None = None,
                 precomputed: Mapping[str, Any] | None = None) -> None:
        self.trace = trace
        self._params = dict(params or {})
        self._cache: dict[str, Any] = dict(precomputed or {})
        self._memo: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            from profiler.analysis.registry import ANALYSES

            if name not in ANALYSES:
                raise KeyError(name)
            self._cache[name] = ANALYSES[name](self.trace, **self._params.get(name, {}))
        return self._cache[name]

    def memo(self, key: str, fn) -> Any:
        """A derived value shared by rules (e.g. the summed step time), computed once."""
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, name: object) -> bool:  # computed or computable
        from profiler.analysis.registry import ANALYSES

        return name in self._cache or name in ANALYSES
