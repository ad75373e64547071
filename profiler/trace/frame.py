"""Build the Trace's typed tables from per-file columns: one column at a time, freeing as it goes.

Per file, dense columns are int64/float64 arrays with the `MISSING` sentinel, kind-specific columns
are sparse (row index, values), and text columns are int32 codes into a per-file vocabulary. Here
they become the dtypes of `schema.COLUMNS`: nullable integers (mask from the sentinel), Categoricals
(vocabularies merged across files), Arrow-backed strings. A column absent from every file costs a
lazily-zeroed data buffer plus a one-byte mask per row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from profiler.trace._columns import CODED_COLUMNS
from profiler.trace._structs import MISSING
from profiler.trace.model import empty_frame
from profiler.trace.schema import COLUMNS, COUNTER_COLUMNS, KINDS, MEMORY_COLUMNS

_NP_INT = {"Int64": np.int64, "Int32": np.int32, "Int16": np.int16, "int32": np.int32}


@dataclass
class FileFrame:
    """One file's columns (raw clock) with links resolved, before rank and t0 are known."""

    label: str
    cols: dict[str, np.ndarray]  # dense, one value per row
    sparse: dict[str, tuple[np.ndarray, Any]]  # column -> (row index, values)
    vocab: dict[str, list[str]]  # coded columns: code -> text
    memory: dict[str, np.ndarray]
    counters: list[tuple]
    meta: dict[str, Any]
    skipped: Any
    unbound_flows: int
    ts_base: int = 0  # µs: every ts here counts from it (nonzero for exact epoch timestamps)

    def rebase(self, base: int) -> None:
        """Count every ts from `base` instead (exact while the two bases are close)."""
        shift = float(self.ts_base - base)
        if shift:
            self.cols["ts"] = self.cols["ts"] + shift
            if "ts" in self.memory:
                self.memory["ts"] = self.memory["ts"] + shift
            self.counters = [(ts + shift, *rest) for ts, *rest in self.counters]
        self.ts_base = base

    @property
    def n(self) -> int:
        return len(self.cols["ts"])

    def min_ts(self) -> float:
        if self.n:  # the earliest kept event; memory samples only when there is no event
            return float(self.cols["ts"].min())
        mem = self.memory.get("ts", ())
        return float(mem.min()) if len(mem) else float("inf")


def masked(values: np.ndarray, dtype: str) -> Any:
    """Sentinel-coded int64 values -> a nullable integer array (out-of-range values become NA)."""
    np_dtype = _NP_INT[dtype]
    info = np.iinfo(np_dtype)
    mask = (values == MISSING) | (values < info.min) | (values > info.max)
    data = np.where(mask, 0, values).astype(np_dtype)
    return pd.arrays.IntegerArray(data, mask) if dtype[0] == "I" else data


def _int_column(col: str, dtype: str, frames: list[FileFrame], offsets: list[int], n: int) -> Any:
    if all(col in f.cols for f in frames):
        values = np.concatenate([f.cols.pop(col) for f in frames]) if len(frames) > 1 else frames[0].cols.pop(col)
        return masked(values, dtype)
    np_dtype = _NP_INT[dtype]
    info = np.iinfo(np_dtype)
    data, mask = np.zeros(n, np_dtype), np.ones(n, bool)  # zeros: untouched pages stay unallocated
    for f, off in zip(frames, offsets):
        idx, vals = f.cols.pop(col, None), None
        if idx is not None:  # dense in this file only
            idx, vals = np.arange(f.n), idx
        elif col in f.sparse:
            idx, vals = f.sparse.pop(col)
        if vals is None:
            continue
        ok = (vals != MISSING) & (vals >= info.min) & (vals <= info.max)
        data[idx[ok] + off] = vals[ok]
        mask[idx[ok] + off] = False
    return pd.arrays.IntegerArray(data, mask)


def _float_column(col: str, frames: list[FileFrame], offsets: list[int], n: int) -> np.ndarray:
    if all(col in f.cols for f in frames):
        return np.concatenate([f.cols.pop(col) for f in frames]) if len(frames) > 1 else frames[0].cols.pop(col)
    out = np.full(n, np.nan)
    for f, off in zip(frames, offsets):
        if col in f.cols:
            out[off:off + f.n] = f.cols.pop(col)
        elif col in f.sparse:
            idx, vals = f.sparse.pop(col)
            out[idx + off] = vals
    return out


