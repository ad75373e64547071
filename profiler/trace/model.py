"""The Trace: one frozen object that every stage of FusionLens reads (see DESIGN.md, "The Trace").

`events` is a pandas DataFrame with the columns of `schema.COLUMNS`; `meta` carries device
properties, distributed info, sources and versions. Side tables hold `[memory]` instant events and
counter tracks. Producers build it once; nobody mutates it afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import pandas as pd

from profiler.errors import FusionLensError
from profiler.trace.schema import COLUMNS, COUNTER_COLUMNS, MEMORY_COLUMNS, SCHEMA_VERSION


class TraceError(FusionLensError):
    """Bad input: the message is one human line naming the source and what is wrong."""


class NotATraceError(TraceError):
    """Valid JSON that is not a trace (no traceEvents list): a file found in a directory or an
    archive beside the traces (a config.json, metrics) is passed over instead of failing the load."""


def empty_frame(columns: Mapping[str, Any]) -> pd.DataFrame:
    """An empty DataFrame with the given {name: dtype} (or {name: (dtype, doc)}) columns."""
    dtypes = {k: (v[0] if isinstance(v, tuple) else v) for k, v in columns.items()}
    return pd.DataFrame({k: pd.Series(dtype=d) for k, d in dtypes.items()})


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """_freeze undone (mappings to dicts, tuples to lists), so that freezing it again gives the same."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Trace:
    """Events of one or more ranks plus metadata.

    meta keys (always present): schema_version, sources (tuple of str), t0_us (float, raw clock
    origin), ranks (tuple of int), skipped_events (int), skipped_reasons (mapping reason->count),
    device_properties (tuple of mappings, from the first rank), per_rank (mapping rank ->
    {source, device_properties, distributed_info, versions}). Optional: distributed_info,
    versions (torch/cuda/rocm/cupti ...), capture (capture settings when made live),
    demangled_names ({demangled: mangled} for kernel names demangled at ingest or CUPTI capture),
    unread_events (mapping label -> count of events of kinds no column models, most first: '"xpu_runtime"',
    'ph "B" events', '(no category)'; also per rank).
    """

    events: pd.DataFrame
    meta: Mapping[str, Any]
    memory: pd.DataFrame = field(default_factory=lambda: empty_frame(MEMORY_COLUMNS))
    counters: pd.DataFrame = field(default_factory=lambda: empty_frame(COUNTER_COLUMNS))

    def __post_init__(self) -> None:
        missing = [c for c in COLUMNS if c not in self.events.columns]
        if missing:
            raise TraceError(f"Trace events lack columns: {', '.join(missing)}")
        meta = dict(self.meta)
        meta.setdefault("schema_version", SCHEMA_VERSION)
        object.__setattr__(self, "meta", _freeze(meta))

    def __reduce__(self) -> tuple:
        """Pickles (a capture run in a child process sends its Trace back) with meta as plain
        dicts: its read-only mapping views cannot be pickled; unpickling freezes them again."""
        return (type(self), (self.events, _thaw(self.meta), self.memory, self.counters))

    # Small conveniences used everywhere; analyses stay pure functions over `events`.
    def of_kind(self, *kinds: str) -> pd.DataFrame:
        """Rows whose kind is one of `kinds` (a view-free copy-on-write slice)."""
        return self.events[self.events["kind"].isin(kinds)]

    @property
    def kernels(self) -> pd.DataFrame:
        return self.of_kind("kernel")

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self.meta.get("ranks", ()))

    def __repr__(self) -> str:  # keep notebooks and logs readable
        return (f"Trace({len(self.events)} events, ranks={list(self.ranks)}, "
                f"sources={list(self.meta.get('sources', ()))})")
