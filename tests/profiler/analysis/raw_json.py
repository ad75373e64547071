"""Raw `ph: X` events of the committed traces, CPU ops included, read with plain `json`: the
independent truth the attribution, diff and report tests recompute their numbers from."""
from __future__ import annotations

import gzip
import json
from functools import lru_cache

from tests.profiler.analysis.synth import TRACES_DIR


@lru_cache(maxsize=2)
def raw_events(name: str) -> tuple[dict, ...]:
    """All raw `ph: X` events of a committed trace (cached per process, two at a time)."""
    with gzip.open(TRACES_DIR / name, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return tuple(e for e in events if isinstance(e, dict) and e.get("ph") == "X")