def _coded_column(col: str, dtype: str, frames: list[FileFrame], offsets: list[int], n: int) -> Any:
    """Merge per-file dictionary codes into one Categorical (or Arrow-backed string) column."""
    texts: dict[str, int] = {}
    codes = np.full(n, -1, np.int32)
    for f, off in zip(frames, offsets):
        vocab = f.vocab.get(col, [])
        if col in f.cols:
            idx, vals = None, f.cols.pop(col)
        elif col in f.sparse:
            idx, vals = f.sparse.pop(col)
        else:
            continue
        lut = np.fromiter((texts.setdefault(t, len(texts)) for t in vocab), np.int32, len(vocab))
        lut = np.append(lut, np.int32(-1))  # code -1 (missing) stays -1
        if idx is None:
            codes[off:off + f.n] = lut[vals]
        else:
            codes[idx + off] = lut[vals]
    if dtype == "category":
        return pd.Categorical.from_codes(codes, categories=list(texts))
    dictionary = pa.array(list(texts), pa.string())
    arr = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), dictionary).dictionary_decode()
    return pd.arrays.ArrowStringArray(arr)


def events_frame(frames: list[FileFrame], ranks: list[int], t0: float) -> pd.DataFrame:
    """The events table with the columns and dtypes of schema.COLUMNS."""
    n = sum(f.n for f in frames)
    offsets = list(np.cumsum([0] + [f.n for f in frames[:-1]]))
    data: dict[str, Any] = {}
    for col, (dtype, _doc) in COLUMNS.items():
        if col == "rank":
            data[col] = np.concatenate([np.full(f.n, r, np.int32) for f, r in zip(frames, ranks)])
        elif col == "kind":
            codes = np.concatenate([f.cols.pop("kind") for f in frames]).astype(np.int8)
            data[col] = pd.Categorical.from_codes(codes, categories=list(KINDS))
        elif col == "ts_us":
            data[col] = np.concatenate([f.cols.pop("ts") for f in frames]) - t0
        elif col == "dur_us":
            data[col] = np.concatenate([f.cols.pop("dur") for f in frames])
        elif col in ("flops", "bytes_moved"):
            data[col] = np.full(n, np.nan)  # unknown for uploaded traces; capture fills them
        elif col == "module":  # likewise (capture's cost pass knows each op's module)
            data[col] = pd.Categorical.from_codes(np.full(n, -1, np.int8), categories=pd.Index([], dtype=object))
        elif col in CODED_COLUMNS:
            data[col] = _coded_column(col, dtype, frames, offsets, n)
        elif dtype in _NP_INT:
            data[col] = _int_column(col, dtype, frames, offsets, n)
        elif dtype == "float64":
            data[col] = _float_column(col, frames, offsets, n)
        else:
            raise TypeError(f"unhandled dtype {dtype} for column {col}")
    return pd.DataFrame(data, copy=False)


def memory_frame(frames: list[FileFrame], ranks: list[int], t0: float) -> pd.DataFrame:
    """`[memory]` instant events of every rank."""
    parts = []
    for f, r in zip(frames, ranks):
        if not len(f.memory.get("ts", ())):
            continue
        part = {"rank": np.full(len(f.memory["ts"]), r, np.int32), "ts_us": f.memory["ts"] - t0}
        for col, dtype in MEMORY_COLUMNS.items():
            if col not in part:
                part[col] = masked(f.memory[col], dtype)
        parts.append(pd.DataFrame(part))
    return pd.concat(parts, ignore_index=True) if parts else empty_frame(MEMORY_COLUMNS)


def counters_frame(frames: list[FileFrame], ranks: list[int], t0: float) -> pd.DataFrame:
    """Counter samples (`ph: C`) of every rank, one row per (sample, series)."""
    rows = [(r, ts - t0, dev, name, val) for f, r in zip(frames, ranks) for ts, dev, name, val in f.counters]
    if not rows:
        return empty_frame(COUNTER_COLUMNS)
    rank, ts, dev, name, val = (np.array(x) for x in zip(*rows))
    return pd.DataFrame({"rank": rank.astype(np.int32), "ts_us": ts.astype(np.float64),
                         "device": masked(dev.astype(np.int64), COUNTER_COLUMNS["device"]),
                         "name": pd.Categorical(name), "value": val.astype(np.float64)})
