"""Raw `ph: X` events of the committed traces, CPU ops included, read with plain `json`: the
independent truth the attribution, diff and report tests recompute their numbers from."""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from functools import lru_cache

from tests.profiler.analysis.synth import TRACES_DIR


@lru_cache(maxsize=2)
def raw_events(name: str, exact: bool = False) -> tuple[dict, ...]:
    """All raw `ph: X` events of a committed trace (cached per process, two at a time); `exact`
    parses fractional numbers as Decimal (epoch-µs timestamps keep their nanoseconds)."""
    with gzip.open(TRACES_DIR / name, "rt") as f:
        doc = json.load(f, parse_float=Decimal) if exact else json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return tuple(e for e in events if isinstance(e, dict) and e.get("ph") == "X")


def merged_spans(spans) -> list[tuple[float, float]]:
    """The union of (start, end) spans as sorted, disjoint spans, in plain Python (the analyses use
    profiler.analysis.intervals; the tests recompute with this)."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def overlap_us(a, b) -> float:
    """Total length where two unions of disjoint spans intersect (a quadratic loop: fine for
    a few thousand spans)."""
    return sum(max(0.0, min(ae, be) - max(as_, bs)) for as_, ae in a for bs, be in b)
